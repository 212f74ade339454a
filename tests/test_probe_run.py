"""End to end: `python -m probes.run` for every task on tiny generated demo data and the real fixtures."""
import hashlib
import json

import pytest
import torch

from backbones import create_vit
from datamodules.demo import DemoSpec, ensure_demo_data
from probes.core.features import FeatureSpec, FrozenFeatures
from tokenmix.knn import knn_top1
from probes.run import main, parse_layers

TINY = ["--arch", "vit_test_patch8", "--max-epochs", "2", "--batch-size", "4"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo")
    return ensure_demo_data(root, spec=DemoSpec(cls_train=3, cls_val=2, voc_train=4, voc_val=3,
                                                nyu_train=4, nyu_test=3))


@pytest.fixture
def runs(tmp_path):
    return tmp_path / "runs"


def _run(runs, *argv):
    path = main(["--runs-dir", str(runs), *argv])
    return path, json.loads(path.read_text())


def _tb_tags(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(folder), size_guidance={"images": 0})
    acc.Reload()
    return acc.Tags()


def test_knn_demo_matches_independent_computation(demo, runs):
    path, res = _run(runs, "--task", "knn", "--ckpt", "random", "--data", "demo", "--data-root", str(demo),
                     "--arch", "vit_test_patch8", "--knn-k", "1,3")
    assert path.parent.parent.name == "knn" and path.parent.name == "version_0"
    assert set(res["metrics"]["top1"]) == {"1", "3"}
    # recompute: same seeded random init, same centre-cropped images, last-block [CLS]
    import torchvision.transforms.v2 as T
    from datamodules import build_dataset
    torch.manual_seed(0)
    vit = create_vit("vit_test_patch8", "softmax")
    f = FrozenFeatures(vit, FeatureSpec(kind="cls"))
    view = T.Compose([T.Resize(64, interpolation=T.InterpolationMode.BICUBIC, antialias=True), T.CenterCrop(56)])

    def feats(split):  # DINO eval_knn's view in torchvision: Resize(64 = 56 * 256/224, bicubic) + CenterCrop(56)
        ds = build_dataset("demo_cls", str(demo), split)
        items = [ds[i] for i in range(len(ds))]
        return f(torch.stack([view(it["image"]) for it in items])), torch.tensor([it["label"] for it in items])
    (ftr, ytr), (fva, yva) = feats("train"), feats("val")
    ref = knn_top1(ftr, ytr, fva, yva, num_classes=8, ks=(1, 3))
    assert res["metrics"]["top1"]["1"] == pytest.approx(ref[1])
    assert res["metrics"]["top1"]["3"] == pytest.approx(ref[3])


@pytest.mark.slow
def test_voc_demo_seg_results_images_and_cache(demo, runs):
    path, res = _run(runs, "--task", "voc", "--ckpt", "random", "--data", "demo", "--data-root", str(demo),
                     "--img-size", "32", *TINY)
    m = res["metrics"]
    assert len(m["per_class_IoU"]) == 9                    # demo VOC: background + 8 shapes
    assert len(m["history"]) == 2
    assert res["config"]["features"] == {"kind": "dense", "n_last_blocks": 1, "blocks": None, "with_cls": False}
    tags = _tb_tags(path.parent)
    assert "pred_mask/val_0" in tags["images"] and "val/mIoU" in tags["scalars"]
    assert (path.parent / "head_default.pt").is_file()


def _write_red_square_voc(root):
    """VOC2012 layout, 32x32 grey-noise images with one red 16x16 'person' (class 15) on the 8 px grid."""
    import numpy as np
    from PIL import Image
    voc = root / "VOCdevkit" / "VOC2012"
    for d in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        (voc / d).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", 6), ("val", 3)):
        ids = []
        for i in range(n):
            img = rng.integers(60, 120, (32, 32, 3), dtype=np.uint8)
            mask = np.zeros((32, 32), np.uint8)
            y0, x0 = 8 * rng.integers(0, 2), 8 * rng.integers(0, 2)
            img[y0:y0 + 16, x0:x0 + 16] = (220, 30, 30)
            mask[y0:y0 + 16, x0:x0 + 16] = 15
            ids.append(f"{split}_{i}")
            Image.fromarray(img).save(voc / "JPEGImages" / f"{ids[-1]}.jpg", quality=95)
            Image.fromarray(mask).save(voc / "SegmentationClass" / f"{ids[-1]}.png")
        (voc / "ImageSets" / "Segmentation" / f"{split}.txt").write_text("\n".join(ids) + "\n")
    return root


@pytest.mark.slow
def test_seg_probe_learns_a_hand_built_dataset(runs, tmp_path):
    data = _write_red_square_voc(tmp_path / "redvoc")
    _, res = _run(runs, "--task", "voc", "--ckpt", "random", "--data", "voc", "--data-root", str(data),
                  "--img-size", "32", "--arch", "vit_test_patch8", "--max-epochs", "8", "--batch-size", "4",
                  "--lr", "0.05")
    m = res["metrics"]
    # predicting background everywhere: IoU 0.75 for background (a quarter of each image is red), 0 for person
    assert m["mIoU"] > 37.5 + 10, m["history"]
    assert m["per_class_IoU"][15] > 20 and m["history"][-1]["mIoU"] > m["history"][0]["mIoU"]


def _constant_depth_rmse(demo) -> float:
    """Mean per-image RMSE on the demo NYU test set of the best image-independent guess, the mean training
    depth; read with PIL/numpy, Eigen crop of 120x160 = rows 11:117, cols 10:150 (45/480.. of the frame)."""
    import numpy as np
    from PIL import Image
    ann = demo / "nyu" / "annotations"
    train = np.concatenate([np.asarray(Image.open(p), dtype=np.float64).ravel() / 1000
                            for p in sorted((ann / "train").glob("*.png"))])
    c = train[train > 0].mean()
    rmses = []
    for p in sorted((ann / "test").glob("*.png")):
        g = (np.asarray(Image.open(p), dtype=np.float64) / 1000)[11:117, 10:150]
        g = g[(g > 1e-3) & (g < 10)]
        rmses.append(np.sqrt(((g - c) ** 2).mean()))
    return float(np.mean(rmses))


@pytest.mark.slow
def test_nyu_demo_depth_with_layer_sweep(demo, runs):
    path, res = _run(runs, "--task", "nyuv2", "--ckpt", "random", "--data", "demo", "--data-root", str(demo),
                     "--img-size", "24,32", "--layer", "all", *TINY, "--max-epochs", "3", "--lr", "0.05")
    layers = res["metrics"]["layers"]
    assert set(layers) == {"block_0", "block_1"}            # vit_test_patch8 has 2 blocks
    baseline = _constant_depth_rmse(demo)
    for m in layers.values():
        assert {"rmse", "abs_rel", "d1", "d2", "d3", "rmse_log", "log10", "silog_mmseg", "silog_toolbox"} <= set(m)
        # learned: better than the best constant guess, and better after training than after one epoch
        assert m["rmse"] < 0.9 * baseline, (m["rmse"], baseline)
        assert m["history"][-1]["rmse"] < m["history"][0]["rmse"]
    assert "pred_depth/val_0" in _tb_tags(path.parent / "block_1")["images"]


@pytest.mark.slow
def test_imagenet_linear_demo_and_pixels_baseline(demo, runs):
    _, res = _run(runs, "--task", "imagenet", "--ckpt", "pixels", "--data", "demo", "--data-root", str(demo),
                  "--max-epochs", "4", "--batch-size", "8", "--lr", "0.1")
    assert res["backbone"]["source"] == "pixels"
    # learned: each demo class has its own colour, so raw pixels separate them far above chance (1 in 8)
    assert res["metrics"]["best_top1"] >= 2 * 100 / 8, res["metrics"]["history"]
    assert res["metrics"]["best_top1"] == max(h["top1"] for h in res["metrics"]["history"])


def test_checkpoint_hash_and_reruns_never_mix(demo, runs, tmp_path):
    ckpts = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        vit = create_vit("vit_test_patch8", "entmax")
        sd = {f"teacher.backbone.{k}": v for k, v in vit.state_dict().items()}
        sd.update({f"student.backbone.{k}": v for k, v in vit.state_dict().items()})
        p = tmp_path / f"seed{seed}.ckpt"
        torch.save({"state_dict": sd, "tokenmix": {"backbone": vit.config, "variant": "entmax",
                                                   "arch": "vit_test_patch8"}}, p)
        ckpts.append(p)
    common = ["--task", "knn", "--data", "demo", "--data-root", str(demo), "--knn-k", "2"]
    p1, r1 = _run(runs, "--ckpt", str(ckpts[0]), *common)
    p2, r2 = _run(runs, "--ckpt", str(ckpts[1]), *common)
    assert p1.parent != p2.parent and p1.parent.parent == p2.parent.parent   # runs/entmax/probe/knn/version_{0,1}
    assert p1.parents[3].name == "entmax"
    assert r1["backbone"]["sha256"] == hashlib.sha256(ckpts[0].read_bytes()).hexdigest()
    assert r2["backbone"]["sha256"] == hashlib.sha256(ckpts[1].read_bytes()).hexdigest()
    assert json.loads(p1.read_text()) == r1                                    # the first run is untouched


@pytest.mark.parametrize("task,data,train_split", [
    ("ade20k", "ade20k", "val"), ("cityscapes", "cityscapes", "val"),
    ("sunrgbd", "sunrgbd", "test"), ("kitti", "kitti", "test")])
@pytest.mark.slow
def test_real_fixture_layouts(fixtures_root, runs, task, data, train_split):
    _, res = _run(runs, "--task", task, "--ckpt", "random", "--data", data,
                  "--data-root", str(fixtures_root / data), "--train-split", train_split, "--img-size", "32",
                  "--max-epochs", "1", "--arch", "vit_test_patch8", "--batch-size", "2")
    m = res["metrics"]
    assert ("mIoU" in m) if task in ("ade20k", "cityscapes") else (m["rmse"] > 0)
    assert res["config"]["num_val"] >= 1


def test_clear_errors(runs, tmp_path, monkeypatch):
    from tokenmix import paths
    monkeypatch.setattr(paths, "DEMO_ROOT", tmp_path / "demo")  # a wrong CKPT must fail before the demo data exists
    with pytest.raises(ValueError, match="valid tasks: imagenet, knn, voc"):
        main(["--task", "segment", "--ckpt", "random"])
    with pytest.raises(FileNotFoundError, match="needs --data-root"):
        main(["--task", "voc", "--ckpt", "random", "--data", "voc", "--data-root", ""])
    with pytest.raises(ValueError, match="no built-in demo data"):
        main(["--task", "ade20k", "--ckpt", "random", "--data", "demo"])
    with pytest.raises(FileNotFoundError, match="checkpoint .* not found"):
        main(["--task", "voc", "--ckpt", str(tmp_path / "nope.ckpt")])
    with pytest.raises(FileNotFoundError, match="make pretrain VARIANT=sparsemax"):
        main(["--task", "voc", "--ckpt", "", "--variant", "sparsemax", "--runs-dir", str(runs)])
    assert not (tmp_path / "demo").exists()
    with pytest.raises(ValueError, match="out of range"):
        parse_layers("7", 2)
    assert parse_layers("", 4) == [None] and parse_layers("all", 2) == [[0], [1]] and parse_layers("-1", 3) == [[2]]


def test_version_dirs_and_config_file(tmp_path):
    from probes.core.flags import parse_flags
    from tokenmix.paths import claim_version_dir
    root = tmp_path / "knn"
    (root / "version_0").mkdir(parents=True)
    (root / "version_3").mkdir()
    (root / "version_x").mkdir()
    assert claim_version_dir(root).name == "version_4" and claim_version_dir(root).name == "version_5"
    cfg = tmp_path / "c.yaml"
    cfg.write_text("batch_size: 7\ntasks:\n  voc:\n    max_epochs: 3\n  knn:\n    max_epochs: 9\n")
    a = parse_flags(["--task", "voc", "--config", str(cfg)])
    assert (a.batch_size, a.max_epochs) == (7, 3)
    assert parse_flags(["--task", "voc", "--config", str(cfg), "--batch-size", "2"]).batch_size == 2
    cfg.write_text("batch_sise: 7\n")
    with pytest.raises(ValueError, match="unknown keys \\['batch_sise'\\]"):
        parse_flags(["--task", "voc", "--config", str(cfg)])


def test_kind_registry_follows_the_protocols():
    """Per kind: DINO eval_linear (100 epochs, batch 256, [CLS] of the last 4 blocks), eval_knn (last-block
    [CLS], nothing trained), dense probes (40 epochs, batch 16; depth concatenates [CLS] as DINOv2, seg does not)."""
    from probes.core.kinds import KINDS, summary
    from probes.core.flags import OPTIONS, parse_flags
    from probes.dense.options import DepthOptions, Head, SegOptions
    from probes.core.task_table import ALT_KINDS, TASKS, Kind
    alts = {k for kinds in ALT_KINDS.values() for k in kinds}  # --kind retrieval / overcluster on seg tasks
    assert {t.kind for t in TASKS.values()} | alts == set(KINDS) == set(Kind)
    assert [(KINDS[k].epochs, KINDS[k].batch_size) for k in (Kind.KNN, Kind.LINEAR, Kind.SEG, Kind.DEPTH)] == [
        (0, 64), (100, 256), (40, 16), (40, 16)]
    voc = TASKS["voc"]
    options = {k: OPTIONS[k](parse_flags(["--task", "voc"]), voc, 448) for k in Kind}  # every kind's defaults
    spec = {k: KINDS[k].features(options[k], 12, None).describe() for k in Kind}
    assert spec[Kind.KNN] == {"kind": "cls", "n_last_blocks": 1, "blocks": None, "with_cls": False}
    assert spec[Kind.LINEAR]["n_last_blocks"] == 4 and \
        KINDS[Kind.LINEAR].features(options[Kind.LINEAR], 2, None).n_last_blocks == 2
    assert spec[Kind.DEPTH]["with_cls"] and not spec[Kind.SEG]["with_cls"]
    seg = options[Kind.SEG]
    four = KINDS[Kind.SEG].features(SegOptions(seg.train, Head.LINEAR4, True, seg.solver, seg.ridge_lambda), 12, [3])
    assert (four.n_last_blocks, list(four.blocks), four.with_cls) == (4, [3], True)
    depth = options[Kind.DEPTH]  # --no-cls overrides depth's default
    assert not KINDS[Kind.DEPTH].features(DepthOptions(depth.train, Head.LINEAR, False, depth.depth_head,
                                                       depth.bin_norm), 12, None).with_cls
    assert summary(Kind.DEPTH, {"rmse": 0.5, "abs_rel": 0.25, "d1": 0.75}) == "RMSE 0.5000, AbsRel 0.2500, d1 0.7500"
    assert summary(Kind.KNN, {"layers": {"block_0": {"top1": {"20": 50.0}}, "block_1": {"top1": {"20": 60.0}}}}) == \
        "block_0: k-NN top-1 k=20: 50.00; block_1: k-NN top-1 k=20: 60.00"
