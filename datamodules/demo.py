"""Built-in demo data: synthetic scenes generated on first use, deterministic, in seconds, no download.

Objects of 8 classes (each class has its own shape, colour and texture) on cluttered backgrounds drawn by
one clutter process with the same statistics in every image (a per-image background would be the shortcut
DINO learns), written in the real on-disk layouts so the real loaders read them:

    <root>/imagefolder/{train,val}/<class>/*.png             64x64 RGB, one object  (pretraining, k-NN, linear)
    <root>/VOCdevkit/VOC2012/JPEGImages/*.jpg                128x128 multi-object scenes (segmentation, boxes)
                             SegmentationClass/*.png         palette PNG, 0 background, 1..8 classes, 255 borders
                             SegmentationObject/*.png        palette PNG, instance ids, 255 borders
                             Annotations/*.xml               VOC XML, 1-based inclusive pixel boxes
                             ImageSets/Segmentation/{train,val,trainval}.txt
    <root>/nyu/{images,annotations}/{train,test}/*.{jpg,png} 160x120 room scenes, 16-bit depth PNG in mm (0.5..10 m)
    <root>/classes.json                                      class names, palette, counts, layouts
    <root>/.demo_complete.json                               marker, written last (version, spec hash, digest)

``ensure_demo_data()`` generates into a temporary sibling folder and renames it into place, so an
interrupted run never leaves a folder that looks complete. Every image has its own numpy Generator seeded
by (seed, layout, index): same bytes on every run for a given numpy/Pillow.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from xml.sax.saxutils import escape

import numpy as np
from PIL import Image

from tokenmix import paths
from tokenmix.io import atomic_json_dump

from .voc import voc_palette

DEMO_VERSION = 1
MARKER = ".demo_complete.json"
_SOURCE_DIGEST = hashlib.sha256(Path(__file__).read_bytes()).digest()

# name (alphabetical, so ImageFolder's sorted class index == position here), shape, hue, texture
CLASSES: list[tuple[str, str, float, str]] = [
    ("bar", "bar", 0.875, "diagonal"),       # pink
    ("cross", "cross", 0.375, "solid"),      # green
    ("diamond", "diamond", 0.625, "checker"),  # blue
    ("disc", "disc", 0.000, "dots"),          # red
    ("ring", "ring", 0.500, "stripes_v"),     # cyan
    ("square", "square", 0.125, "stripes_h"),  # orange
    ("star", "star", 0.750, "grid"),          # purple
    ("triangle", "triangle", 0.250, "rings"),  # yellow-green
]
# Per-instance colour: class hue +- HUE_JITTER. Neighbouring classes overlap in colour, so colour alone
# does not solve the task (shape and texture are needed): raw-pixel k-NN stays far below 100%.
HUE_JITTER = 0.09
CLUTTER_MAX_SAT = 0.45
CLASS_NAMES = [c[0] for c in CLASSES]
SEG_CLASSES = ["background"] + CLASS_NAMES  # VOC convention: 0 background, 255 ignore
IGNORE_INDEX = 255
NYU_SCENE = "playroom"  # one of mmseg NYUDataset's scene names; file names are <scene>_<5 digits>


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


DEFAULT_SPEC = DemoSpec()




# --------------------------------------------------------------------------------------------------
# Drawing (float RGB images in [0, 1], shape (H, W, 3))
# --------------------------------------------------------------------------------------------------

def hsv_to_rgb(h, s, v):
    """Vectorised HSV -> RGB (numpy arrays or scalars, h in [0, 1))."""
    h = np.asarray(h, dtype=np.float64)
    k = np.stack([(5 + h * 6) % 6, (3 + h * 6) % 6, (1 + h * 6) % 6], -1)
    ramp = np.clip(np.minimum(k, 4 - k), 0, 1)
    v = np.asarray(v, dtype=np.float64)[..., None]
    s = np.asarray(s, dtype=np.float64)[..., None]
    return v - v * s * ramp


def background(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """The shared clutter process: grey-beige base, fine noise, many small desaturated blobs and strokes.

    Same statistics in every image; nothing image-specific at low frequency for DINO to latch on to.
    """
    img = np.empty((h, w, 3))
    img[:] = (0.52, 0.50, 0.47)
    img += rng.normal(0, 0.035, (h, w, 1)) + rng.normal(0, 0.015, (h, w, 3))
    scale = min(h, w) / 64.0
    n = int(round(28 * h * w / 64 ** 2))
    # all random draws first (fixed order), then each item painted in its own small window
    cols = hsv_to_rgb(rng.random(n), rng.uniform(0.0, CLUTTER_MAX_SAT, n), rng.uniform(0.3, 0.8, n))
    cy, cx = rng.uniform(0, h, n), rng.uniform(0, w, n)
    blob = rng.random(n) < 0.5
    r = rng.uniform(1.0, 3.5, n) * scale
    t = rng.uniform(0, np.pi, n)
    length, width = rng.uniform(3, 9, n) * scale, rng.uniform(0.5, 1.3, n) * scale
    ct, st = np.cos(t), np.sin(t)
    ext = np.where(blob, r, (length + width) / 2)
    y0 = np.clip(np.floor(cy - ext), 0, h).astype(int)
    y1 = np.clip(np.ceil(cy + ext) + 1, 0, h).astype(int)
    x0 = np.clip(np.floor(cx - ext), 0, w).astype(int)
    x1 = np.clip(np.ceil(cx + ext) + 1, 0, w).astype(int)
    ys, xs = np.arange(h, dtype=float), np.arange(w, dtype=float)
    for k in range(n):
        if y0[k] >= y1[k] or x0[k] >= x1[k]:
            continue
        dy = (ys[y0[k]:y1[k]] - cy[k])[:, None]
        dx = (xs[x0[k]:x1[k]] - cx[k])[None, :]
        if blob[k]:
            m = dx * dx + dy * dy <= r[k] * r[k]
        else:
            m = (np.abs(dx * ct[k] + dy * st[k]) <= length[k] / 2) & (np.abs(dy * ct[k] - dx * st[k]) <= width[k] / 2)
        img[y0[k]:y1[k], x0[k]:x1[k]][m] = cols[k]
    return img


def shape_mask(shape: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Inside test in object coordinates (the object spans about [-1, 1]^2)."""
    rho = np.hypot(u, v)
    if shape == "disc":
        return rho <= 1
    if shape == "square":
        return np.maximum(np.abs(u), np.abs(v)) <= 0.8
    if shape == "triangle":  # equilateral, circumradius 1
        return (v <= 0.5) & (-0.866 * u - 0.5 * v <= 0.5) & (0.866 * u - 0.5 * v <= 0.5)
    if shape == "cross":
        return ((np.abs(u) <= 0.32) & (np.abs(v) <= 0.95)) | ((np.abs(v) <= 0.32) & (np.abs(u) <= 0.95))
    if shape == "ring":
        return (rho <= 1) & (rho >= 0.55)
    if shape == "diamond":
        return np.abs(u) + np.abs(v) / 0.62 <= 1  # a rhombus, so it is not a rotated square
    if shape == "star":  # five lobes
        return rho <= 0.62 + 0.36 * np.cos(5 * np.arctan2(v, u))
    if shape == "bar":
        return (u / 1.0) ** 2 + (v / 0.42) ** 2 <= 1
    raise ValueError(f"unknown demo shape {shape!r}")


def texture(kind: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """1 where the pattern darkens the object, 0 elsewhere (object coordinates, ~4 periods across)."""
    f = 2.2  # periods per unit
    if kind == "solid":
        return np.zeros_like(u)
    if kind == "stripes_h":
        return (np.floor(v * f * 2) % 2).astype(float)
    if kind == "stripes_v":
        return (np.floor(u * f * 2) % 2).astype(float)
    if kind == "diagonal":
        return (np.floor((u + v) * f * 1.5) % 2).astype(float)
    if kind == "checker":
        return ((np.floor(u * f * 1.5) + np.floor(v * f * 1.5)) % 2).astype(float)
    if kind == "dots":
        pu, pv = (u * f) % 1 - 0.5, (v * f) % 1 - 0.5
        return (pu ** 2 + pv ** 2 <= 0.09).astype(float)
    if kind == "grid":
        pu, pv = (u * f) % 1, (v * f) % 1
        return ((pu < 0.25) | (pv < 0.25)).astype(float)
    if kind == "rings":
        return (np.floor(np.hypot(u, v) * f * 2.5) % 2).astype(float)
    raise ValueError(f"unknown demo texture {kind!r}")


def draw_object(img: np.ndarray, rng: np.random.Generator, cls: int, cx: float, cy: float, radius: float,
                angle: float | None = None) -> np.ndarray:
    """Paint one object of class ``cls`` in place; return its (full-size) boolean mask."""
    _, shape, hue, tex = CLASSES[cls]
    h, w = img.shape[:2]
    if angle is None:
        angle = rng.uniform(0, 2 * np.pi)
    # colour of this instance: class hue with a small jitter, strong saturation
    base = hsv_to_rgb((hue + rng.uniform(-HUE_JITTER, HUE_JITTER)) % 1.0, rng.uniform(0.5, 0.95),
                      rng.uniform(0.6, 0.95))
    mask = np.zeros((h, w), dtype=bool)
    y0, y1 = max(0, int(cy - radius) - 1), min(h, int(np.ceil(cy + radius)) + 2)
    x0, x1 = max(0, int(cx - radius) - 1), min(w, int(np.ceil(cx + radius)) + 2)
    if y0 >= y1 or x0 >= x1:
        return mask
    yy, xx = np.mgrid[y0:y1, x0:x1] + 0.5
    dx, dy = (xx - cx) / radius, (yy - cy) / radius
    ca, sa = np.cos(angle), np.sin(angle)
    u, v = dx * ca + dy * sa, -dx * sa + dy * ca
    m = shape_mask(shape, u, v)
    shade = 1.0 - 0.5 * texture(tex, u, v)
    light = 1.0 + 0.12 * (u * 0.6 - v * 0.8)  # soft directional light, the same for every class
    patch = base * (shade * light)[..., None] + rng.normal(0, 0.02, m.shape + (3,))
    img[y0:y1, x0:x1][m] = patch[m]
    mask[y0:y1, x0:x1] = m
    return mask


def to_uint8(img: np.ndarray) -> np.ndarray:
    return (np.clip(img, 0, 1) * 255 + 0.5).astype(np.uint8)


def render_classification(rng: np.random.Generator, size: int, cls: int) -> np.ndarray:
    """One object of class ``cls``, random pose, on the shared background."""
    img = background(rng, size, size)
    r = rng.uniform(0.2, 0.34) * size
    cx, cy = rng.uniform(0.75 * r, size - 0.75 * r), rng.uniform(0.75 * r, size - 0.75 * r)
    draw_object(img, rng, cls, cx, cy, r)
    return to_uint8(img)


def label_borders(label: np.ndarray) -> np.ndarray:
    """Pixels whose 3x3 neighbourhood holds another label (VOC marks object contours as void)."""
    p = np.pad(label, 1, mode="edge")
    h, w = label.shape
    border = np.zeros_like(label, dtype=bool)
    for dy in (0, 1, 2):
        for dx in (0, 1, 2):
            border |= p[dy:dy + h, dx:dx + w] != label
    return border


def voc_box(mask: np.ndarray) -> tuple[int, int, int, int]:
    """Tight box of a boolean mask in VOC convention: (xmin, ymin, xmax, ymax), 1-based, inclusive."""
    ys, xs = np.nonzero(mask)
    return int(xs.min()) + 1, int(ys.min()) + 1, int(xs.max()) + 1, int(ys.max()) + 1


def render_segmentation(rng: np.random.Generator, size: int):
    """Multi-object scene -> (image uint8, class label, instance label, objects [(cls, box, truncated)], instances).

    ``instances``: instance ids before the void border was cut (the boxes are taken from it).
    """
    img = background(rng, size, size)
    n = int(rng.choice([1, 2, 3, 4], p=[0.25, 0.35, 0.25, 0.15]))
    inst = np.zeros((size, size), dtype=np.int32)
    classes = []
    for k in range(n):
        cls = int(rng.integers(len(CLASSES)))
        r = rng.uniform(0.12, 0.26) * size
        cx, cy = rng.uniform(0.5 * r, size - 0.5 * r), rng.uniform(0.5 * r, size - 0.5 * r)
        m = draw_object(img, rng, cls, cx, cy, r)
        inst[m] = k + 1  # later objects occlude earlier ones
        classes.append(cls)
    label = np.zeros((size, size), dtype=np.uint8)
    objects, kept = [], np.zeros_like(inst)
    for k, cls in enumerate(classes):
        m = inst == k + 1
        if m.sum() < 12:  # (almost) hidden: leave it to the background class
            continue
        label[m] = cls + 1
        kept[m] = len(objects) + 1
        box = voc_box(m)
        truncated = int(box[0] == 1 or box[1] == 1 or box[2] == size or box[3] == size)
        objects.append((cls, box, truncated))
    border = label_borders(kept)
    label[border] = IGNORE_INDEX
    inst_label = kept.astype(np.uint8)
    inst_label[border] = IGNORE_INDEX
    return to_uint8(img), label, inst_label, objects, kept


def render_depth(rng: np.random.Generator, h: int, w: int):
    """Room scene: back wall, tiled floor in perspective, objects standing on the floor.

    Returns (image uint8 (h, w, 3), depth in millimetres uint16 (h, w)), depth within 0.5..10 m.
    Cues a probe can learn: floor row -> depth, tile size, object size and foot row.
    """
    cam_h = 1.2  # camera height (m)
    horizon = rng.uniform(0.32, 0.48) * h
    z_bottom = rng.uniform(0.8, 1.1)  # depth of the floor at the bottom row (m)
    f = z_bottom * (h - horizon) / cam_h  # focal length (px) that puts that floor point on the last row
    z_wall = rng.uniform(5.5, 9.5)
    yy, xx = np.mgrid[0:h, 0:w] + 0.5
    with np.errstate(divide="ignore"):
        z_floor = np.where(yy > horizon, f * cam_h / np.maximum(yy - horizon, 1e-6), np.inf)
    depth = np.minimum(z_floor, z_wall)
    img = background(rng, h, w)  # the wall
    floor = z_floor < z_wall
    # floor tiles in world coordinates: their image size shrinks with distance
    zf = np.where(floor, z_floor, 1.0)  # finite everywhere (only floor pixels are used)
    X = (xx - w / 2) * zf / f
    tile = rng.uniform(0.4, 0.6)
    tiles = (np.floor(X / tile) + np.floor(zf / tile)) % 2
    floor_col = hsv_to_rgb(rng.uniform(0.05, 0.12), rng.uniform(0.15, 0.35), 0.55)
    floor_img = floor_col * (0.8 + 0.25 * tiles)[..., None] + rng.normal(0, 0.02, (h, w, 3))
    img[floor] = floor_img[floor]
    # objects far to near (painter's order)
    n = int(rng.integers(1, 5))
    zs = np.sort(rng.uniform(1.0, min(4.5, z_wall - 0.5), n))[::-1]
    for z in zs:
        size_m = rng.uniform(0.3, 0.6)
        r = f * size_m / z
        foot = horizon + f * cam_h / z
        cx, cy = rng.uniform(0, w), foot - r
        m = draw_object(img, rng, int(rng.integers(len(CLASSES))), cx, cy, r, angle=rng.uniform(-0.4, 0.4))
        # the object bulges towards the camera in its middle
        rho2 = np.clip(((xx - cx) ** 2 + (yy - cy) ** 2) / (r * r), 0, 1)
        depth = np.where(m, z - 0.5 * size_m * (1 - rho2), depth)
    depth_mm = np.clip(np.round(depth * 1000), 500, 10000).astype(np.uint16)
    return to_uint8(img), depth_mm


# --------------------------------------------------------------------------------------------------
# Writers
# --------------------------------------------------------------------------------------------------

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


def _digest(root: Path) -> tuple[str, int]:
    """sha256 over (relative path, bytes) of every file but the marker, in sorted order."""
    hsh, n = hashlib.sha256(), 0
    for p in sorted(q for q in root.rglob("*") if q.is_file() and q.name != MARKER):
        hsh.update(p.relative_to(root).as_posix().encode() + b"\0")
        hsh.update(p.read_bytes())
        n += 1
    return hsh.hexdigest(), n


def generate(root: Path, spec: DemoSpec | None = None) -> dict:
    """Write every layout under ``root`` (an empty or new folder) and the marker last; returns the metadata."""
    spec = spec or DEFAULT_SPEC
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    meta = {
        "version": DEMO_VERSION,
        "spec": asdict(spec),
        "classes": CLASS_NAMES,
        "class_descriptions": {n: {"shape": s, "hue": hue, "texture": t} for n, s, hue, t in CLASSES},
        "seg_classes": SEG_CLASSES,
        "num_classes": {"classification": len(CLASS_NAMES), "segmentation": len(SEG_CLASSES)},
        "ignore_index": IGNORE_INDEX,
        "palette": [voc_palette()[3 * i: 3 * i + 3] for i in range(len(SEG_CLASSES))],
        "depth": {"unit": "mm", "min_m": 0.5, "max_m": 10.0, "png": "16-bit greyscale"},
        "layouts": {"imagefolder": "imagefolder/{train,val}/<class>/*.png",
                    "voc": "VOCdevkit/VOC2012 (JPEGImages, SegmentationClass, SegmentationObject, Annotations, "
                           "ImageSets/Segmentation)",
                    "nyu": "nyu/{images,annotations}/{train,test}/*.{jpg,png}"},
    }
    meta["counts"] = {"imagefolder": write_imagefolder(root, spec), "voc": write_voc(root, spec),
                      "nyu": write_nyu(root, spec)}
    atomic_json_dump(meta, root / "classes.json")
    digest, n_files = _digest(root)
    marker = {"version": DEMO_VERSION, "spec_key": spec.key(), "files": n_files, "sha256": digest,
              "seconds": round(time.perf_counter() - t0, 2)}
    atomic_json_dump(marker, root / MARKER)  # last: its presence means the folder is complete
    return meta


def is_complete(root: Path, spec: DemoSpec | None = None) -> bool:
    """Marker present, same version and spec, and the file count still matches (nothing deleted)."""
    spec = spec or DEFAULT_SPEC
    try:
        marker = json.loads((Path(root) / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if marker.get("version") != DEMO_VERSION or marker.get("spec_key") != spec.key():
        return False
    n = sum(len(files) for _, _, files in os.walk(root)) - 1
    return n == marker.get("files")


@contextlib.contextmanager
def _lock(root: Path):
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # another process generating the same folder: wait for it
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_demo_data(root: str | os.PathLike | None = None, force: bool = False,
                     spec: DemoSpec | None = None) -> Path:
    """The demo data folder, generated on first use (or again with ``force`` / when incomplete or stale).

    ``root``: default ``tokenmix.paths.DEMO_ROOT`` (data/demo, env TOKENMIX_DEMO_ROOT); '' counts as not given.
    """
    spec = spec or DEFAULT_SPEC
    root = Path(root) if root not in (None, "") else paths.DEMO_ROOT
    root = root.resolve()
    if not force and is_complete(root, spec):
        return root
    with _lock(root):
        if not force and is_complete(root, spec):  # generated meanwhile by another process
            return root
        tmp = root.parent / f".{root.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            generate(tmp, spec)
            if root.exists():
                old = root.parent / f".{root.name}.old-{os.getpid()}"
                os.rename(root, old)
                os.rename(tmp, root)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(tmp, root)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def summary(root: Path) -> str:
    meta = json.loads((root / "classes.json").read_text())
    marker = json.loads((root / MARKER).read_text())
    c = meta["counts"]
    return "\n".join([
        f"demo data at {root} (version {marker['version']}, {marker['files']} files, "
        f"sha256 {marker['sha256'][:12]}, generated in {marker['seconds']} s)",
        f"  imagefolder/: {c['imagefolder']['train']} train + {c['imagefolder']['val']} val, "
        f"{len(meta['classes'])} classes: {', '.join(meta['classes'])}",
        f"  VOCdevkit/VOC2012/: {c['voc']['train']} train + {c['voc']['val']} val scenes, {c['voc']['objects']} "
        f"objects, {meta['num_classes']['segmentation']} classes (0 background, {IGNORE_INDEX} borders)",
        f"  nyu/: {c['nyu']['train']} train + {c['nyu']['test']} test, depth mm range {c['nyu']['depth_mm_range']}",
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m datamodules.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="", help=f"output folder (default {paths.DEMO_ROOT}, env TOKENMIX_DEMO_ROOT)")
    ap.add_argument("--force", action="store_true", help="regenerate even if complete")
    args = ap.parse_args(argv)
    t = time.perf_counter()
    root = ensure_demo_data(args.root or None, force=args.force)
    print(summary(root))
    print(f"  ready in {time.perf_counter() - t:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
