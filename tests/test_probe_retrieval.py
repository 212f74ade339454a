"""Dense retrieval (Hummingbird) probe: hand-worked labelling, memory sampling and matching; the probe end to end on
the VOC fixture (every memory size, LAYER=all); 2 processes equal to 1. The side-by-side run against the reference
code (open-hummingbird-eval) is in docs/probes/headfree.md: CI cannot fetch it."""
from __future__ import annotations

import itertools
import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch

from helpers import procs
from probes.headfree import retrieval as hb
from probes.headfree.matching import confusion, hungarian, majority, matched_miou
from probes.run import main

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(120)
TINY = ["--arch", "vit_test_patch8", "--ckpt", "random", "--batch-size", "2"]


def test_retrieve_hand_worked():
    # memory: e0 (class 0), e1 (class 1), (0.6, 0.8) (class 1); query (2, 0): cosines 1, 0, 0.6
    mem = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    lab = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    out = hb.retrieve(torch.tensor([[2.0, 0.0]]), mem, lab, k=2, temperature=0.2)
    w0 = 1 / (1 + math.exp(-(1.0 - 0.6) / 0.2))  # softmax over (1 / 0.2, 0.6 / 0.2): neighbours 0 and 2
    assert out[0].tolist() == pytest.approx([w0, 1 - w0], abs=1e-6)
    # soft labels are averaged as distributions: a half-half neighbour with k = 1 passes through unchanged
    half = hb.retrieve(torch.tensor([[0.0, 1.0]]), mem, torch.tensor([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]]), k=1)
    assert half[0].tolist() == pytest.approx([0.5, 0.5])


def test_nearest_in_chunks_equals_one_matmul(monkeypatch):
    g = torch.Generator().manual_seed(0)
    mem = torch.nn.functional.normalize(torch.randn(50, 8, generator=g), dim=1)
    q = torch.randn(6, 8, generator=g)
    ref_s, ref_i = (torch.nn.functional.normalize(q, dim=1) @ mem.T).topk(5, dim=1)
    monkeypatch.setattr(hb, "_chunk_rows", lambda n: 7)  # 8 memory chunks, the last one short
    s, i = hb.nearest(q, mem, 5)
    assert torch.equal(i, ref_i) and torch.allclose(s, ref_s)
    assert hb.nearest(q, mem[:3], 5)[1].shape == (6, 3)  # k capped at the memory size


def test_patch_labels_and_sampling_hand_worked():
    # 4x4 mask, 2x2 patches: TL all class 1; TR class 2 + ignore (-> class 0, as the reference); BL class 1 + 0;
    # BR class 0
    m = torch.tensor([[[1, 1, 2, 255], [1, 1, 2, 2], [1, 0, 0, 0], [1, 0, 0, 0]]])
    lab = hb.patch_labels(m, 2, 3)
    assert lab[0].tolist() == [[0, 1, 0], [0.25, 0, 0.75], [0.5, 0.5, 0], [1, 0, 0]]
    # patches containing each class: 0 -> 3, 1 -> 2, 2 -> 1; a patch scores the sum over its classes
    scores = torch.tensor([2.0, 3 + 1, 3 + 2, 3])
    g = torch.Generator().manual_seed(5)
    noise = torch.rand(4, generator=torch.Generator().manual_seed(5))
    got = hb.sample_patches(lab[0], 3, g)
    assert got.tolist() == (scores * noise).argsort()[:3].tolist()
    assert hb.per_image(100, 4, 2, 64) == 12 and hb.per_image(3, 4, 2, 64) == 1
    assert hb.per_image(10 ** 6, 4, 2, 64) == 64


def test_crop_box_ranges_and_fallback():
    for seed in range(200):
        top, left, h, w = hb.crop_box(60, 80, torch.Generator().manual_seed(seed))
        assert 0 <= top and top + h <= 60 and 0 <= left and left + w <= 80
        if (h, w) != (60, 80):  # a sampled box: the area fraction in [0.5, 2] (rounding aside), ratio in [3/4, 4/3]
            assert 0.45 <= h * w / 4800 and 0.70 <= w / h <= 1.42
    # 1 x 100 image: no sampled box fits, so the centre crop at the clamped ratio 4/3 -> width round(4/3) = 1
    assert hb.crop_box(1, 100, torch.Generator().manual_seed(0)) == (0, 49, 1, 1)


def test_view_keeps_image_and_mask_aligned():
    img = torch.zeros(3, 40, 40, dtype=torch.uint8)
    img[:, :, 20:] = 200
    mask = torch.zeros(40, 40, dtype=torch.long)
    mask[:, 20:] = 7
    for seed in range(10):
        v, m = hb.hummingbird_view(img, mask, (16, 16), torch.Generator().manual_seed(seed))
        assert v.shape == (3, 16, 16) and m.shape == (16, 16) and set(m.unique().tolist()) <= {0, 7}
        assert v.dtype == torch.float32 and 0 <= v.min() and v.max() <= 1  # float in [0, 1], as the reference
        bright = v.mean(0) > 100 / 255
        assert (bright == (m == 7)).float().mean() > 0.85  # jitter and the resize blur only the border


def _reference_view(image, mask, size, draws, monkeypatch):
    """open-hummingbird-eval's training view (official/hummingbird.py) made to take the draws ``draws``: each jitter
    op on (p = 1) or off (p = 0) with the range (f, f), and RandomResizedCrop's box fixed to ours."""
    import torchvision.transforms.functional as TF
    from official import hummingbird as ref
    on = dict(draws.jitter)
    kw = {}
    for name in hb.JITTER_OPS:
        kw[f"{name}_jitter_range"] = (on[name], on[name]) if name in on else 0.1
        kw[f"{name}_jitter_probability"] = 1.0 if name in on else 0.0
    monkeypatch.setattr(ref.transforms.RandomResizedCrop, "get_params", staticmethod(lambda *a, **k: draws.box))
    t = ref.get_hbird_train_transforms(size, **kw)
    comb = ref.CombTransforms(img_transform=t["img"], tgt_transform=None, img_tgt_transform=t["shared"])
    img, tgt = comb(TF.to_pil_image(image), TF.to_pil_image(mask.to(torch.uint8)))
    return img, (tgt[0] * 255).round().long()


def test_view_equals_reference_transforms_on_voc_fixture(fixtures_root, monkeypatch):
    # a real VOC image and mask: jitter on the whole PIL image before the crop, then the shared box, as the
    # reference; its std typo reproduced by reference_std_input (reference ops on, then off, by draw)
    from PIL import Image

    from datamodules.transforms.views import normalize
    voc = fixtures_root / "voc" / "VOCdevkit" / "VOC2012"
    image = torch.from_numpy(__import__("numpy").array(Image.open(voc / "JPEGImages" / "2011_000003.jpg")))
    image = image.permute(2, 0, 1).contiguous()
    mask = torch.from_numpy(__import__("numpy").array(Image.open(voc / "SegmentationClass" / "2011_000003.png")))
    seen = set()
    for seed in range(6):
        d = hb.draw_view(*image.shape[-2:], torch.Generator().manual_seed(seed))
        seen |= {name for name, _ in d.jitter}
        view, m = hb.apply_view(image, mask.long(), (48, 48), d)
        ref_img, ref_mask = _reference_view(image, mask, 48, d, monkeypatch)
        assert torch.equal(m, ref_mask)
        assert (normalize(hb.reference_std_input(view)) - ref_img).abs().max() < 1e-5
    assert seen == set(hb.JITTER_OPS)  # every op (hue's PIL HSV round trip included) was compared


def test_memory_plan_warns_when_capped_and_protocols():
    with pytest.warns(UserWarning, match="memory 1000 is capped at 64 patches"):
        plans = hb.plan_memory([16, 1000], num_images=2, aug_epochs=2, num_patches=16)
    assert [(p.requested, p.per_image, p.rows, p.capped) for p in plans] == [(16, 4, 16, False), (1000, 16, 64, True)]
    s = hb.PROTOCOLS[hb.DenseRetrievalProtocol("hummingbird")]
    assert (s.aug_epochs, s.img_size, s.memory, s.trainaug, s.std_typo, s.ade_other) == (
        2, 512, (102400, 1024000, 10240000), True, True, True)
    given = hb.resolve_settings(hb.DenseRetrievalProtocol.HUMMINGBIRD, aug_epochs=3, memory=None, std_typo=False)
    assert (given.aug_epochs, given.memory, given.std_typo, given.img_size) == (3, s.memory, False, 512)
    assert hb.resolve_settings(hb.DenseRetrievalProtocol.PROJECT) == hb.PROTOCOLS[hb.DenseRetrievalProtocol.PROJECT]
    # ADE20K's "other": the project maps raw 0 to ignore (mmseg), the protocol restores the raw ids
    import numpy as np

    from datamodules.datasets.ade20k import reduce_zero_label, restore_zero_label
    raw = np.array([[0, 1, 150], [7, 0, 2]])
    assert restore_zero_label(torch.from_numpy(reduce_zero_label(raw))).tolist() == raw.tolist()


def test_hungarian_equals_brute_force_and_majority_hand_worked():
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        cm = torch.randint(0, 30, (4, 4), generator=g)
        best = max(matched_miou(cm, torch.tensor(p))["mIoU"] for p in itertools.permutations(range(4)))
        assert matched_miou(cm, hungarian(cm))["mIoU"] == pytest.approx(best, abs=1e-12)
    cm = torch.tensor([[5, 0, 1], [1, 4, 3]])  # 3 clusters, 2 classes: clusters 0 -> 0, 1 -> 1, 2 -> 1
    assert majority(cm).tolist() == [0, 1, 1]
    # class 0: tp 5, fp 1, fn 1 -> 5/7; class 1: tp 7, fp 1, fn 1 -> 7/9; absent classes count 0
    assert matched_miou(cm, majority(cm))["mIoU"] == pytest.approx((5 / 7 + 7 / 9) / 2)
    assert confusion(torch.tensor([0, 255, 1]), torch.tensor([1, 0, 1]), 2, 2).tolist() == [[0, 1], [0, 1]]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_retrieval_probe_on_voc_fixture(fixtures_root, tmp_path):
    path = main(["--runs-dir", str(tmp_path), "--task", "voc", "--kind", "retrieval", *TINY, "--data", "voc",
                 "--data-root", str(fixtures_root / "voc"), "--img-size", "32", "--hb-memory", "16,40,100000",
                 "--hb-aug-epochs", "2"])
    assert path.parent.parent.name == "voc_retrieval"
    res = json.loads(path.read_text())
    m = res["metrics"]
    assert res["task"] == "voc_retrieval" and m["num_train"] == 2 and m["num_val"] == 1
    # 2 images x 2 views: 16 // 4 = 4 patches each; 40 // 4 = 10; 100000 is capped at every patch (4 x 4 grid)
    assert [(k, v["per_image"], v["memory"], v["capped"]) for k, v in m["mIoU"].items()] == [
        ("16", 4, 16, False), ("40", 10, 40, False), ("100000", 16, 64, True)]
    assert m["effective_memory"] == {"16": 16, "40": 40, "100000": 64} and m["capped"] == [100000]
    assert all(0 <= v["mIoU"] <= 100 and len(v["IoU"]) == 21 for v in m["mIoU"].values())
    assert (m["protocol"], m["std"], m["ade_other"]) == ("project", [0.229, 0.224, 0.225], False)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_hummingbird_protocol_one_flag_away(fixtures_root, tmp_path):
    # VOC fixture: no train_aug list, so VOC train with a warning and a note; 512 px, 2 views, the std typo,
    # every paper memory size capped at 2 images x 2 views x 64 x 64 patches
    argv = ["--runs-dir", str(tmp_path), "--task", "voc", "--kind", "retrieval", *TINY, "--data", "voc",
            "--data-root", str(fixtures_root / "voc"), "--protocol", "hummingbird"]
    with pytest.warns(UserWarning, match="VOC trainaug asked for"):
        m = json.loads(main(argv).read_text())["metrics"]
    assert (m["img_size"], m["aug_epochs"], m["std"], m["train_set"]) == ([512, 512], 2, [0.229, 0.224, 0.255], "voc")
    assert m["effective_memory"] == {str(s): 16384 for s in hb.PAPER_MEMORY} and m["capped"] == list(hb.PAPER_MEMORY)
    assert "train_aug.txt" in m["train_note"]
    # ADE20K: "other" kept as class 0 of 151 (ignored when scoring), as the reference; explicit flags win
    ade = ["--runs-dir", str(tmp_path), "--task", "ade20k", "--kind", "retrieval", *TINY, "--data", "ade20k",
           "--data-root", str(fixtures_root / "ade20k"), "--train-split", "val", "--img-size", "32",
           "--hb-memory", "40", "--protocol", "hummingbird", "--no-hb-std-typo"]
    m = json.loads(main(ade).read_text())["metrics"]
    assert (m["ade_other"], m["num_classes"], len(m["mIoU"]["40"]["IoU"]), m["std"][2]) == (True, 151, 151, 0.225)
    assert m["mIoU"]["40"]["IoU"][0] == 0  # "other" is never scored


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_retrieval_layer_all_gives_a_value_per_block(fixtures_root, tmp_path):
    path = main(["--runs-dir", str(tmp_path), "--task", "voc", "--kind", "retrieval", *TINY, "--data", "voc",
                 "--data-root", str(fixtures_root / "voc"), "--img-size", "32", "--hb-memory", "32",
                 "--layer", "all"])
    layers = json.loads(path.read_text())["metrics"]["layers"]
    assert list(layers) == ["block_0", "block_1"]  # vit_test_patch8 has 2 blocks
    assert all(set(v["mIoU"]) == {"32"} for v in layers.values())
    assert (path.parent / "depth_profile.png").stat().st_size > 1000


def test_kind_refused_for_a_task_it_does_not_fit():
    with pytest.raises(ValueError, match="does not apply to task 'nyuv2'"):
        main(["--task", "nyuv2", "--kind", "retrieval", "--ckpt", "random"])
    with pytest.raises(ValueError, match="does not apply"):
        main(["--task", "voc", "--kind", "retrival", "--ckpt", "random"])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_retrieval_two_processes_equal_one(tmp_path):
    from datamodules.demo import DemoSpec, ensure_demo_data
    demo = ensure_demo_data(tmp_path / "demo", spec=DemoSpec(cls_train=2, cls_val=2, voc_train=5, voc_val=3,
                                                             nyu_train=2, nyu_test=2))
    common = ["--task", "voc", "--kind", "retrieval", *TINY, "--data", "demo", "--data-root", str(demo),
              "--img-size", "32", "--hb-memory", "20,10000"]
    one = json.loads(main(["--runs-dir", str(tmp_path / "one"), *common]).read_text())["metrics"]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "probes.run", "--runs-dir", str(tmp_path / "two"), "--devices", "2", *common]
    p = procs.run(cmd, cwd=REPO, env=env, timeout=500)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    found = sorted((tmp_path / "two").glob("*/probe/*/version_*/results.json"))
    assert len(found) == 1, found
    two = json.loads(found[0].read_text())["metrics"]
    assert one["num_train"] == two["num_train"] == 5  # 5 images over 2 processes: shards of 3 and 2
    assert one["mIoU"] == two["mIoU"]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind,flags", [("retrieval", ["--hb-memory", "40,1000"]),
                                        ("overcluster", ["--cluster-k", "8,16"])])
def test_head_free_kinds_on_every_segmentation_dataset(fixtures_root, tmp_path, kind, flags):
    from test_own_data import make_custom_seg

    def run(task, data, root, train_split="train"):
        path = main(["--runs-dir", str(tmp_path / "runs"), "--task", task, "--kind", kind, *TINY, "--data", data,
                     "--data-root", str(root), "--train-split", train_split, "--img-size", "32,64", *flags])
        return json.loads(path.read_text())["metrics"]["mIoU"]
    for task in ("ade20k", "cityscapes"):  # these fixtures hold a val split only
        res = run(task, task, fixtures_root / task, "val")
        assert res and all(0 <= v["mIoU"] <= 100 for v in res.values())
    # custom_seg: the VOC fixture rearranged gives the VOC numbers on the same files
    own = run("seg", "custom_seg", make_custom_seg(fixtures_root, tmp_path / "seg"))
    assert own == run("voc", "voc", fixtures_root / "voc")


@pytest.mark.timeout(60)
def test_make_probe_passes_kind():
    import subprocess
    out = subprocess.run(["make", "-n", "probe", "TASK=voc", "KIND=retrieval", "LAYER=all"], cwd=REPO,
                         capture_output=True, text=True, timeout=50).stdout
    assert "--task 'voc'" in out and "--kind 'retrieval'" in out and "--layer 'all'" in out
