"""Writing the demo scenes in the real on-disk layouts (ImageFolder PNGs, VOC2012, mmseg's NYU), one numpy
Generator per image seeded by (seed, layout, index): the same bytes on every run for a given numpy/Pillow.
``DemoSpec`` sets the sizes and counts; its ``key()`` changes with the generator's source.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from xml.sax.saxutils import escape

import numpy as np
from PIL import Image

from ..datasets.voc import voc_palette
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


def write_imagefolder(root: Path, spec: DemoSpec) -> dict:
    counts = {}
    for split, n, layout in (("train", spec.cls_train, 1), ("val", spec.cls_val, 2)):
        for c, name in enumerate(CLASS_NAMES):
            d = root / "imagefolder" / split / name
            d.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                img = render_classification(_rng(spec, layout, c * 100_000 + i), spec.cls_size, c)
                Image.fromarray(img).save(d / f"{name}_{i:05d}.png")
        counts[split] = n * len(CLASS_NAMES)
    return counts


def write_voc(root: Path, spec: DemoSpec) -> dict:
    voc = root / "VOCdevkit" / "VOC2012"
    dirs = {k: voc / k for k in ("JPEGImages", "SegmentationClass", "SegmentationObject", "Annotations",
                                 "ImageSets/Segmentation")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    pal = voc_palette()
    splits = {"train": [], "val": []}
    pixel_counts = np.zeros(len(SEG_CLASSES), dtype=np.int64)
    n_objects = 0
    for split, n, layout in (("train", spec.voc_train, 3), ("val", spec.voc_val, 4)):
        for i in range(n):
            name = f"demo_{split}_{i:05d}"
            img, label, inst, objects, _ = render_segmentation(_rng(spec, layout, i), spec.voc_size)
            Image.fromarray(img).save(dirs["JPEGImages"] / f"{name}.jpg", quality=spec.jpeg_quality)
            _save_palette_png(label, dirs["SegmentationClass"] / f"{name}.png", pal)
            _save_palette_png(inst, dirs["SegmentationObject"] / f"{name}.png", pal)
            (dirs["Annotations"] / f"{name}.xml").write_text(_voc_xml(name, spec.voc_size, objects))
            splits[split].append(name)
            pixel_counts += np.bincount(label[label != IGNORE_INDEX].ravel(), minlength=len(SEG_CLASSES))
            n_objects += len(objects)
    sets = dirs["ImageSets/Segmentation"]
    for split in ("train", "val"):
        (sets / f"{split}.txt").write_text("".join(s + "\n" for s in splits[split]))
    (sets / "trainval.txt").write_text("".join(s + "\n" for s in splits["train"] + splits["val"]))
    return {"train": len(splits["train"]), "val": len(splits["val"]), "objects": n_objects,
            "pixels_per_class": {c: int(v) for c, v in zip(SEG_CLASSES, pixel_counts)}}


def write_nyu(root: Path, spec: DemoSpec) -> dict:
    h, w = spec.nyu_size
    counts, dmin, dmax = {}, 10**9, 0
    for split, n, layout in (("train", spec.nyu_train, 5), ("test", spec.nyu_test, 6)):
        di, da = root / "nyu" / "images" / split, root / "nyu" / "annotations" / split
        di.mkdir(parents=True, exist_ok=True)
        da.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            img, depth = render_depth(_rng(spec, layout, i), h, w)
            name = f"{NYU_SCENE}_{i:05d}"
            Image.fromarray(img).save(di / f"{name}.jpg", quality=spec.jpeg_quality)
            Image.fromarray(depth).save(da / f"{name}.png")  # uint16 -> 16-bit greyscale PNG (mode I;16)
            dmin, dmax = min(dmin, int(depth.min())), max(dmax, int(depth.max()))
        counts[split] = n
    counts["depth_mm_range"] = [dmin, dmax]
    return counts


def metadata(spec: DemoSpec) -> dict:
    """What ``classes.json`` records besides the counts: classes, palette, depth encoding, layouts."""
    return {
        "version": DEMO_VERSION,
        "spec": asdict(spec),
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
