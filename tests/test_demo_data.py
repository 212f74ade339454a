"""Built-in demo data: layouts, label consistency, determinism, the completion marker."""
from __future__ import annotations

import json
import multiprocessing
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from datamodules import demo
from datamodules.datasets.palette import voc_palette
from datamodules.demo import cache, layouts, scenes
from datamodules.demo import CLASS_NAMES, IGNORE_INDEX, MARKER, SEG_CLASSES, DemoSpec, ensure_demo_data

SMALL = DemoSpec(cls_train=3, cls_val=2, voc_train=6, voc_val=3, nyu_train=3, nyu_test=2)


@pytest.fixture(scope="module")
def small_root(tmp_path_factory) -> Path:
    return ensure_demo_data(tmp_path_factory.mktemp("demo") / "demo", spec=SMALL)


def files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_layout_counts_and_metadata(small_root):
    r = small_root
    for split, n in (("train", SMALL.cls_train), ("val", SMALL.cls_val)):
        assert sorted(d.name for d in (r / "imagefolder" / split).iterdir()) == CLASS_NAMES
        for name in CLASS_NAMES:
            pngs = sorted((r / "imagefolder" / split / name).glob("*.png"))
            assert len(pngs) == n
            im = Image.open(pngs[0])
            assert im.mode == "RGB" and im.size == (64, 64)
    voc = r / "VOCdevkit" / "VOC2012"
    sets = {s: (voc / "ImageSets" / "Segmentation" / f"{s}.txt").read_text().split()
            for s in ("train", "val", "trainval")}
    assert len(sets["train"]) == SMALL.voc_train and len(sets["val"]) == SMALL.voc_val
    assert not set(sets["train"]) & set(sets["val"]) and sets["trainval"] == sets["train"] + sets["val"]
    for i in sets["trainval"]:
        for sub, ext in (("JPEGImages", "jpg"), ("SegmentationClass", "png"), ("SegmentationObject", "png"),
                         ("Annotations", "xml")):
            assert (voc / sub / f"{i}.{ext}").is_file()
    for split, n in (("train", SMALL.nyu_train), ("test", SMALL.nyu_test)):
        imgs = sorted((r / "nyu" / "images" / split).glob("*.jpg"))
        deps = sorted((r / "nyu" / "annotations" / split).glob("*.png"))
        assert len(imgs) == n and [p.stem for p in imgs] == [p.stem for p in deps]
    meta = json.loads((r / "classes.json").read_text())
    assert meta["classes"] == CLASS_NAMES and meta["seg_classes"] == ["background"] + CLASS_NAMES
    assert meta["num_classes"] == {"classification": 8, "segmentation": 9} and meta["ignore_index"] == 255
    assert meta["palette"][:3] == [[0, 0, 0], [128, 0, 0], [0, 128, 0]]  # VOC colour map
    marker = json.loads((r / MARKER).read_text())
    assert marker["files"] == sum(len(f) for _, _, f in os.walk(r)) - 1
    assert marker["sha256"] == cache._digest(r)[0]


def test_voc_masks_instances_and_boxes_agree(small_root):
    voc = small_root / "VOCdevkit" / "VOC2012"
    pal = voc_palette()
    n_objects = 0
    for xml in sorted((voc / "Annotations").glob("*.xml")):
        name = xml.stem
        img = Image.open(voc / "JPEGImages" / f"{name}.jpg")
        cls_png, obj_png = Image.open(voc / "SegmentationClass" / f"{name}.png"), \
            Image.open(voc / "SegmentationObject" / f"{name}.png")
        assert img.mode == "RGB" and img.size == (128, 128)
        assert cls_png.mode == "P" and cls_png.getpalette()[:27] == pal[:27]
        label, inst = np.array(cls_png), np.array(obj_png)
        assert set(np.unique(label)) <= set(range(len(SEG_CLASSES))) | {IGNORE_INDEX}
        assert np.array_equal(label == IGNORE_INDEX, inst == IGNORE_INDEX)
        # 255 separates regions: no two different real labels touch (4-neighbourhood)
        for a, b in ((label[1:], label[:-1]), (label[:, 1:], label[:, :-1])):
            touch = (a != b) & (a != IGNORE_INDEX) & (b != IGNORE_INDEX)
            assert not touch.any()
        root = ET.parse(xml).getroot()
        assert root.findtext("filename") == f"{name}.jpg"
        assert (root.findtext("size/width"), root.findtext("size/height")) == ("128", "128")
        objs = root.findall("object")
        assert len(objs) == inst[inst != IGNORE_INDEX].max()  # instance ids 1..n, one per XML object
        for k, obj in enumerate(objs, start=1):
            cls = CLASS_NAMES.index(obj.findtext("name")) + 1
            m = inst == k
            assert m.sum() > 0 and (label[m] == cls).all()
            x0, y0, x1, y1 = (int(obj.findtext(f"bndbox/{t}")) for t in ("xmin", "ymin", "xmax", "ymax"))
            ys, xs = np.nonzero(m)
            # VOC boxes: 1-based, inclusive, taken before the void border was cut away (which removes the
            # outer pixel ring, and thin tips entirely): the visible pixels lie inside
            assert x0 <= xs.min() + 1 and xs.max() + 1 <= x1 and y0 <= ys.min() + 1 and ys.max() + 1 <= y1
            assert 1 <= x0 <= x1 <= 128 and 1 <= y0 <= y1 <= 128
            # and the box is exactly the tight box of the object before the cut (same scene re-rendered)
            split, idx = name.split("_")[1], int(name.split("_")[2])
            _, label2, inst2, objects2, full = scenes.render_segmentation(
                layouts._rng(SMALL, {"train": 3, "val": 4}[split], idx), 128)
            assert np.array_equal(label2, label) and np.array_equal(inst2, inst)
            assert objects2[k - 1][1] == (x0, y0, x1, y1) == scenes.voc_box(full == k)
            n_objects += 1
        # the object pixels really carry the class colour: saturated, unlike the grey clutter background
        hsv = np.array(img.convert("HSV")).astype(float)
        obj_px, bg_px = (label > 0) & (label != IGNORE_INDEX), label == 0
        if obj_px.sum() > 50:
            assert hsv[..., 1][obj_px].mean() > hsv[..., 1][bg_px].mean() + 40
    assert n_objects >= SMALL.voc_train + SMALL.voc_val


def test_nyu_depth_pngs_and_mmseg_listing(small_root):
    nyu = small_root / "nyu"
    for p in sorted((nyu / "annotations" / "train").glob("*.png")):
        d = Image.open(p)
        assert d.mode == "I;16" and d.size == (160, 120)
        a = np.array(d).astype(float)
        assert 500 <= a.min() and a.max() <= 10000
        # a plausible room: the floor at the bottom is nearer than the wall at the top
        assert np.median(a[-4:]) < 1200 < 5000 < np.median(a[:4])
        rgb = Image.open(nyu / "images" / "train" / f"{p.stem}.jpg")
        assert rgb.mode == "RGB" and rgb.size == (160, 120)
    # mmseg's own NYUDataset finds every pair and the scene category from the file name
    from tokenmix.mmseg_compat import import_mmseg
    import_mmseg()
    from mmseg.datasets import NYUDataset
    ds = NYUDataset(data_root=str(nyu), data_prefix=dict(img_path="images/test", depth_map_path="annotations/test"),
                    pipeline=[], test_mode=True)
    assert len(ds) == SMALL.nyu_test
    info = ds.get_data_info(0)
    assert Path(info["depth_map_path"]).is_file()
    assert info["category_id"] == list(NYUDataset.METAINFO["classes"]).index(demo.NYU_SCENE)


def test_voc_box_is_one_based_inclusive():
    m = np.zeros((10, 12), bool)
    m[2:5, 3:9] = True  # rows 2..4, cols 3..8 (0-based)
    assert scenes.voc_box(m) == (4, 3, 9, 5)
    m[:] = False
    m[0, 0] = m[9, 11] = True
    assert scenes.voc_box(m) == (1, 1, 12, 10)


def test_same_bytes_every_run_and_seed_matters(small_root, tmp_path):
    demo.generate(tmp_path / "again", SMALL)
    a, b = files(tmp_path / "again"), files(small_root)
    ma, mb = json.loads(a.pop(MARKER)), json.loads(b.pop(MARKER))  # the marker also records the duration
    assert a == b and ma["sha256"] == mb["sha256"]
    other = DemoSpec(**{**SMALL.__dict__, "seed": 1})
    demo.generate(tmp_path / "seed1", other)
    a, b = files(tmp_path / "seed1"), files(small_root)
    assert a.keys() == b.keys()
    assert a["imagefolder/train/disc/disc_00000.png"] != b["imagefolder/train/disc/disc_00000.png"]


def test_marker_regeneration_and_atomic_swap(tmp_path):
    root = tmp_path / "demo"
    ensure_demo_data(root, spec=SMALL)
    marker = root / MARKER
    first = marker.stat().st_mtime_ns
    digest = json.loads(marker.read_text())["sha256"]
    # complete: reused as it is
    assert ensure_demo_data(root, spec=SMALL) == root.resolve() and marker.stat().st_mtime_ns == first
    # a file went missing: regenerated
    next((root / "imagefolder" / "train" / "bar").glob("*.png")).unlink()
    assert not demo.is_complete(root, SMALL)
    ensure_demo_data(root, spec=SMALL)
    assert demo.is_complete(root, SMALL) and json.loads(marker.read_text())["sha256"] == digest
    # half-written folder (no marker, stray files): replaced by a complete one
    marker.unlink()
    (root / "stray.tmp").write_text("partial")
    ensure_demo_data(root, spec=SMALL)
    assert demo.is_complete(root, SMALL) and not (root / "stray.tmp").exists()
    # another spec, or data drawn by another version of the generator, is stale
    assert not demo.is_complete(root, DemoSpec(**{**SMALL.__dict__, "cls_val": 1}))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(layouts, "_SOURCE_DIGEST", b"edited generator")
        assert not demo.is_complete(root, SMALL)
    assert demo.is_complete(root, SMALL)
    # force regenerates even when complete
    before = marker.stat().st_mtime_ns
    ensure_demo_data(root, force=True, spec=SMALL)
    assert marker.stat().st_mtime_ns != before and json.loads(marker.read_text())["sha256"] == digest
    # nothing left behind next to it
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == ["demo"]


def test_chunks_cover_every_image_once_and_default_workers(monkeypatch):
    monkeypatch.setattr(layouts, "_CHUNK_PIXELS", 3 * 64 * 64)  # 3 classification images, 1 VOC/NYU image a chunk
    spec = DemoSpec(cls_train=7, cls_val=2, voc_train=3, voc_val=0, nyu_train=2, nyu_test=1)
    got = {}
    for kind, split, layout, c, start, stop in layouts.chunks(spec):
        assert 0 < stop - start <= (3 if kind == "imagefolder" else 1)
        got.setdefault((kind, split, layout, c), []).extend(range(start, stop))
    want = {**{("imagefolder", "train", 1, c): list(range(7)) for c in range(8)},
            **{("imagefolder", "val", 2, c): [0, 1] for c in range(8)},
            ("voc", "train", 3, 0): [0, 1, 2], ("nyu", "train", 5, 0): [0, 1], ("nyu", "test", 6, 0): [0]}
    assert got == want
    # default DEMO: 16800 64x64 + 400 128x128 + 250 120x160 images = 80,166,400 pixels = 9.6 workers' worth
    assert layouts.pixels(DemoSpec()) == 16800 * 4096 + 400 * 16384 + 250 * 19200 == 80_166_400
    for cpus, want_workers in ((64, 9), (2, 2), (1, 1)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cpus: set(range(n)))
        assert cache.default_workers(DemoSpec()) == want_workers
        assert cache.default_workers(SMALL) == 1  # small specs (every other test's) start no process
    with pytest.raises(ValueError, match="workers"):
        demo.generate(Path("/nonexistent/never-created"), SMALL, workers=0)


@pytest.mark.slow  # starts worker processes
@pytest.mark.timeout(240)
def test_workers_write_the_same_bytes_and_stop_cleanly(tmp_path, monkeypatch):
    monkeypatch.setattr(layouts, "_CHUNK_PIXELS", 3 * 64 * 64)  # many chunks, some starting mid-range
    spec = DemoSpec(cls_train=4, cls_val=2, voc_train=2, voc_val=2, nyu_train=2, nyu_test=2)
    meta = [demo.generate(tmp_path / f"w{w}", spec, workers=w) for w in (1, 2)]
    a, b = files(tmp_path / "w1"), files(tmp_path / "w2")
    ma, mb = json.loads(a.pop(MARKER)), json.loads(b.pop(MARKER))
    assert meta[0] == meta[1] and a.keys() == b.keys() and a == b
    assert ma["sha256"] == mb["sha256"] == cache._digest(tmp_path / "w2")[0] and ma["files"] == mb["files"] == len(b)
    assert not multiprocessing.active_children()  # the pool is shut down
    # a worker's error reaches the caller, the pool is shut down, no marker is written
    blocked = tmp_path / "err" / "imagefolder" / "train" / "bar" / "bar_00001.png"
    blocked.mkdir(parents=True)  # a folder where a worker writes an image
    with pytest.raises(IsADirectoryError):
        demo.generate(tmp_path / "err", spec, workers=2)
    assert not (tmp_path / "err" / MARKER).exists() and not multiprocessing.active_children()

    # Ctrl-C while the workers draw: the pool is shut down, the interrupt propagates, no folder appears
    def interrupted(root, spec, map_fn):
        def first_then_interrupt(fn, todo):
            yield next(iter(map_fn(fn, todo)))
            raise KeyboardInterrupt
        return layouts.write_layouts(root, spec, map_fn=first_then_interrupt)
    monkeypatch.setattr(cache, "write_layouts", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ensure_demo_data(tmp_path / "demo", spec=spec, workers=2)
    assert not multiprocessing.active_children()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == ["err", "w1", "w2"]


def test_cli_default_root(tmp_path, monkeypatch, capsys):
    from tokenmix import paths
    monkeypatch.setattr(paths, "DEMO_ROOT", tmp_path / "data" / "demo")
    monkeypatch.setattr(cache, "DEFAULT_SPEC", SMALL)
    assert demo.main([]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "data" / "demo") in out and f"{8 * SMALL.cls_train} train" in out
    assert demo.is_complete(tmp_path / "data" / "demo")
    assert ensure_demo_data("") == (tmp_path / "data" / "demo").resolve()  # '' = not given


def test_shapes_have_their_designed_areas():
    # grid-sampled areas of the shape masks in object coordinates against hand-worked values
    t = (np.arange(800) + 0.5) / 400 - 1.0
    u, v = np.meshgrid(t, t)
    cell = (2 / 800) ** 2
    expected = {"disc": np.pi, "square": 1.6 ** 2, "diamond": 2 * 0.62, "ring": np.pi * (1 - 0.55 ** 2),
                "triangle": 3 * np.sqrt(3) / 4, "cross": 2 * (0.64 * 1.9) - 0.64 ** 2, "bar": np.pi * 0.42}
    for shape, area in expected.items():
        got = scenes.shape_mask(shape, u, v).sum() * cell
        assert abs(got - area) < 0.01 * area, (shape, got, area)
    # every class is a different (shape, texture) pair and its own hue
    assert len({(s, t) for _, s, _, t in demo.CLASSES}) == len({s for _, s, _, _ in demo.CLASSES}) == 8
    assert len({t for _, _, _, t in demo.CLASSES}) == 8


def test_learnable_but_not_solved_by_colour(tmp_path):
    """Raw pixels separate the classes well above chance, but not perfectly: colour alone is not enough
    (neighbouring hues overlap), so a feature extractor has something left to learn."""
    spec = DemoSpec(cls_train=20, cls_val=8)
    layouts.write_layouts(tmp_path, spec, kinds=("imagefolder",))

    def load(split):
        xs, ys = [], []
        for c, name in enumerate(CLASS_NAMES):
            for p in sorted((tmp_path / "imagefolder" / split / name).glob("*.png")):
                xs.append(np.array(Image.open(p), dtype=np.float32))
                ys.append(c)
        return torch.tensor(np.stack(xs)), torch.tensor(ys)

    (xt, yt), (xv, yv) = load("train"), load("val")

    def knn(ft, fv, k=10):
        ft, fv = torch.nn.functional.normalize(ft, dim=1), torch.nn.functional.normalize(fv, dim=1)
        s, i = (fv @ ft.T).topk(k, dim=1)
        votes = torch.zeros(len(fv), 8).scatter_add_(1, yt[i], (s / 0.07).exp())
        return (votes.argmax(1) == yv).float().mean().item()

    mean = xt.flatten(1).mean(0)
    raw = knn(xt.flatten(1) - mean, xv.flatten(1) - mean)
    col_t, col_v = xt.mean((1, 2)), xv.mean((1, 2))
    colour = knn(col_t - col_t.mean(0), col_v - col_t.mean(0))
    print(f"raw-pixel k-NN {raw:.3f}, mean-colour k-NN {colour:.3f}")
    assert 0.3 < raw < 0.9, raw  # chance is 0.125
    assert colour < 0.9, colour


def test_demo_voc_classes_are_class_constants_matching_classes_json(small_root):
    from datamodules import build_dataset
    meta = json.loads((small_root / "classes.json").read_text())
    ds = build_dataset("demo_voc", small_root, "val")
    assert "METAINFO" not in vars(ds) and "NUM_CLASSES" not in vars(ds)  # nothing rewritten per instance
    assert list(ds.classes) == meta["seg_classes"] and ds.NUM_CLASSES == len(meta["seg_classes"]) == 9
    assert [list(c) for c in ds.METAINFO["palette"]] == meta["palette"]
    assert ds[0]["mask"].max() < 9 or ds[0]["mask"].max() == IGNORE_INDEX


# --- the one demo-data rule (datamodules.demo.is_demo) ----------------------------------------------------------
IS_DEMO = ["demo", "", None, "  demo ", "DEMO", "demo_cls", "demo_voc", "demo_nyu", "Demo_VOC"]
NOT_DEMO = ["voc", "voc07", "imagenet", "nyuv2", "kitti", "folder", "imagefolder", "custom_seg", "custom_depth",
            "demos", "demo_seg", "demo-voc", "demo_voc2", "my_demo", "demonstration"]


@pytest.mark.parametrize("name", IS_DEMO)
def test_is_demo_accepts_the_demo_request_and_the_generated_datasets(name):
    assert demo.is_demo(name)


@pytest.mark.parametrize("name", NOT_DEMO)
def test_is_demo_is_membership_not_a_prefix(name):
    assert not demo.is_demo(name)


def test_registry_demo_datasets_are_exactly_the_generated_ones():
    from datamodules import DATASETS
    assert {n for n in DATASETS if demo.is_demo(n)} == {"demo_cls", "demo_voc", "demo_nyu"}


def test_demo_data_values_resolve_to_their_demo_dataset(small_root, tmp_path):
    from datamodules import resolve_data
    from datamodules.depth import DepthDataModule
    from datamodules.errors import MissingDataError
    # DATA demo (or '') -> the consumer's own demo dataset; a DATA naming a demo dataset -> that one
    assert resolve_data("demo", small_root, "demo_voc") == ("demo_voc", small_root)
    assert resolve_data("", str(small_root), "demo_nyu") == ("demo_nyu", small_root)
    assert resolve_data("demo_nyu", small_root, "demo_voc") == ("demo_nyu", small_root)
    with pytest.raises(MissingDataError, match="no classes.json"):
        resolve_data("demo_voc", tmp_path, "demo_voc")
    with pytest.raises(MissingDataError, match="needs --data-root"):
        resolve_data("demos", "", "demo_voc")  # not the demo: a real dataset name without its folder
    assert DepthDataModule("demo_nyu", small_root).data == "demo_nyu"
    with pytest.raises(ValueError, match="no depth evaluation settings for 'demo_voc'"):
        DepthDataModule("demo_voc", small_root)  # demo segmentation scenes have no depth
