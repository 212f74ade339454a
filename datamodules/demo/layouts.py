"""Writing the demo scenes in the real on-disk layouts (ImageFolder PNGs, VOC2012, mmseg's NYU), one numpy
Generator per image seeded by (seed, layout, index): the same bytes on every run for a given numpy/Pillow.
``DemoSpec`` sets the sizes and counts; its ``key()`` changes with the generator's source.

``DemoSpec.lazy_p``: the lazy-aggregation knob. Each classification image and VOC scene carries its class's
marker (``scenes.add_marker``) with probability ``lazy_p``, drawn with its position from a Generator of its own
(seed, layout, index, 1), so the scene's own draws are untouched; ``lazy_p = 0`` writes exactly the bytes written
before the knob existed (classes.json included).
"""
from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from xml.sax.saxutils import escape

import numpy as np
from PIL import Image

from ..datasets.palette import voc_palette
from .scenes import (CLASS_NAMES, CLASSES, IGNORE_INDEX, NYU_SCENE, SEG_CLASSES, render_classification, render_depth,
                     render_segmentation)

DEMO_VERSION = 1
# the sources that decide the bytes written: editing either makes existing demo folders stale
_SOURCE_DIGEST = hashlib.sha256(b"".join(Path(__file__).with_name(f).read_bytes()
                                         for f in ("scenes.py", "layouts.py"))).digest()


@dataclass(frozen=True)
class DemoSpec:
    seed: int = 0
    cls_size: int = 64
    cls_train: int = 2000  # per class; with 200 the demo pretraining gained <= 2 k-NN points (docs/pretraining.md)
    cls_val: int = 100  # per class
    voc_size: int = 128
    voc_train: int = 300
    voc_val: int = 100
    nyu_size: tuple[int, int] = (120, 160)  # (H, W), NYU's 4:3
    nyu_train: int = 200
    nyu_test: int = 50
    jpeg_quality: int = 95
    lazy_p: float = 0.0  # share of images with a class-coded background marker (0: off, today's bytes)
    object_contrast: float = 1.0  # weight of the objects over the background (1: today's bytes; scenes.draw_object)

    def __post_init__(self):
        for name in ("lazy_p", "object_contrast"):
            if not 0.0 <= float(getattr(self, name)) <= 1.0:
                raise ValueError(f"DemoSpec.{name} must be in [0, 1], got {getattr(self, name)}")

    def key(self) -> str:
        """Hash of the version, this spec and the generator's own source: any change to how scenes are
        drawn makes an existing folder stale, so nobody trains on data from an older generator."""
        blob = json.dumps({"version": DEMO_VERSION, **asdict(self)}, sort_keys=True).encode()
        return hashlib.sha256(blob + _SOURCE_DIGEST).hexdigest()[:16]


def seg_palette() -> list[list[int]]:
    """RGB of each segmentation class: the VOC colour map's first entries."""
    pal = voc_palette()
    return [pal[3 * i: 3 * i + 3] for i in range(len(SEG_CLASSES))]


def _rng(spec: DemoSpec, layout: int, index: int) -> np.random.Generator:
    return np.random.default_rng([spec.seed, layout, index])


def _cue(spec: DemoSpec, layout: int, index: int) -> float | None:
    """The marker's position draw (u of ``scenes.add_marker``) for this image, or None (no marker): drawn from a
    Generator of its own."""
    if not spec.lazy_p:
        return None
    g = np.random.default_rng([spec.seed, layout, index, 1])
    on, u = g.random() < spec.lazy_p, g.random()
    return float(u) if on else None


def _save_palette_png(arr: np.ndarray, path: Path, palette: list[int]) -> None:
    im = Image.frombytes("P", (arr.shape[1], arr.shape[0]), np.ascontiguousarray(arr, dtype=np.uint8).tobytes())
    im.putpalette(palette)
    im.save(path, optimize=False)


def _voc_xml(name: str, size: int, objects) -> str:
    parts = [f"<annotation>\n  <folder>VOC2012</folder>\n  <filename>{name}.jpg</filename>\n"
             "  <source>\n    <database>tokenmix demo</database>\n  </source>\n"
             f"  <size>\n    <width>{size}</width>\n    <height>{size}</height>\n    <depth>3</depth>\n  </size>\n"
             "  <segmented>1</segmented>\n"]
    for cls, (x0, y0, x1, y1), trunc in objects:
        parts.append(f"  <object>\n    <name>{escape(CLASS_NAMES[cls])}</name>\n    <pose>Unspecified</pose>\n"
                     f"    <truncated>{trunc}</truncated>\n    <difficult>0</difficult>\n"
                     f"    <bndbox>\n      <xmin>{x0}</xmin>\n      <ymin>{y0}</ymin>\n"
                     f"      <xmax>{x1}</xmax>\n      <ymax>{y1}</ymax>\n    </bndbox>\n  </object>\n")
    parts.append("</annotation>\n")
    return "".join(parts)


# One chunk of work: images start..stop-1 of one layout's split (and class). Every image has its own Generator
# (``_rng``) and its own file, so chunks can be written in any order, by any process, with the same bytes.
Chunk = tuple[str, str, int, int, int, int]  # kind, split, layout (the rng stream), class, start, stop
KINDS = ("imagefolder", "voc", "nyu")
_CHUNK_PIXELS = 1 << 20  # ~0.6 s of drawing on one core: ~80 tasks for the default spec, balanced over 16


def _splits(spec: DemoSpec) -> dict[str, tuple]:
    """kind -> ((split, count, layout), ...) and the image size (H, W)."""
    return {"imagefolder": ((("train", spec.cls_train, 1), ("val", spec.cls_val, 2)), (spec.cls_size,) * 2),
            "voc": ((("train", spec.voc_train, 3), ("val", spec.voc_val, 4)), (spec.voc_size,) * 2),
            "nyu": ((("train", spec.nyu_train, 5), ("test", spec.nyu_test, 6)), tuple(spec.nyu_size))}


def chunks(spec: DemoSpec, kinds=KINDS) -> list[Chunk]:
    """Every image of ``kinds``, in chunks of about ``_CHUNK_PIXELS`` pixels."""
    out = []
    for kind in kinds:
        splits, (h, w) = _splits(spec)[kind]
        step = max(1, _CHUNK_PIXELS // (h * w))
        for split, n, layout in splits:
            for c in range(len(CLASS_NAMES)) if kind == "imagefolder" else (0,):
                out += [(kind, split, layout, c, i, min(i + step, n)) for i in range(0, n, step)]
    return out


def pixels(spec: DemoSpec, kinds=KINDS) -> int:
    """How much drawing ``spec`` takes, in pixels: what one process would do serially."""
    total = 0
    for kind in kinds:
        splits, (h, w) = _splits(spec)[kind]
        total += h * w * sum(n for _, n, _ in splits) * (len(CLASS_NAMES) if kind == "imagefolder" else 1)
    return total


def _folders(root: Path, kinds) -> list[Path]:
    out, voc = [], root / "VOCdevkit" / "VOC2012"
    if "imagefolder" in kinds:
        out += [root / "imagefolder" / split / name for split in ("train", "val") for name in CLASS_NAMES]
    if "voc" in kinds:
        out += [voc / k for k in ("JPEGImages", "SegmentationClass", "SegmentationObject", "Annotations",
                                  "ImageSets/Segmentation")]
    if "nyu" in kinds:
        out += [root / "nyu" / k / split for split in ("train", "test") for k in ("images", "annotations")]
    return out


def write_chunk(root: Path, spec: DemoSpec, chunk: Chunk) -> tuple[np.ndarray, int, int, int]:
    """Draw and write one chunk's images (folders already made). Returns what the counts need: VOC pixels per
    class (borders left out), VOC objects, NYU depth min and max (mm)."""
    kind, split, layout, c, start, stop = chunk
    voc, pal, size = root / "VOCdevkit" / "VOC2012", voc_palette(), spec.voc_size
    pixel_counts, n_objects, dmin, dmax = np.zeros(len(SEG_CLASSES), dtype=np.int64), 0, 10**9, 0
    for i in range(start, stop):
        key = c * 100_000 + i if kind == "imagefolder" else i
        rng = _rng(spec, layout, key)
        if kind == "imagefolder":
            name = CLASS_NAMES[c]
            img = render_classification(rng, spec.cls_size, c, _cue(spec, layout, key), spec.object_contrast)
            Image.fromarray(img).save(root / "imagefolder" / split / name / f"{name}_{i:05d}.png")
        elif kind == "voc":
            name = f"demo_{split}_{i:05d}"
            img, label, inst, objects, _ = render_segmentation(rng, size, _cue(spec, layout, key),
                                                               spec.object_contrast)
            Image.fromarray(img).save(voc / "JPEGImages" / f"{name}.jpg", quality=spec.jpeg_quality)
            _save_palette_png(label, voc / "SegmentationClass" / f"{name}.png", pal)
            _save_palette_png(inst, voc / "SegmentationObject" / f"{name}.png", pal)
            (voc / "Annotations" / f"{name}.xml").write_text(_voc_xml(name, size, objects))
            pixel_counts += np.bincount(label[label != IGNORE_INDEX].ravel(), minlength=len(SEG_CLASSES))
            n_objects += len(objects)
        else:
            img, depth = render_depth(rng, *spec.nyu_size)
            name = f"{NYU_SCENE}_{i:05d}"
            nyu = root / "nyu"
            Image.fromarray(img).save(nyu / "images" / split / f"{name}.jpg", quality=spec.jpeg_quality)
            Image.fromarray(depth).save(nyu / "annotations" / split / f"{name}.png")  # uint16 -> 16-bit PNG (I;16)
            dmin, dmax = min(dmin, int(depth.min())), max(dmax, int(depth.max()))
    return pixel_counts, n_objects, dmin, dmax


def write_layouts(root: Path, spec: DemoSpec, kinds=KINDS, map_fn=map) -> dict:
    """Every image of ``kinds`` under ``root``, chunk by chunk through ``map_fn`` (``map``, or a process pool's
    ``map``: the bytes do not depend on it), then VOC's split listings. Returns the counts per kind."""
    root = Path(root)
    for d in _folders(root, kinds):
        d.mkdir(parents=True, exist_ok=True)
    stats = {k: [] for k in kinds}
    todo = chunks(spec, kinds)
    for chunk, result in zip(todo, map_fn(functools.partial(write_chunk, root, spec), todo)):
        stats[chunk[0]].append(result)
    counts = {}
    if "imagefolder" in kinds:
        counts["imagefolder"] = {s: n * len(CLASS_NAMES) for s, n, _ in _splits(spec)["imagefolder"][0]}
    if "voc" in kinds:
        counts["voc"] = _write_voc_sets(root, spec, stats["voc"])
    if "nyu" in kinds:
        counts["nyu"] = {s: n for s, n, _ in _splits(spec)["nyu"][0]}
        counts["nyu"]["depth_mm_range"] = [min([10**9] + [r[2] for r in stats["nyu"]]),
                                           max([0] + [r[3] for r in stats["nyu"]])]
    return counts


def _write_voc_sets(root: Path, spec: DemoSpec, stats: list) -> dict:
    splits = {s: [f"demo_{s}_{i:05d}" for i in range(n)] for s, n, _ in _splits(spec)["voc"][0]}
    sets = root / "VOCdevkit" / "VOC2012" / "ImageSets" / "Segmentation"
    for split in ("train", "val"):
        (sets / f"{split}.txt").write_text("".join(s + "\n" for s in splits[split]))
    (sets / "trainval.txt").write_text("".join(s + "\n" for s in splits["train"] + splits["val"]))
    pixel_counts = sum((r[0] for r in stats), np.zeros(len(SEG_CLASSES), dtype=np.int64))
    return {"train": len(splits["train"]), "val": len(splits["val"]), "objects": sum(r[1] for r in stats),
            "pixels_per_class": {c: int(v) for c, v in zip(SEG_CLASSES, pixel_counts)}}


def metadata(spec: DemoSpec) -> dict:
    """What ``classes.json`` records besides the counts: classes, palette, depth encoding, layouts."""
    default = asdict(DemoSpec())
    spec_fields = {k: v for k, v in asdict(spec).items()  # the knobs off: classes.json as before
                   if k not in ("lazy_p", "object_contrast") or v != default[k]}
    return {
        "version": DEMO_VERSION,
        "spec": spec_fields,
        **({"lazy_aggregation": {"p": spec.lazy_p, "cue": "a marker of the class (scenes.MARKER_RGB) on one free cell of "
                                 "an 8 x 8 grid, with probability p per image; VOC scenes: the class with the most "
                                 "pixels"}}
           if spec.lazy_p else {}),
        "classes": CLASS_NAMES,
        "class_descriptions": {n: {"shape": s, "hue": hue, "texture": t} for n, s, hue, t in CLASSES},
        "seg_classes": SEG_CLASSES,
        "num_classes": {"classification": len(CLASS_NAMES), "segmentation": len(SEG_CLASSES)},
        "ignore_index": IGNORE_INDEX,
        "palette": seg_palette(),
        "depth": {"unit": "mm", "min_m": 0.5, "max_m": 10.0, "png": "16-bit greyscale"},
        "layouts": {"imagefolder": "imagefolder/{train,val}/<class>/*.png",
                    "voc": "VOCdevkit/VOC2012 (JPEGImages, SegmentationClass, SegmentationObject, Annotations, "
                           "ImageSets/Segmentation)",
                    "nyu": "nyu/{images,annotations}/{train,test}/*.{jpg,png}"},
    }
