"""The demo generator's lazy-aggregation knob (DemoSpec.lazy_p): at p = 1 the background alone predicts the class
(a grating read by a hand-written Fourier classifier, not the generator's code), at p = 0 it does not and nothing
about the folder says the knob exists; the object pixels never change; the environment exposure refuses to
overwrite data/demo."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from datamodules.demo import CLASS_NAMES, DemoSpec, cache, layouts, scenes

pytestmark = pytest.mark.timeout(120)

SPEC = dict(cls_train=4, cls_val=1, voc_train=2, voc_val=2, nyu_train=1, nyu_test=1)
# the designed cue of each class, written out here: (orientation in degrees, period in px at 64 px)
GRATINGS = [(0, 5), (45, 5), (90, 5), (135, 5), (0, 10), (45, 10), (90, 10), (135, 10)]


def _cue_class(img: np.ndarray) -> int:
    """The class whose grating carries most power in the image's brightness (a 2-D Fourier coefficient each)."""
    grey = img.astype(float).mean(2)
    grey -= grey.mean()
    h, w = grey.shape
    yy, xx = np.mgrid[0:h, 0:w] + 0.5
    power = []
    for angle, period in GRATINGS:
        t, per = np.deg2rad(angle), period * min(h, w) / 64
        power.append(abs((grey * np.exp(-2j * np.pi * (xx * np.cos(t) + yy * np.sin(t)) / per)).sum()))
    return int(np.argmax(power))


def _accuracy(root: Path) -> float:
    hits = [_cue_class(np.asarray(Image.open(p))) == c for c, name in enumerate(CLASS_NAMES)
            for p in sorted((root / "imagefolder" / "train" / name).glob("*.png"))]
    return sum(hits) / len(hits)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("lazy")
    return {p: cache.ensure_demo_data(base / f"p{p}", spec=DemoSpec(lazy_p=p, **SPEC), workers=1) for p in (0.0, 1.0)}


def test_background_predicts_the_class_only_with_the_knob(folders):
    assert _accuracy(folders[1.0]) >= 0.9  # 32 images, chance 1/8
    assert _accuracy(folders[0.0]) <= 0.4
    meta0, meta1 = (json.loads((folders[p] / "classes.json").read_text()) for p in (0.0, 1.0))
    assert "lazy_p" not in meta0["spec"] and "lazy_aggregation" not in meta0  # off: classes.json as before the knob
    assert meta1["spec"]["lazy_p"] == 1.0 and meta1["lazy_aggregation"]["p"] == 1.0
    assert DemoSpec(lazy_p=1.0, **SPEC).key() != DemoSpec(**SPEC).key()
    # the same scenes otherwise: same files, and the VOC labels (the objects) unchanged
    voc = "VOCdevkit/VOC2012/SegmentationClass"
    for f in sorted((folders[0.0] / voc).glob("*.png")):
        assert (folders[1.0] / voc / f.name).read_bytes() == f.read_bytes()


def test_cue_leaves_object_pixels_and_draws_nothing():
    rng = np.random.default_rng(0)
    img = rng.uniform(0.2, 0.8, (64, 64, 3))
    mask = np.zeros((64, 64), bool)
    mask[20:40, 10:30] = True
    out = img.copy()
    scenes.add_background_cue(out, 3, 0.7, mask)
    assert np.array_equal(out[mask], img[mask]) and not np.allclose(out[~mask], img[~mask])
    # p = 0: no cue for any image (no draw), so each image's own Generator stream is untouched
    assert all(layouts._cue(DemoSpec(), layout, i) is None for layout in (1, 3) for i in range(50))
    share = np.mean([layouts._cue(DemoSpec(lazy_p=0.3), 1, i) is not None for i in range(2000)])
    assert 0.26 < share < 0.34


def test_environment_knob_needs_its_own_folder(monkeypatch, tmp_path):
    monkeypatch.setenv(cache.LAZY_ENV, "1")
    assert cache.lazy_p_from_env() == 1.0
    monkeypatch.delenv("TOKENMIX_DEMO_ROOT", raising=False)
    with pytest.raises(ValueError, match="TOKENMIX_DEMO_ROOT=data/demo_lazy1"):
        cache.ensure_demo_data(spec=DemoSpec(lazy_p=1.0, **SPEC))
    for bad in ("2", "x", "-0.5"):
        monkeypatch.setenv(cache.LAZY_ENV, bad)
        with pytest.raises(ValueError, match=cache.LAZY_ENV):
            cache.lazy_p_from_env()
    with pytest.raises(ValueError, match="lazy_p"):
        DemoSpec(lazy_p=1.5)
