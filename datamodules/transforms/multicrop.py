"""DINO multi-crop augmentation: 2 global + N local crops with the official colour/blur/solarize recipe.

Two implementations of the same recipe (facebookresearch/dino ``DataAugmentationDINO``):

* :class:`DinoPILMultiCrop` - the reference: PIL images through torchvision v1 transforms, as in the
  official code (python ``random`` / global torch RNG).
* :class:`MultiCropTransform` - the fast one: a uint8 CHW tensor in, crop first then resize (work is
  proportional to the output size), photometric ops on float tensors, every random choice drawn from a
  ``torch.Generator`` so a sample is reproducible from its seed.

Both read one :class:`MultiCropConfig`; presets: ``official`` (main_dino.py defaults), ``released_vits16``
(the released ViT-S/16 run) and ``demo`` (64 px demo data, see docs/demo-data.md).
"""
from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field, replace
from typing import Sequence

import torch
import torch.nn.functional as torch_F
import torchvision.transforms.v2.functional as F
from PIL import Image, ImageFilter, ImageOps
from torchvision import transforms as T
from torchvision.transforms import InterpolationMode

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DINO_JITTER = (0.4, 0.4, 0.2, 0.1)  # brightness, contrast, saturation, hue


@dataclass(frozen=True)
class MultiCropConfig:
    """Everything the recipe lets you change. Probabilities are per crop."""
    global_size: int = 224
    local_size: int = 96
    n_local: int = 8
    global_scale: tuple[float, float] = (0.4, 1.0)
    local_scale: tuple[float, float] = (0.05, 0.4)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_p: float = 0.5
    # True -> DINO strengths, False -> off, or (brightness, contrast, saturation, hue)
    color_jitter: bool | tuple[float, float, float, float] = True
    color_jitter_p: float = 0.8
    grayscale_p: float = 0.2
    blur_p: tuple[float, float, float] = (1.0, 0.1, 0.5)  # global 1, global 2, locals
    blur_radius: tuple[float, float] = (0.1, 2.0)  # PIL GaussianBlur radius (standard deviation, px)
    solarize_p: tuple[float, float, float] = (0.0, 0.2, 0.0)  # global 1, global 2, locals
    solarize_threshold: int = 128  # PIL ImageOps.solarize default: values >= 128 are inverted
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    def __post_init__(self):
        def bad(msg):
            raise ValueError(f"MultiCropConfig: {msg}")
        for name in ("global_scale", "local_scale", "ratio", "blur_p", "blur_radius", "solarize_p", "mean", "std"):
            try:  # lists from YAML / the CLI become tuples
                object.__setattr__(self, name, tuple(float(v) for v in getattr(self, name)))
            except (TypeError, ValueError):
                bad(f"{name} must be a sequence of numbers, got {getattr(self, name)!r}")
        if isinstance(self.color_jitter, list):
            object.__setattr__(self, "color_jitter", tuple(self.color_jitter))
        for name in ("global_size", "local_size"):
            if int(getattr(self, name)) <= 0:
                bad(f"{name} must be a positive int, got {getattr(self, name)!r}")
        if int(self.n_local) < 0:
            bad(f"n_local must be >= 0, got {self.n_local!r}")
        for name in ("global_scale", "local_scale", "ratio", "blur_radius"):
            lo, hi = getattr(self, name)
            if not 0 < lo <= hi:
                bad(f"{name} must be (low, high) with 0 < low <= high, got {getattr(self, name)!r}")
        for name in ("global_scale", "local_scale"):
            if getattr(self, name)[1] > 1:
                bad(f"{name} is a share of the image area, at most 1, got {getattr(self, name)!r}")
        for name in ("flip_p", "color_jitter_p", "grayscale_p"):
            if not 0 <= getattr(self, name) <= 1:
                bad(f"{name} must be a probability in [0, 1], got {getattr(self, name)!r}")
        for name in ("blur_p", "solarize_p"):
            ps = getattr(self, name)
            if len(ps) != 3 or not all(0 <= p <= 1 for p in ps):
                bad(f"{name} must be 3 probabilities (global 1, global 2, locals), got {ps!r}")
        if self.jitter_strengths[3] > 0.5 or min(self.jitter_strengths) < 0:
            bad(f"color_jitter strengths must be >= 0 and hue <= 0.5, got {self.color_jitter!r}")

    @property
    def jitter_strengths(self) -> tuple[float, float, float, float]:
        if self.color_jitter is True:
            return DINO_JITTER
        if self.color_jitter is False or self.color_jitter is None:
            return (0.0, 0.0, 0.0, 0.0)
        cj = tuple(float(v) for v in self.color_jitter)
        if len(cj) != 4:
            raise ValueError("MultiCropConfig: color_jitter must be True/False or "
                             f"(brightness, contrast, saturation, hue), got {self.color_jitter!r}")
        return cj  # type: ignore[return-value]

    @property
    def n_crops(self) -> int:
        return 2 + self.n_local

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}


PRESETS: dict[str, dict] = {
    # main_dino.py argument defaults
    "official": {},
    # the released ViT-S/16 run (README / args of dino_deitsmall16)
    "released_vits16": dict(n_local=10, global_scale=(0.25, 1.0), local_scale=(0.05, 0.25)),
    # 64 px demo scenes (ViT patch 8): classes differ by colour, so no hue jitter, no grayscale and no
    # solarize; larger crops so a local crop still shows an object part; blur scaled to the small images.
    "demo": dict(global_size=64, local_size=32, n_local=6, global_scale=(0.5, 1.0), local_scale=(0.2, 0.5),
                 color_jitter=(0.4, 0.4, 0.2, 0.0), grayscale_p=0.0, blur_radius=(0.1, 0.8),
                 solarize_p=(0.0, 0.0, 0.0)),
}


def make_config(preset: str = "official", **overrides) -> MultiCropConfig:
    if preset not in PRESETS:
        raise ValueError(f"unknown multi-crop preset {preset!r}; valid: {sorted(PRESETS)}")
    return MultiCropConfig(**{**PRESETS[preset], **overrides})


def sample_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """Per-sample generator: the crops of (seed, epoch, index) are the same whatever worker draws them."""
    g = torch.Generator()
    # large odd multipliers keep (epoch, index) pairs apart; fits in 63 bits for any realistic run
    g.manual_seed((int(seed) * 1_000_003 + int(epoch) * 2_654_435_761 + int(index) * 97) % (2**63 - 1))
    return g


# --------------------------------------------------------------------------------------------------
# Random choices (one record per crop, drawn in a fixed order so a generator fixes everything)
# --------------------------------------------------------------------------------------------------

@dataclass
class CropParams:
    kind: str  # "global1", "global2", "local"
    size: int
    box: tuple[int, int, int, int]  # top, left, height, width in the input image
    flip: bool = False
    jitter_order: list[int] = field(default_factory=list)  # applied op ids: 0 bright 1 contrast 2 sat 3 hue
    jitter_factors: tuple[float, float, float, float] = (1.0, 1.0, 1.0, 0.0)
    grayscale: bool = False
    blur_sigma: float | None = None
    solarize: bool = False


_TRIES = 10  # RandomResizedCrop attempts before the centre-crop fallback
_BOX_DRAWS = 2 * _TRIES + 2  # (area, log-ratio) per try, then the position
_CROP_DRAWS = _BOX_DRAWS + 14


def _crop_box(height: int, width: int, scale: Sequence[float], ratio: Sequence[float],
              u: Sequence[float]) -> tuple[int, int, int, int]:
    """torchvision ``RandomResizedCrop.get_params`` (10 tries, then a centre crop) from 22 uniforms in [0, 1)."""
    area = height * width
    lr0, lr1 = math.log(ratio[0]), math.log(ratio[1])
    for t in range(_TRIES):
        target_area = area * (scale[0] + (scale[1] - scale[0]) * u[2 * t])
        aspect = math.exp(lr0 + (lr1 - lr0) * u[2 * t + 1])
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            i = min(int(u[-2] * (height - h + 1)), height - h)
            j = min(int(u[-1] * (width - w + 1)), width - w)
            return i, j, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def sample_crop_box(height: int, width: int, scale: Sequence[float], ratio: Sequence[float],
                    g: torch.Generator | None = None) -> tuple[int, int, int, int]:
    """One RandomResizedCrop box (top, left, height, width), drawn from ``g``."""
    return _crop_box(height, width, scale, ratio, torch.rand(_BOX_DRAWS, generator=g, dtype=torch.float64).tolist())


def sample_params(cfg: MultiCropConfig, height: int, width: int,
                  g: torch.Generator | None = None) -> list[CropParams]:
    """All random choices for one image, globals first (global 1, global 2, then the locals).

    One ``torch.rand`` call per image (a fixed number of uniforms per crop, whatever the probabilities),
    then plain Python: drawing them one by one cost more than the crops of a small image.
    """
    b, c, s, h = cfg.jitter_strengths
    strengths = (b, c, s, h)
    kinds = ["global1", "global2"] + ["local"] * cfg.n_local
    draws = torch.rand(len(kinds), _CROP_DRAWS, generator=g, dtype=torch.float64).tolist()
    out = []
    for n, (kind, u) in enumerate(zip(kinds, draws)):
        is_global = kind != "local"
        box = _crop_box(height, width, cfg.global_scale if is_global else cfg.local_scale, cfg.ratio,
                        u[:_BOX_DRAWS])
        p = CropParams(kind, cfg.global_size if is_global else cfg.local_size, box)
        v = u[_BOX_DRAWS:]
        p.flip = v[0] < cfg.flip_p
        # ColorJitter: with probability p, the 4 ops in a random order, factors uniform in [1-s, 1+s]
        # (hue: [-h, h]) as torchvision draws them; an op of strength 0 is skipped
        if v[1] < cfg.color_jitter_p:
            order = sorted(range(4), key=lambda k: v[2 + k])  # a uniformly random permutation
            p.jitter_order = [o for o in order if strengths[o] > 0]
            p.jitter_factors = (max(0.0, 1 - b) + (1 + b - max(0.0, 1 - b)) * v[6],
                                max(0.0, 1 - c) + (1 + c - max(0.0, 1 - c)) * v[7],
                                max(0.0, 1 - s) + (1 + s - max(0.0, 1 - s)) * v[8],
                                -h + 2 * h * v[9])
        p.grayscale = v[10] < cfg.grayscale_p
        slot = min(n, 2)
        if v[11] < cfg.blur_p[slot]:
            p.blur_sigma = cfg.blur_radius[0] + (cfg.blur_radius[1] - cfg.blur_radius[0]) * v[12]
        p.solarize = v[13] < cfg.solarize_p[slot]
        out.append(p)
    return out


# --------------------------------------------------------------------------------------------------
# Fast tensor pipeline
# --------------------------------------------------------------------------------------------------

def pil_blur_kernel(radius: float, passes: int = 3) -> list[float]:
    """The 1-D kernel of PIL's ``GaussianBlur(radius)``: ``passes`` extended box blurs, total variance radius**2.

    Pillow (BoxBlur.c, after Gwosdek et al. 2011) splits the variance over the passes and uses a box of
    integer radius l plus fractional end weights a; same formula here, the passes composed into one kernel.
    A sampled Gaussian would not do: for radius < ~0.8 its variance is far below radius**2 (at 0.3 it
    barely blurs at all, PIL spreads ~10% of a pixel to each neighbour).
    """
    sigma2 = radius * radius / passes
    big_l = math.sqrt(12.0 * sigma2 + 1.0)
    l = math.floor((big_l - 1.0) / 2.0)
    a = (2 * l + 1) * (l * (l + 1) - 3 * sigma2) / (6 * (sigma2 - (l + 1) ** 2))
    box = [a] + [1.0] * (2 * l + 1) + [a]
    k = [1.0]
    for _ in range(passes):
        k = [sum(k[i - j] * box[j] for j in range(len(box)) if 0 <= i - j < len(k))
             for i in range(len(k) + len(box) - 1)]
    total = sum(k)
    return [v / total for v in k]


def gaussian_blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """PIL ``GaussianBlur(radius=sigma)`` on a float (..., H, W) tensor: separable, edge pixels repeated.

    Same kernel as PIL (:func:`pil_blur_kernel`); differences: no 8-bit rounding between the box passes and
    the edge is extended once rather than per pass (a grey level or so near borders, see the tests).
    Shifted weighted sums instead of conv2d: single-channel conv2d is several times slower on CPU.
    """
    k = pil_blur_kernel(sigma)
    r = len(k) // 2
    h, w = x.shape[-2], x.shape[-1]
    # replicate-pad by r (index clamping also works when r exceeds the image size)
    cols = torch.arange(-r, w + r).clamp_(0, w - 1)
    xp = x.index_select(-1, cols)
    y = xp[..., :, 0:w] * k[0]
    for d in range(1, 2 * r + 1):
        y.add_(xp[..., :, d:d + w], alpha=k[d])
    rows = torch.arange(-r, h + r).clamp_(0, h - 1)
    yp = y.index_select(-2, rows)
    z = yp[..., 0:h, :] * k[0]
    for d in range(1, 2 * r + 1):
        z.add_(yp[..., d:d + h, :], alpha=k[d])
    return z


_HUE_OFFSETS = torch.tensor([5.0, 3.0, 1.0]).view(3, 1, 1)


def adjust_hue(x: torch.Tensor, hue_factor: float) -> torch.Tensor:
    """HSV hue rotation of a float RGB (3, H, W) tensor in [0, 1] (same result as ``F.adjust_hue``).

    Rotating hue keeps V = max and chroma C = max - min, so RGB is rebuilt directly from (h, V, C) with
    in-place arithmetic (no where/remainder: ~10x slower than plain arithmetic on CPU): about 2x faster
    than the generic RGB -> HSV -> RGB round trip.
    """
    if hue_factor == 0.0:
        return x
    v, idx = x.max(-3, keepdim=True)  # idx: the max channel (ties give the same hue either way)
    c = v - x.amin(-3, keepdim=True)
    # hue in sextants: 2 * idx + (next channel - previous channel) / c, i.e. (g-b)/c, 2+(b-r)/c, 4+(r-g)/c
    d = x.roll(-1, -3).sub_(x.roll(1, -3))
    h = d.gather(-3, idx).div_(c + (c == 0).to(x.dtype))  # grey pixels (c = 0): any hue, C * ramp = 0
    h.add_(idx.to(x.dtype), alpha=2.0).add_(6.0 * hue_factor)
    h.sub_(torch.floor(h / 6.0).mul_(6.0))  # wrap to [0, 6)
    # channel = V - C * ramp((n + h) mod 6), n = 5, 3, 1 for r, g, b; ramp(k) = clamp(min(k, 4-k), 0, 1).
    # For k = n + h in [1, 11) that is clamp(2 - ||k - 5| - 3|, 0, 1): both periods at once, no mod.
    ramp = (h + _HUE_OFFSETS).sub_(5.0).abs_().sub_(3.0).abs_().neg_().add_(2.0).clamp_(0.0, 1.0)
    return v - c * ramp


def grayscale(x: torch.Tensor) -> torch.Tensor:
    """ITU-R 601-2 luma (PIL ``convert('L')``), repeated to 3 channels like ``RandomGrayscale``."""
    return F.rgb_to_grayscale(x, num_output_channels=3)


def solarize(x: torch.Tensor, threshold: int = 128) -> torch.Tensor:
    """PIL ``ImageOps.solarize`` on a [0, 1] float tensor: values >= threshold/255 become 1 - value."""
    return torch.where(x >= threshold / 255.0, 1.0 - x, x)


def _to_uint8_chw(img) -> torch.Tensor:
    if isinstance(img, Image.Image):
        return F.pil_to_tensor(img.convert("RGB"))
    if not isinstance(img, torch.Tensor):
        raise TypeError(f"MultiCropTransform expects a uint8 CHW tensor or a PIL image, got {type(img).__name__}")
    if img.dtype != torch.uint8 or img.ndim != 3 or img.shape[0] not in (1, 3, 4):
        raise ValueError("MultiCropTransform expects a uint8 tensor of shape (C, H, W) with C in {1, 3, 4} "
                         f"(e.g. torchvision.io.decode_image(..., mode=RGB)), got dtype={img.dtype} "
                         f"shape={tuple(img.shape)}")
    if img.shape[0] == 1:
        return img.expand(3, -1, -1)
    return img[:3]


def _channels_last(img: torch.Tensor) -> torch.Tensor:
    return img.unsqueeze(0).contiguous(memory_format=torch.channels_last)


class MultiCropTransform:
    """Fast DINO multi-crop on uint8 tensors: ``t(img_uint8_chw, generator=None) -> [global1, global2, *locals]``.

    Each output is a normalised float32 (3, size, size) tensor. Crop boxes, flips, jitter factors and order,
    grayscale, blur sigma and solarize are drawn from ``generator`` (default: torch's global RNG) in a fixed
    order, so the same generator state gives the same crops.
    Deviations from the PIL reference: photometric ops run on float32 after the (uint8, bicubic, antialiased)
    resize, so there is no 8-bit rounding between ops; blur uses PIL's kernel (see :func:`gaussian_blur`).
    """

    def __init__(self, config: MultiCropConfig | None = None, **kwargs):
        if config is not None and kwargs:
            config = replace(config, **kwargs)
        self.cfg = config if config is not None else MultiCropConfig(**kwargs)
        self._mean = torch.tensor(self.cfg.mean).view(3, 1, 1)
        self._std = torch.tensor(self.cfg.std).view(3, 1, 1)

    @classmethod
    def from_preset(cls, preset: str = "official", **overrides) -> "MultiCropTransform":
        return cls(make_config(preset, **overrides))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.cfg})"

    def __call__(self, img, generator: torch.Generator | None = None) -> list[torch.Tensor]:
        img = _to_uint8_chw(img)
        params = sample_params(self.cfg, img.shape[-2], img.shape[-1], generator)
        img = _channels_last(img)  # once per image, for the fast uint8 resize of every crop
        return [self.apply(img, p) for p in params]

    @staticmethod
    def crop_resize(img: torch.Tensor, p: CropParams) -> torch.Tensor:
        """Crop ``p.box`` then resize to ``p.size`` (bicubic, antialiased like PIL): uint8 (3, size, size).

        ``img``: uint8 (3, H, W), or (1, 3, H, W) channels-last as :func:`_channels_last` gives; torch's uint8
        antialiased resize is ~3x faster on channels-last input. Only the crop is read, so the cost follows
        the crop, not the image.
        """
        x = img if img.ndim == 4 else _channels_last(img)
        top, left, h, w = p.box
        out = torch_F.interpolate(x[:, :, top:top + h, left:left + w], size=(p.size, p.size), mode="bicubic",
                                  antialias=True, align_corners=False)
        return out[0].contiguous()

    def apply(self, img: torch.Tensor, p: CropParams, normalize: bool = True) -> torch.Tensor:
        """One crop. Crops are processed one by one: a batch of crops falls out of the CPU cache and was
        measured slower than this loop, despite fewer op calls."""
        x = self.crop_resize(img, p)
        if p.flip:
            x = x.flip(-1)
        x = x.float().div_(255.0)
        for op in p.jitter_order:
            f = p.jitter_factors[op]
            if op == 0:
                x = F.adjust_brightness(x, f)
            elif op == 1:
                x = F.adjust_contrast(x, f)
            elif op == 2:
                x = F.adjust_saturation(x, f)
            else:
                x = adjust_hue(x, f)
        if p.grayscale:
            x = grayscale(x)
        if p.blur_sigma is not None:
            x = gaussian_blur(x, p.blur_sigma)
        if p.solarize:
            x = solarize(x, self.cfg.solarize_threshold)
        if normalize:
            x = (x - self._mean) / self._std
        return x


# --------------------------------------------------------------------------------------------------
# PIL reference (official recipe, official randomness)
# --------------------------------------------------------------------------------------------------

class PILGaussianBlur:
    """dino utils.GaussianBlur: with probability p, PIL GaussianBlur with radius ~ U(radius_min, radius_max)."""

    def __init__(self, p: float, radius_min: float = 0.1, radius_max: float = 2.0):
        self.p, self.radius_min, self.radius_max = p, radius_min, radius_max

    def __call__(self, img: Image.Image) -> Image.Image:
        if random.random() <= self.p:  # '<=' as in the official code
            return img.filter(ImageFilter.GaussianBlur(radius=random.uniform(self.radius_min, self.radius_max)))
        return img


class PILSolarization:
    """dino utils.Solarization: with probability p, ``ImageOps.solarize`` (threshold 128)."""

    def __init__(self, p: float, threshold: int = 128):
        self.p, self.threshold = p, threshold

    def __call__(self, img: Image.Image) -> Image.Image:
        if random.random() < self.p:
            return ImageOps.solarize(img, self.threshold)
        return img


class DinoPILMultiCrop:
    """Reference ``DataAugmentationDINO`` on PIL images (torchvision v1 transforms), read from a config."""

    def __init__(self, config: MultiCropConfig | None = None, **kwargs):
        if config is not None and kwargs:
            config = replace(config, **kwargs)
        cfg = self.cfg = config if config is not None else MultiCropConfig(**kwargs)
        b, c, s, h = cfg.jitter_strengths
        flip_and_color_jitter = T.Compose([
            T.RandomHorizontalFlip(p=cfg.flip_p),
            T.RandomApply([T.ColorJitter(brightness=b, contrast=c, saturation=s, hue=h)], p=cfg.color_jitter_p),
            T.RandomGrayscale(p=cfg.grayscale_p),
        ])
        normalize = T.Compose([T.ToTensor(), T.Normalize(cfg.mean, cfg.std)])

        def branch(size, scale, slot):
            steps = [T.RandomResizedCrop(size, scale=scale, ratio=cfg.ratio, interpolation=InterpolationMode.BICUBIC),
                     flip_and_color_jitter, PILGaussianBlur(cfg.blur_p[slot], *cfg.blur_radius)]
            if cfg.solarize_p[slot] > 0:
                steps.append(PILSolarization(cfg.solarize_p[slot], cfg.solarize_threshold))
            return T.Compose(steps + [normalize])

        self.global_transfo1 = branch(cfg.global_size, cfg.global_scale, 0)
        self.global_transfo2 = branch(cfg.global_size, cfg.global_scale, 1)
        self.local_transfo = branch(cfg.local_size, cfg.local_scale, 2)

    @classmethod
    def from_preset(cls, preset: str = "official", **overrides) -> "DinoPILMultiCrop":
        return cls(make_config(preset, **overrides))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.cfg})"

    def __call__(self, image: Image.Image) -> list[torch.Tensor]:
        if not isinstance(image, Image.Image):
            raise TypeError(f"DinoPILMultiCrop expects a PIL image, got {type(image).__name__}")
        image = image.convert("RGB")
        crops = [self.global_transfo1(image), self.global_transfo2(image)]
        crops += [self.local_transfo(image) for _ in range(self.cfg.n_local)]
        return crops
