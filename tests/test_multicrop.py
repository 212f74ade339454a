"""Multi-crop augmentation: the fast tensor pipeline against PIL / torchvision references."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as TF1
from PIL import Image, ImageFilter, ImageOps
from torchvision.transforms import Compose, InterpolationMode, RandomApply, RandomResizedCrop

from bench import pil_multicrop
from bench.pil_multicrop import DinoPILMultiCrop
from datamodules.transforms import multicrop as mc
from datamodules.transforms.batched import BatchedMultiCrop, collate_decoded, pack_params, unpack_params
from datamodules.transforms.multicrop import (CropParams, MultiCropConfig, MultiCropTransform, make_config,
                                              sample_crop_box, sample_params)

SMALL = dict(global_size=32, local_size=16, n_local=3)


def scene(h=72, w=96, seed=0) -> np.ndarray:
    """A test photo: smooth colour gradients, hard-edged shapes and some noise (uint8 HWC)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    img = np.stack([0.2 + 0.6 * xx, 0.3 + 0.5 * yy, 0.5 + 0.3 * np.sin(6 * xx + 3 * yy)], -1)
    img[(yy - 0.3) ** 2 + (xx - 0.4) ** 2 < 0.03] = (0.9, 0.1, 0.2)
    img[(np.abs(yy - 0.5) < 0.1) & (np.abs(xx - 0.7) < 0.15)] = (0.1, 0.2, 0.9)
    img += rng.normal(0, 0.03, img.shape)
    return (np.clip(img, 0, 1) * 255 + 0.5).astype(np.uint8)


def as_tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a).permute(2, 0, 1).contiguous()


def to_levels(x: torch.Tensor) -> np.ndarray:
    """[0, 1] float CHW -> float HWC in grey levels 0..255."""
    return (x.clamp(0, 1) * 255).permute(1, 2, 0).numpy()


def test_shapes_dtypes_and_order():
    t = MultiCropTransform(**SMALL)
    out = t(as_tensor(scene()), generator=torch.Generator().manual_seed(0))
    assert len(out) == 5
    assert [tuple(o.shape) for o in out] == [(3, 32, 32)] * 2 + [(3, 16, 16)] * 3  # globals first
    assert all(o.dtype == torch.float32 for o in out)
    # normalised with ImageNet statistics: a [0, 1] image maps into [-mean/std, (1-mean)/std]
    lo = -torch.tensor(mc.IMAGENET_MEAN) / torch.tensor(mc.IMAGENET_STD)
    hi = (1 - torch.tensor(mc.IMAGENET_MEAN)) / torch.tensor(mc.IMAGENET_STD)
    for o in out:
        assert (o >= lo.view(3, 1, 1) - 1e-4).all() and (o <= hi.view(3, 1, 1) + 1e-4).all()


def test_inputs_pil_grey_rgba_and_errors():
    t = MultiCropTransform(**SMALL)
    a = scene()
    g = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    from_tensor = t(as_tensor(a), generator=g())
    from_pil = t(Image.fromarray(a), generator=g())
    assert all(torch.equal(x, y) for x, y in zip(from_tensor, from_pil))
    rgba = torch.cat([as_tensor(a), torch.full((1, 72, 96), 255, dtype=torch.uint8)])
    assert all(torch.equal(x, y) for x, y in zip(from_tensor, t(rgba, generator=g())))
    grey = t(as_tensor(a)[:1], generator=g())
    assert grey[0].shape == (3, 32, 32)
    with pytest.raises(ValueError, match="uint8 tensor of shape"):
        t(as_tensor(a).float())
    with pytest.raises(TypeError, match="PIL image"):
        t(a)


def test_deterministic_given_generator():
    t = MultiCropTransform.from_preset("official", **SMALL)
    img = as_tensor(scene())
    a = t(img, generator=torch.Generator().manual_seed(123))
    b = t(img, generator=torch.Generator().manual_seed(123))
    c = t(img, generator=torch.Generator().manual_seed(124))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))
    # __call__ = sample_params then apply per crop, from the same stream
    ps = sample_params(t.cfg, 72, 96, torch.Generator().manual_seed(123))
    assert all(torch.equal(x, t.apply(img, p)) for x, p in zip(a, ps))
    # the per-sample generator helper: same (seed, epoch, index) -> same crops, any other -> different
    s1 = t(img, generator=mc.sample_generator(0, 2, 17))
    s2 = t(img, generator=mc.sample_generator(0, 2, 17))
    s3 = t(img, generator=mc.sample_generator(0, 3, 17))
    assert all(torch.equal(x, y) for x, y in zip(s1, s2))
    assert not torch.equal(s1[0], s3[0])


def test_crop_box_scale_and_ratio_ranges():
    g = torch.Generator().manual_seed(0)
    h, w = 200, 300
    areas, ratios = [], []
    for _ in range(2000):
        i, j, ch, cw = sample_crop_box(h, w, (0.05, 0.4), (3 / 4, 4 / 3), g)
        assert 0 <= i and i + ch <= h and 0 <= j and j + cw <= w
        areas.append(ch * cw / (h * w))
        ratios.append(cw / ch)
    areas, ratios = np.array(areas), np.array(ratios)
    # rounding of w and h to pixels moves the share by at most ~1 pixel row/column
    assert areas.min() >= 0.05 - 0.01 and areas.max() <= 0.4 + 0.01
    assert ratios.min() >= 0.75 - 0.03 and ratios.max() <= 4 / 3 + 0.03
    # area share ~ U(0.05, 0.4): mean 0.225, sd 0.101; 2000 draws -> standard error 0.0023
    assert abs(areas.mean() - 0.225) < 0.01
    # log-ratio ~ U(log 3/4, log 4/3): mean 0
    assert abs(np.log(ratios).mean()) < 0.02


def test_crop_box_fallback_matches_torchvision():
    # a 10x200 strip: no crop of >= 90% area fits the ratio range -> torchvision's centre-crop fallback
    box = sample_crop_box(10, 200, (0.9, 1.0), (3 / 4, 4 / 3), torch.Generator().manual_seed(0))
    ref = RandomResizedCrop.get_params(Image.new("RGB", (200, 10)), [0.9, 1.0], [3 / 4, 4 / 3])
    assert box == tuple(ref) == (0, 93, 10, 13)


PATHS = ("cpu", "gpu")  # data.augment_on: crops made in the worker / in batch after the transfer (batched.py)


def drawn_params(path: str, t: MultiCropTransform, h: int, w: int, g: torch.Generator) -> list[CropParams]:
    """A sample's crops as each path's worker hands them on: cpu = ``plan`` (what ``__call__`` applies), gpu =
    the packed rows of ``DecodedMultiCropDataset`` read back the way ``BatchedMultiCrop`` reads them."""
    _, ps = t.plan(torch.zeros(3, h, w, dtype=torch.uint8), g)
    return unpack_params(pack_params(ps), t.cfg) if path == "gpu" else ps


@pytest.mark.parametrize("path", PATHS)
def test_random_choice_statistics_official(path, one_thread):
    cfg = make_config("official", n_local=4)
    t = MultiCropTransform(cfg)
    g = torch.Generator().manual_seed(0)
    n = 1500
    stats = {k: np.zeros((n, 3)) for k in ("blur", "solarize", "flip", "gray", "jitter")}
    sigmas, factors = [], []
    for s in range(n):
        ps = drawn_params(path, t, 64, 64, g)
        assert [p.kind for p in ps] == ["global1", "global2"] + ["local"] * 4
        assert [p.size for p in ps] == [224, 224] + [96] * 4
        for p in ps:
            slot = {"global1": 0, "global2": 1, "local": 2}[p.kind]
            stats["blur"][s, slot] += p.blur_sigma is not None
            stats["solarize"][s, slot] += p.solarize
            stats["flip"][s, slot] += p.flip
            stats["gray"][s, slot] += p.grayscale
            stats["jitter"][s, slot] += bool(p.jitter_order)
            if p.blur_sigma is not None:
                sigmas.append(p.blur_sigma)
            if p.jitter_order:
                assert sorted(p.jitter_order) == [0, 1, 2, 3]
                factors.append(p.jitter_factors)
    counts = np.array([n, n, 4 * n])

    def rate(k):
        return stats[k].sum(0) / counts

    def close(got, want):
        sd = np.sqrt(np.array(want) * (1 - np.array(want)) / counts)
        assert np.all(np.abs(got - np.array(want)) <= 4 * sd + 1e-12), (got, want)

    close(rate("blur"), [1.0, 0.1, 0.5])  # blur always on global 1
    close(rate("solarize"), [0.0, 0.2, 0.0])  # solarize only on global 2
    close(rate("flip"), [0.5, 0.5, 0.5])
    close(rate("gray"), [0.2, 0.2, 0.2])
    close(rate("jitter"), [0.8, 0.8, 0.8])
    sigmas, factors = np.array(sigmas), np.array(factors)
    assert sigmas.min() >= 0.1 and sigmas.max() <= 2.0 and abs(sigmas.mean() - 1.05) < 0.03
    lo, hi = factors.min(0), factors.max(0)
    assert np.all(lo >= [0.6, 0.6, 0.8, -0.1]) and np.all(hi <= [1.4, 1.4, 1.2, 0.1])
    assert np.all(hi - lo > [0.75, 0.75, 0.35, 0.18])  # the whole range is used


@pytest.fixture
def one_thread():
    """One torch thread: small ops on a busy 2-core machine run ~10x slower with two spinning threads."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


GREY_CFG = dict(global_size=24, local_size=12, n_local=4)
GREY_N = 150  # images: 900 crops, standard error 0.013 around the official 0.2


def grey_rate(crops, cfg) -> float:
    """Share of the (normalised) crops whose three channels are equal."""
    mean, std = torch.tensor(cfg.mean).view(3, 1, 1), torch.tensor(cfg.std).view(3, 1, 1)
    levels = [c * std + mean for c in crops]
    return float(np.mean([float((x[0] - x[1]).abs().max() + (x[1] - x[2]).abs().max()) < 1e-4 for x in levels]))


@pytest.fixture(scope="module")
def pil_grey_rate():  # PIL is single-threaded
    cfg = make_config("official", **GREY_CFG)
    pil, img = DinoPILMultiCrop(cfg), Image.fromarray(scene(48, 64, seed=8))
    torch.manual_seed(0)
    return grey_rate([c for _ in range(GREY_N) for c in pil(img)], cfg)


@pytest.mark.parametrize("path", PATHS)
def test_applied_grayscale_rate_matches_the_pil_recipe(path, pil_grey_rate, one_thread):
    """Read off the output crops (grey = equal channels): the path's rate and the PIL reference's are both the
    official 0.2."""
    cfg = make_config("official", **GREY_CFG)
    t, img = MultiCropTransform(cfg), as_tensor(scene(48, 64, seed=8))
    gens = [torch.Generator().manual_seed(i) for i in range(GREY_N)]
    if path == "cpu":
        crops = [c for g in gens for c in t(img, generator=g)]
    else:
        samples = [(im, pack_params(ps), 0) for im, ps in (t.plan(img, g) for g in gens)]
        out = BatchedMultiCrop(cfg)(collate_decoded(samples))
        crops = [c for k in range(cfg.n_crops) for c in out[k]]
    sd = math.sqrt(0.2 * 0.8 / (GREY_N * cfg.n_crops))
    got = grey_rate(crops, cfg)
    assert abs(got - 0.2) <= 4 * sd and abs(pil_grey_rate - 0.2) <= 4 * sd, (got, pil_grey_rate)


def test_demo_preset_keeps_colour_cues():
    cfg = make_config("demo")
    assert cfg.jitter_strengths[3] == 0 and cfg.grayscale_p == 0 and cfg.solarize_p == (0, 0, 0)
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        for p in sample_params(cfg, 64, 64, g):
            assert 3 not in p.jitter_order and not p.grayscale and not p.solarize
            share = p.box[2] * p.box[3] / 64 ** 2
            lo, hi = cfg.global_scale if p.kind != "local" else cfg.local_scale
            assert lo - 0.05 <= share <= hi + 0.05


def test_config_validation_messages():
    with pytest.raises(ValueError, match="global_scale"):
        MultiCropConfig(global_scale=(0.5, 0.2))
    with pytest.raises(ValueError, match="at most 1"):
        MultiCropConfig(local_scale=(0.1, 1.5))
    with pytest.raises(ValueError, match="blur_p"):
        MultiCropConfig(blur_p=(1.0, 0.1))
    with pytest.raises(ValueError, match="grayscale_p"):
        MultiCropConfig(grayscale_p=1.2)
    with pytest.raises(ValueError, match="sequence of numbers"):
        MultiCropConfig(global_scale=0.5)
    assert MultiCropConfig(global_scale=[0.3, 1]).global_scale == (0.3, 1.0)  # YAML lists
    with pytest.raises(ValueError, match="valid: "):
        make_config("imagenet")
    assert MultiCropConfig(color_jitter=False).jitter_strengths == (0, 0, 0, 0)


# --- single ops against PIL -------------------------------------------------------------------

def test_flip_matches_pil():
    a = scene()
    ref = np.array(Image.fromarray(a).transpose(Image.FLIP_LEFT_RIGHT))
    assert np.array_equal(as_tensor(a).flip(-1).permute(1, 2, 0).numpy(), ref)


def test_solarize_matches_pil_exactly():
    a = np.arange(256, dtype=np.uint8).repeat(3).reshape(16, 16, 3)
    ref = np.array(ImageOps.solarize(Image.fromarray(a), 128))
    got = mc.solarize(as_tensor(a).float() / 255, 128)
    assert np.array_equal(np.rint(to_levels(got)).astype(np.uint8), ref)


def test_grayscale_formula_matches_pil():
    a = scene(seed=1)
    ref = np.array(Image.fromarray(a).convert("L")).astype(float)
    got = to_levels(mc.grayscale(as_tensor(a).float() / 255))
    assert np.allclose(got[..., 0], got[..., 1]) and np.allclose(got[..., 0], got[..., 2])
    assert np.abs(got[..., 0] - ref).max() <= 1.0  # PIL rounds 299/587/114 integer weights


def test_crop_resize_geometry_matches_pil():
    a = scene(120, 160, seed=2)
    t = MultiCropTransform()
    for (top, left, h, w), size in [((10, 20, 70, 90), 48), ((0, 0, 120, 160), 32), ((30, 50, 20, 25), 40)]:
        got = t.crop_resize(as_tensor(a), CropParams("local", size, (top, left, h, w)))
        ref = np.array(Image.fromarray(a).crop((left, top, left + w, top + h)).resize((size, size), Image.BICUBIC))
        diff = np.abs(got.permute(1, 2, 0).numpy().astype(float) - ref)
        assert diff.mean() < 1.0 and diff.max() <= 8, (size, diff.mean(), diff.max())


@pytest.mark.parametrize("sigma", [0.1, 0.3, 1.0, 2.0])
def test_blur_matches_pil_radius(sigma):
    # PIL's kernel: 3 extended box blurs whose variance adds up to radius**2 exactly
    k = np.array(mc.pil_blur_kernel(sigma))
    t = np.arange(len(k)) - len(k) // 2
    assert abs(k.sum() - 1) < 1e-12 and abs((k * t * t).sum() - sigma ** 2) < 1e-9
    # impulse response = PIL's (which rounds each pass to 8 bits)
    imp = np.zeros((9, 31, 3), np.uint8)
    imp[4, 15] = 255
    ref = np.array(Image.fromarray(imp).filter(ImageFilter.GaussianBlur(radius=sigma))).astype(float)
    got = to_levels(mc.gaussian_blur(as_tensor(imp).float() / 255, sigma))
    assert np.abs(got - ref).max() <= 1.5
    # a test photo
    a = scene(64, 64, seed=3)
    ref = np.array(Image.fromarray(a).filter(ImageFilter.GaussianBlur(radius=sigma))).astype(float)
    got = to_levels(mc.gaussian_blur(as_tensor(a).float() / 255, sigma))
    diff = np.abs(got - ref)
    assert diff.mean() < 1.0 and diff.max() < 6, (diff.mean(), diff.max())
    if sigma >= 1:  # and it is really blurred: far from the input
        assert np.abs(got - a).mean() > 3 * diff.mean()


def test_hue_matches_torchvision_and_pil():
    a = scene(seed=4)
    x = as_tensor(a).float() / 255
    for f in (-0.1, -0.03, 0.05, 0.1):
        got = mc.adjust_hue(x, f)
        assert torch.allclose(got, TF1.adjust_hue(x, f), atol=1e-5)
        ref = np.array(TF1.adjust_hue(Image.fromarray(a), f)).astype(float)  # PIL: 8-bit HSV
        assert np.abs(to_levels(got) - ref).mean() < 2.0


def _pil_apply(img: Image.Image, p: CropParams, cfg: MultiCropConfig) -> np.ndarray:
    """The same crop parameters applied the way the PIL reference does it (independent code path)."""
    top, left, h, w = p.box
    img = TF1.resized_crop(img, top, left, h, w, [p.size, p.size], interpolation=InterpolationMode.BICUBIC)
    if p.flip:
        img = TF1.hflip(img)
    fns = [TF1.adjust_brightness, TF1.adjust_contrast, TF1.adjust_saturation, TF1.adjust_hue]
    for op in p.jitter_order:
        img = fns[op](img, p.jitter_factors[op])
    if p.grayscale:
        img = TF1.to_grayscale(img, num_output_channels=3)
    if p.blur_sigma is not None:
        img = img.filter(ImageFilter.GaussianBlur(radius=p.blur_sigma))
    if p.solarize:
        img = ImageOps.solarize(img, cfg.solarize_threshold)
    return np.array(img).astype(float)


def test_full_pipeline_matches_pil_path_given_the_same_choices():
    cfg = make_config("official", global_size=48, local_size=24, n_local=4, solarize_p=(0.3, 0.5, 0.3))
    t = MultiCropTransform(cfg)
    a = scene(90, 120, seed=5)
    img_t, img_p = as_tensor(a), Image.fromarray(a)
    g = torch.Generator().manual_seed(7)
    diffs = []
    for _ in range(6):
        for p in sample_params(cfg, 90, 120, g):
            got = to_levels(t.apply(img_t, p, normalize=False))
            ref = _pil_apply(img_p, p, cfg)
            diffs.append(np.abs(got - ref).mean())
            # solarize is a threshold, so a 1-level rounding difference can flip a pixel: compare means
            assert diffs[-1] < 6.0, (p, diffs[-1])
    assert np.mean(diffs) < 2.5
    # normalisation: (x - mean) / std
    p = sample_params(cfg, 90, 120, torch.Generator().manual_seed(1))[0]
    x = t.apply(img_t, p, normalize=False)
    y = t.apply(img_t, p)
    mean, std = torch.tensor(cfg.mean).view(3, 1, 1), torch.tensor(cfg.std).view(3, 1, 1)
    assert torch.allclose(y, (x - mean) / std, atol=1e-6)


def test_blur_always_on_first_global_crop():
    # jitter/grayscale/flip off so only the blur changes the first crop
    t = MultiCropTransform(global_size=48, local_size=24, n_local=1, color_jitter=False, grayscale_p=0.0,
                           flip_p=0.0)
    img = as_tensor(scene(64, 64, seed=6))
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        ps = sample_params(t.cfg, 64, 64, g)
        p1 = ps[0]
        assert p1.blur_sigma is not None
        sharp = CropParams(**{**p1.__dict__, "blur_sigma": None})
        blurred, plain = t.apply(img, p1, False), t.apply(img, sharp, False)
        lap = lambda x: (x[:, 1:-1, 1:-1] * 4 - x[:, 2:, 1:-1] - x[:, :-2, 1:-1]  # noqa: E731
                         - x[:, 1:-1, 2:] - x[:, 1:-1, :-2]).abs().mean()
        assert lap(blurred) < lap(plain)


def test_pil_reference_follows_official_structure():
    ref = DinoPILMultiCrop.from_preset("official")

    def steps(compose):  # flatten nested Compose
        out = []
        for s in compose.transforms:
            out += steps(s) if isinstance(s, Compose) else [s]
        return out

    g1, g2, loc = steps(ref.global_transfo1), steps(ref.global_transfo2), steps(ref.local_transfo)
    blur = lambda st: [s.p for s in st if isinstance(s, pil_multicrop.PILGaussianBlur)]  # noqa: E731
    sol = lambda st: [s.p for s in st if isinstance(s, pil_multicrop.PILSolarization)]  # noqa: E731
    assert (blur(g1), blur(g2), blur(loc)) == ([1.0], [0.1], [0.5])
    assert (sol(g1), sol(g2), sol(loc)) == ([], [0.2], [])
    rrc = [s for s in g1 if isinstance(s, RandomResizedCrop)][0]
    assert rrc.size == (224, 224) and rrc.scale == (0.4, 1.0) and rrc.interpolation == InterpolationMode.BICUBIC
    jit = [s for s in g1 if isinstance(s, RandomApply)][0]
    cj = jit.transforms[0]
    assert jit.p == 0.8 and cj.brightness == (0.6, 1.4) and cj.saturation == (0.8, 1.2) and cj.hue == (-0.1, 0.1)
    # it runs and gives the same shapes as the fast pipeline
    small = DinoPILMultiCrop(**SMALL)
    out = small(Image.fromarray(scene()))
    assert [tuple(o.shape) for o in out] == [(3, 32, 32)] * 2 + [(3, 16, 16)] * 3
    assert not math.isnan(float(torch.stack([o.mean() for o in out]).sum()))
