"""The demo generator's lazy-aggregation knob (DemoSpec.lazy_p): at p = 1 one background patch carries the class's
marker (found by a hand-written detector with the marker colours written out here, not the generator's code), at
p = 0 none does and nothing about the folder says the knob exists; the object pixels never change; the cue-conflict
scenes pair every class with every other; the object-contrast knob blends by hand-worked weights; the knob's
exposures (environment, CLI, DataModule) refuse to overwrite data/demo."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from datamodules.demo import CLASS_NAMES, DemoSpec, cache, layouts, scenes

pytestmark = pytest.mark.timeout(120)

SPEC = dict(cls_train=4, cls_val=1, voc_train=2, voc_val=2, nyu_train=1, nyu_test=1)
# the designed marker colour of each class (RGB 0/255), written out here
COLOURS = [(0, 255, 0), (255, 0, 255), (255, 255, 0), (0, 255, 255), (255, 0, 0), (0, 0, 255), (255, 255, 255),
           (0, 0, 0)]


def _marker_class(img: np.ndarray) -> int | None:
    """The class whose colour fills one whole cell of the 8 x 8 grid exactly, or None."""
    h, w, _ = img.shape
    ch, cw = h // 8, w // 8
    for r in range(8):
        for c in range(8):
            cell = img[r * ch:(r + 1) * ch, c * cw:(c + 1) * cw].reshape(-1, 3)
            for k, col in enumerate(COLOURS):
                if (np.abs(cell.astype(int) - col) <= 2).all():
                    return k
    return None


def _accuracy(root: Path) -> float:
    hits = [_marker_class(np.asarray(Image.open(p))) == c for c, name in enumerate(CLASS_NAMES)
            for p in sorted((root / "imagefolder" / "train" / name).glob("*.png"))]
    return sum(hits) / len(hits)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("lazy")
    return {p: cache.ensure_demo_data(base / f"p{p}", spec=DemoSpec(lazy_p=p, **SPEC), workers=1) for p in (0.0, 1.0)}


def test_marker_predicts_the_class_only_with_the_knob(folders):
    assert _accuracy(folders[1.0]) == 1.0  # 32 images, chance 1/8
    assert _accuracy(folders[0.0]) == 0.0  # no cell is one marker colour
    meta0, meta1 = (json.loads((folders[p] / "classes.json").read_text()) for p in (0.0, 1.0))
    assert "lazy_p" not in meta0["spec"] and "object_contrast" not in meta0["spec"] and "lazy_aggregation" not in meta0
    assert meta1["spec"]["lazy_p"] == 1.0 and meta1["lazy_aggregation"]["p"] == 1.0
    assert DemoSpec(lazy_p=1.0, **SPEC).key() != DemoSpec(**SPEC).key()
    # the same scenes otherwise: same files, and the VOC labels (the objects) unchanged
    voc = "VOCdevkit/VOC2012/SegmentationClass"
    for f in sorted((folders[0.0] / voc).glob("*.png")):
        assert (folders[1.0] / voc / f.name).read_bytes() == f.read_bytes()


def test_marker_cell_by_hand_and_object_pixels_untouched():
    img = np.full((64, 64, 3), 0.5)
    objects = np.zeros((64, 64), bool)
    objects[0:9, :] = True  # rows 0-8: grid rows 0 and 1 are taken (row 1 by pixel row 8)
    objects[16:64, 8:64] = True  # from grid row 2 on only column 0 is free: cells 16, 24, ..., 56 (6 cells)
    out = img.copy()
    box = scenes.add_marker(out, 5, 0.5, objects)  # floor(0.5 * 6) = the 4th free cell: grid (5, 0)
    assert box == (0, 40, 8, 48)
    assert (out[40:48, 0:8] == (0, 0, 1)).all() and (out[objects] == 0.5).all()
    assert np.count_nonzero((out != img).any(2)) == 64
    assert scenes.add_marker(img.copy(), 0, 0.3, np.ones((64, 64), bool)) is None  # no free cell
    # p = 0: no marker for any image (no draw), so each image's own Generator stream is untouched
    assert all(layouts._cue(DemoSpec(), layout, i) is None for layout in (1, 3) for i in range(50))
    share = np.mean([layouts._cue(DemoSpec(lazy_p=0.3), 1, i) is not None for i in range(2000)])
    assert 0.26 < share < 0.34


def test_cue_conflict_pairs_every_class_with_every_other():
    pairs = []
    for i in range(56):
        img, c, c2, mask, box = scenes.cue_conflict(0, i)
        assert c != c2 and _marker_class(img) == c2 and not mask[box[1]:box[3], box[0]:box[2]].any()
        pairs.append((c, c2))
    assert sorted(pairs) == [(a, b) for a in range(8) for b in range(8) if a != b]


def test_object_contrast_blends_by_its_weight():
    base = np.full((32, 32, 3), 0.2)
    full, half = base.copy(), base.copy()
    m1 = scenes.draw_object(full, np.random.default_rng(4), 3, 16, 16, 10)
    m2 = scenes.draw_object(half, np.random.default_rng(4), 3, 16, 16, 10, contrast=0.5)
    assert (m1 == m2).all() and m1.any()
    np.testing.assert_allclose(half[m1], 0.5 * full[m1] + 0.5 * 0.2)
    assert (half[~m1] == 0.2).all()
    with pytest.raises(ValueError, match="object_contrast"):
        DemoSpec(object_contrast=1.5)


def test_environment_knob_needs_its_own_folder(monkeypatch, tmp_path):
    monkeypatch.setenv(cache.LAZY_ENV, "1")
    assert cache.lazy_p_from_env() == 1.0
    monkeypatch.delenv("TOKENMIX_DEMO_ROOT", raising=False)
    with pytest.raises(ValueError, match="TOKENMIX_DEMO_ROOT=data/demo_lazy1"):
        cache.ensure_demo_data(spec=DemoSpec(lazy_p=1.0, **SPEC))
    with pytest.raises(ValueError, match="folder of its own"):
        cache.ensure_demo_data(spec=DemoSpec(object_contrast=0.5, **SPEC))
    for bad in ("2", "x", "-0.5"):
        monkeypatch.setenv(cache.LAZY_ENV, bad)
        with pytest.raises(ValueError, match=cache.LAZY_ENV):
            cache.lazy_p_from_env()
    with pytest.raises(ValueError, match="lazy_p"):
        DemoSpec(lazy_p=1.5)


def test_cli_and_datamodule_flags_reach_the_spec(monkeypatch, tmp_path):
    import datamodules.demo as demo_pkg
    from datamodules.supervised import SupervisedDataModule
    seen = []
    monkeypatch.setattr(demo_pkg, "ensure_demo_data", lambda root=None, spec=None, **kw: seen.append((root, spec)))
    monkeypatch.setattr("datamodules.build_dataset", lambda *a, **kw: [])
    SupervisedDataModule(data="demo", data_root=str(tmp_path), demo_lazy=0.5).setup()
    assert seen[0] == (str(tmp_path), DemoSpec(lazy_p=0.5)) and len(seen) == 2  # train and val
    monkeypatch.setattr(cache, "ensure_demo_data", lambda root=None, spec=None, **kw: seen.append((root, spec)))
    monkeypatch.setattr(cache, "summary", lambda root: "")
    cache.main(["--root", str(tmp_path), "--lazy", "1", "--object-contrast", "0.4"])
    assert seen[-1] == (str(tmp_path), DemoSpec(lazy_p=1.0, object_contrast=0.4))
    with pytest.raises(SystemExit):
        cache.main(["--lazy", "2"])
