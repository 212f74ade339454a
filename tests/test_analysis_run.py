"""End to end: `python -m analysis.run` for every task on a tiny VOC-layout dataset and a tiny checkpoint."""
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import procs
from analysis import run as analysis_run
from analysis.registry import TASKS
from tokenmix import paths
from tokenmix.io import atomic_torch_save

REPO = Path(__file__).resolve().parents[1]


def write_voc(root: Path, n: int = 5) -> Path:
    voc = root / "VOCdevkit" / "VOC2012"
    for d in ("JPEGImages", "SegmentationClass", "Annotations", "ImageSets/Segmentation"):
        (voc / d).mkdir(parents=True)
    rng = np.random.default_rng(0)
    ids = []
    for i in range(n):
        W, H = 48 + 8 * (i % 2), 40
        img = rng.integers(60, 120, (H, W, 3), dtype=np.uint8)
        x0, y0 = 8 + 3 * i, 6 + 2 * i
        img[y0:y0 + 16, x0:x0 + 20] = (220, 30, 30)
        name = f"2008_{i:06d}"
        ids.append(name)
        Image.fromarray(img).save(voc / "JPEGImages" / f"{name}.jpg", quality=95)
        Image.fromarray(np.zeros((H, W), np.uint8), mode="L").convert("P").save(voc / "SegmentationClass" / f"{name}.png")
        objs = [("person", x0 + 1, y0 + 1, x0 + 20, y0 + 16)] + ([("car", 1, 1, 10, 12)] if i % 2 else [])
        xml = "<annotation><filename>%s.jpg</filename><size><width>%d</width><height>%d</height><depth>3</depth></size>" % (name, W, H)
        for c, a, b, cc, d in objs:
            xml += (f"<object><name>{c}</name><difficult>0</difficult><bndbox><xmin>{a}</xmin><ymin>{b}</ymin>"
                    f"<xmax>{cc}</xmax><ymax>{d}</ymax></bndbox></object>")
        (voc / "Annotations" / f"{name}.xml").write_text(xml + "</annotation>")
    for split in ("val", "trainval"):
        (voc / "ImageSets" / "Segmentation" / f"{split}.txt").write_text("\n".join(ids) + "\n")
    return root


def write_ckpt(path: Path, variant: str) -> Path:
    import backbones
    torch.manual_seed(0)
    m = backbones.create_vit("vit_test_patch8", variant)
    sd = {f"{who}.backbone.{k}": v for who in ("teacher", "student") for k, v in m.state_dict().items()}
    atomic_torch_save({"state_dict": sd, "tokenmix": {"backbone": dict(m.config), "variant": m.variant,
                                                      "arch": m.arch}}, path)
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("analysis_e2e")
    data = write_voc(root / "data")
    ckpts = {v: write_ckpt(root / f"{v.replace('+', '_')}.ckpt", v) for v in ("softmax", "entmax+lastvit")}
    return root, data, ckpts


def _run(root, data, ckpt, task, *extra):
    mp = pytest.MonkeyPatch()
    mp.setattr(paths, "RUNS", root / "runs")
    try:
        return analysis_run.main(["--task", task, "--variant", "", "--ckpt", str(ckpt), "--data", "voc",
                                  "--data-root", str(data), "--batch-size", "2", "--num-vis", "2",
                                  "--image-set", "Segmentation", *extra])
    finally:
        mp.undo()


@torch.no_grad()
def _pib_recomputed(ckpt, data, res):
    """PiB of the encoder's [CLS] and of LaSt-ViT's aggregated token, and the share of votes in the box, from the
    model's plain forward on the same crops (not through analysis.tasks)."""
    import backbones
    from analysis.boxes import boxes_to_patch_mask, map_boxes
    from analysis.data import eval_crop, iter_samples, open_dataset
    model = backbones.backbone_from_checkpoint(ckpt).eval()
    hits, agg_hits, shares = [], [], []
    for s in iter_samples(open_dataset("voc", str(data), "val", boxes=True, image_set="Segmentation")):
        # the recorded view: PiB resizes bilinear, as LaSt-ViT's T.Resize(256)
        x, rc = eval_crop(s.image, res["config"]["resize"], res["config"]["crop"], res["config"]["interpolation"])
        y = model.forward_features(x[None])
        g = res["config"]["crop"] // model.patch_size
        box = boxes_to_patch_mask(map_boxes(s.boxes, rc), (g, g), model.patch_size)
        patch = y[0, model.num_prefix_tokens:]
        top = lambda tok: int(torch.nn.functional.cosine_similarity(patch, tok[None], dim=-1).argmax())  # noqa: E731
        hits.append(bool(box[top(y[0, 0])]))
        if model.aggregator is not None:
            agg, votes = model.aggregator(patch[None])
            agg_hits.append(bool(box[top(agg[0])]))
            shares.append(float((votes[0] * box).sum() / votes[0].sum()))
    pct = lambda h: 100 * sum(h) / len(h) if h else None  # noqa: E731
    return pct(hits), pct(agg_hits), (100 * sum(shares) / len(shares) if shares else None)


@pytest.mark.parametrize("task", [t for t in TASKS if t not in ("votes", "calibration", "marker")])  # votes: lastvit
# only, below; calibration: the probes' labelled data (tests/test_calibration.py); marker: a supervised checkpoint's
# head on cue-conflict scenes, no figure (tests/test_analysis_marker.py)
def test_every_task_writes_results_and_pngs(setup, task):
    root, data, ckpts = setup
    res = _run(root, data, ckpts["softmax"], task, *(["--no-tensorboard"] if task != "pib" else []))
    folders = sorted((root / "runs" / "softmax" / "analysis" / task).glob("version_*"))
    out = folders[-1]
    saved = json.loads((out / "results.json").read_text())
    assert saved["task"] == task and saved["variant"] == "softmax" and saved["data"] == "voc"
    assert saved["backbone"]["config"]["arch"] == "vit_test_patch8" and saved["backbone"]["source"] == "checkpoint"
    assert saved["backbone"]["sha256"] == hashlib.sha256(ckpts["softmax"].read_bytes()).hexdigest()
    assert saved == res
    figures = saved["metrics"]["figures"]
    assert figures and all((out / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in figures)
    m = saved["metrics"]
    if task in ("pib", "corloc"):
        assert m["n_images"] == 5 and 0 <= m[task] <= 100
        assert m[task] * 5 / 100 == pytest.approx(round(m[task] * 5 / 100))  # a whole number of images
    if task == "pib":
        assert len(m["pib_per_layer"]) == 2 and m["pib_per_layer"][-1] == m["pib"]
        assert m["pib"] == pytest.approx(_pib_recomputed(ckpts["softmax"], data, saved)[0])
        assert list(out.glob("events.out.tfevents.*"))  # figures also went to TensorBoard
    if task == "attention":
        assert m["zero_share"] == 0.0 and len(m["per_head"]["all"]["entropy"]) == 2  # softmax: no exact zeros
    if task == "norms":
        assert len(m["high_norm_share_per_layer"]) == 2
    if task == "pca":
        assert len(m["explained_variance_ratio"]) == 3 and sum(m["explained_variance_ratio"]) <= 1 + 1e-6
    if task == "corloc":  # the criterion recomputed on the boxes the run wrote, against the GT drawn in write_voc
        boxes = json.loads((out / m["boxes_file"]).read_text())
        hits = [any(_iou(b["box"], g) >= 0.5 for g in _write_voc_gt(b["index"])) for b in boxes]
        assert [b["index"] for b in boxes] == list(range(5)) and m["corloc"] == pytest.approx(100 * sum(hits) / 5)


def _write_voc_gt(i: int) -> list[tuple[int, int, int, int]]:
    """GT boxes of image i of write_voc as 0-based pixel edges (the XML's xmin - 1, ymin - 1, xmax, ymax)."""
    x0, y0 = 8 + 3 * i, 6 + 2 * i
    return [(x0, y0, x0 + 20, y0 + 16)] + ([(0, 0, 10, 12)] if i % 2 else [])


def _iou(a, b) -> float:
    iw, ih = min(a[2], b[2]) - max(a[0], b[0]), min(a[3], b[3]) - max(a[1], b[1])
    inter = max(iw, 0) * max(ih, 0)
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def _write_scenes(root: Path, scenes) -> Path:
    """A VOC layout of grey images with one red square each; ``scenes``: (W, H, red square, GT boxes) in 0-based
    pixel edges. Lossless-enough JPEG: no chroma subsampling, edges on the 8-px JPEG blocks."""
    voc = root / "VOCdevkit" / "VOC2012"
    for d in ("JPEGImages", "SegmentationClass", "Annotations", "ImageSets/Segmentation"):
        (voc / d).mkdir(parents=True)
    ids = []
    for i, (W, H, (a, b, c, d), gts) in enumerate(scenes):
        img = np.full((H, W, 3), 110, np.uint8)
        img[b:d, a:c] = (230, 20, 20)
        ids.append(f"2008_{i:06d}")
        Image.fromarray(img).save(voc / "JPEGImages" / f"{ids[-1]}.jpg", quality=100, subsampling=0)
        Image.fromarray(np.zeros((H, W), np.uint8), mode="L").convert("P").save(voc / "SegmentationClass" / f"{ids[-1]}.png")
        objs = "".join(f"<object><name>person</name><difficult>0</difficult><bndbox><xmin>{g[0] + 1}</xmin><ymin>"
                       f"{g[1] + 1}</ymin><xmax>{g[2]}</xmax><ymax>{g[3]}</ymax></bndbox></object>" for g in gts)
        (voc / "Annotations" / f"{ids[-1]}.xml").write_text(
            f"<annotation><filename>{ids[-1]}.jpg</filename><size><width>{W}</width><height>{H}</height>"
            f"<depth>3</depth></size>{objs}</annotation>")
    (voc / "ImageSets" / "Segmentation" / "trainval.txt").write_text("\n".join(ids) + "\n")
    return root


def test_corloc_known_answer_end_to_end(setup, monkeypatch):
    """LOST + CorLoc through the CLI, the VOC loader and the JPEG files, with the backbone's keys replaced by
    hand-built colour features (patch colour minus the image's mean patch colour): the 9 red patches correlate
    positively with 8 others, every grey one with 38, so the seed is red and LOST's box is the red square, known
    by construction; which GT boxes it matches at IoU >= 0.5 is known too."""
    import analysis.lost

    root, _, ckpts = setup
    red, odd = (16, 8, 40, 32), (24, 16, 48, 40)
    scenes = [(64, 48, red, [red]),                 # IoU 1: hit
              (64, 48, red, [(40, 24, 64, 48)]),    # GT elsewhere: miss
              (64, 48, red, [(16, 8, 40, 20)]),     # IoU 288 / 576 = 0.5 exactly: hit
              (64, 48, red, [(16, 8, 40, 19)]),     # IoU 264 / 576 < 0.5: miss
              (70, 50, odd, [(0, 0, 6, 6), odd])]   # padded to 72 x 56; any GT box counts: hit
    data = _write_scenes(root / "scenes", scenes)
    monkeypatch.setattr(analysis.lost, "last_block_keys", lambda model, x: (
        lambda f: f - f.mean(1, keepdim=True))(torch.nn.functional.avg_pool2d(x, 8).flatten(2).transpose(1, 2)))
    res = _run(root, data, ckpts["softmax"], "corloc", "--no-tensorboard", "--split", "trainval")
    m = res["metrics"]
    assert (m["n_images"], m["corloc"]) == (5, 60.0)
    out = sorted((root / "runs" / "softmax" / "analysis" / "corloc").glob("version_*"))[-1]
    boxes = json.loads((out / m["boxes_file"]).read_text())
    assert [tuple(b["box"]) for b in boxes] == [red] * 4 + [odd]
    assert [b["hit"] for b in boxes] == [True, False, True, False, True]
    assert [max(_iou(b["box"], g) for g in sc[3]) >= 0.5 for b, sc in zip(boxes, scenes)] == [b["hit"] for b in boxes]


def test_lastvit_vote_maps_and_checkpoint_variant_names_the_run(setup):
    root, data, ckpts = setup
    res = _run(root, data, ckpts["entmax+lastvit"], "pib", "--no-tensorboard")
    assert res["variant"] == "entmax+lastvit"
    m = res["metrics"]
    cls_pib, agg_pib, share = _pib_recomputed(ckpts["entmax+lastvit"], data, res)
    assert (m["pib_cls"], m["pib_aggregated"]) == (pytest.approx(cls_pib), pytest.approx(agg_pib))
    assert m["votes"]["share_of_votes_in_box"] == pytest.approx(share, abs=1e-3)
    out = sorted((root / "runs" / "entmax+lastvit" / "analysis" / "pib").glob("version_*"))[-1]
    assert (out / "vote_maps.png").is_file()
    # a second run never overwrites the first
    _run(root, data, ckpts["entmax+lastvit"], "pib", "--no-tensorboard")
    assert len(list((root / "runs" / "entmax+lastvit" / "analysis" / "pib").glob("version_*"))) == 2


def test_clear_errors(setup, tmp_path):
    root, data, ckpts = setup
    with pytest.raises(SystemExit, match="Valid tasks: pib, pca, norms, attention, corloc, votes"):
        analysis_run.main(["--task", "nope"])
    with pytest.raises(FileNotFoundError, match="DATA_ROOT"):
        analysis_run.main(["--task", "pca", "--ckpt", str(ckpts["softmax"]), "--data", "voc", "--data-root", ""])
    mp = pytest.MonkeyPatch()
    mp.setattr(paths, "RUNS", tmp_path / "empty_runs")
    mp.setattr(paths, "DEMO_ROOT", tmp_path / "demo")
    try:  # a wrong CKPT fails within seconds: before the demo data is generated
        with pytest.raises(FileNotFoundError, match="checkpoint .* not found"):
            analysis_run.main(["--task", "pca", "--ckpt", str(tmp_path / "missing.ckpt")])
        with pytest.raises(FileNotFoundError, match="make pretrain VARIANT=entmax"):
            analysis_run.main(["--task", "pca", "--variant", "entmax", "--ckpt", ""])
        assert not (tmp_path / "demo").exists()
    finally:
        mp.undo()


def test_baseline_and_devices_refusals(setup):  # --devices 2 itself: tests/test_ddp_analysis.py
    root, data, ckpts = setup
    with pytest.raises(ValueError, match="analyses need a ViT"):
        analysis_run.main(["--task", "pca", "--ckpt", "pixels"])
    with pytest.raises(ValueError, match="--devices 'x'"):
        analysis_run.main(["--task", "pca", "--ckpt", "random", "--devices", "x"])


@pytest.mark.slow
def test_cli_exit_code_and_message():
    r = procs.run([sys.executable, "-m", "analysis.run", "--task", "bogus", "--variant", "softmax",
                   "--ckpt", "", "--data", "demo", "--data-root", ""], cwd=REPO, timeout=120)
    assert r.returncode != 0 and "Valid tasks" in r.stderr


FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "real"


@pytest.mark.skipif(not (FIXTURES / "voc").is_dir(), reason=f"real-format fixtures not present at {FIXTURES}")
def test_real_voc_fixture_layout(setup):
    """The real VOC2012 layout (3 JPEGs, XML boxes): every image with its boxes goes through PiB and LOST."""
    root, _, ckpts = setup
    for task in ("pib", "corloc"):
        res = _run(root, FIXTURES / "voc", ckpts["softmax"], task, "--split", "trainval", "--no-tensorboard")
        assert res["metrics"]["n_images"] == 3 and res["config"]["split"] == "trainval"
