"""Drawing the demo scenes: the class table and float RGB images in [0, 1] of shape (H, W, 3), from a numpy
Generator. Objects of 8 classes (each its own shape, colour and texture) on cluttered backgrounds drawn by one
clutter process with the same statistics in every image (a per-image background would be the shortcut DINO
learns). ``render_classification`` / ``render_segmentation`` / ``render_depth`` give one sample of each layout.

The lazy-aggregation knob (``cue``, off by default): one background patch carries a class-coded marker
(``add_marker``: a square of the class's ``MARKER_RGB`` on one cell of an 8 x 8 grid, one patch of the demo ViT), so
a single background token predicts the class while the object still defines it (LaSt-ViT's shortcut).
``layouts.DemoSpec.lazy_p`` decides which images get it; off, the bytes are today's. ``cue_conflict`` draws the
evaluation scenes where marker and object disagree.
"""
from __future__ import annotations

import numpy as np

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
# lazy-aggregation marker of each class: a saturated RGB corner colour, far from the class's own hue (so colour
# does not tie marker and object), uniform, on one cell of a MARKER_GRID x MARKER_GRID grid of the image
MARKER_RGB = [(0, 1, 0), (1, 0, 1), (1, 1, 0), (0, 1, 1), (1, 0, 0), (0, 0, 1), (1, 1, 1), (0, 0, 0)]
MARKER_GRID = 8  # 64 px / 8: one patch of vit_demo_patch8
CONFLICT_LAYOUT = 7  # the Generator stream of the cue-conflict scenes (layouts use 1..6)


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
    # each item's mask in its own window, all items at once (windows padded to the largest); a pixel takes the
    # colour of the last item covering it, as painting them in order would (same float operations per pixel)
    wy, wx = int((y1 - y0).max(initial=0)), int((x1 - x0).max(initial=0))
    yy, xx = y0[:, None] + np.arange(wy), x0[:, None] + np.arange(wx)  # (n, wy), (n, wx) pixel rows / columns
    dy = (yy.astype(float) - cy[:, None])[:, :, None]
    dx = (xx.astype(float) - cx[:, None])[:, None, :]
    b = blob[:, None, None]
    disc = dx * dx + dy * dy <= (r * r)[:, None, None]
    ct, st = ct[:, None, None], st[:, None, None]
    stroke = ((np.abs(dx * ct + dy * st) <= (length / 2)[:, None, None])
              & (np.abs(dy * ct - dx * st) <= (width / 2)[:, None, None]))
    inside = np.where(b, disc, stroke) & (yy < y1[:, None])[:, :, None] & (xx < x1[:, None])[:, None, :]
    k, i, j = np.nonzero(inside)
    owner = np.full(h * w, -1)
    np.maximum.at(owner, yy[k, i] * w + xx[k, j], k)
    painted = owner >= 0
    img.reshape(-1, 3)[painted] = cols[owner[painted]]
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
                angle: float | None = None, contrast: float = 1.0) -> np.ndarray:
    """Paint one object of class ``cls`` in place; return its (full-size) boolean mask. ``contrast`` < 1: the
    object is blended over the background with that weight (a fainter object; 1 paints it as it is)."""
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
    win = img[y0:y1, x0:x1]
    win[m] = patch[m] if contrast == 1.0 else contrast * patch[m] + (1.0 - contrast) * win[m]
    mask[y0:y1, x0:x1] = m
    return mask


def to_uint8(img: np.ndarray) -> np.ndarray:
    return (np.clip(img, 0, 1) * 255 + 0.5).astype(np.uint8)


def add_marker(img: np.ndarray, cls: int, u: float, objects: np.ndarray) -> tuple[int, int, int, int] | None:
    """Paint class ``cls``'s marker (``MARKER_RGB``) in place on grid cell number floor(u * n) of the n cells that no
    pixel of ``objects`` touches (row-major), u in [0, 1); returns its pixel box (x0, y0, x1, y1), end exclusive,
    or None when every cell holds an object. Draws nothing from any Generator."""
    g = MARKER_GRID
    ch, cw = img.shape[0] // g, img.shape[1] // g
    free = np.flatnonzero(~objects[:ch * g, :cw * g].reshape(g, ch, g, cw).any(axis=(1, 3)))
    if not free.size:
        return None
    r, c = divmod(int(free[int(u * free.size)]), g)
    img[r * ch:(r + 1) * ch, c * cw:(c + 1) * cw] = MARKER_RGB[cls]
    return c * cw, r * ch, (c + 1) * cw, (r + 1) * ch


def classification_scene(rng: np.random.Generator, size: int, cls: int, cue: float | None = None,
                         marker_cls: int | None = None, contrast: float = 1.0):
    """One object of class ``cls``, random pose, on the shared background -> (image uint8, object mask, marker
    box or None). ``cue`` (u of ``add_marker``): a marker of ``marker_cls`` (default ``cls``) on a free cell;
    ``contrast``: the object's (``draw_object``)."""
    img = background(rng, size, size)
    r = rng.uniform(0.2, 0.34) * size
    cx, cy = rng.uniform(0.75 * r, size - 0.75 * r), rng.uniform(0.75 * r, size - 0.75 * r)
    mask = draw_object(img, rng, cls, cx, cy, r, contrast=contrast)
    box = None if cue is None else add_marker(img, cls if marker_cls is None else marker_cls, cue, mask)
    return to_uint8(img), mask, box


def render_classification(rng: np.random.Generator, size: int, cls: int, cue: float | None = None,
                          contrast: float = 1.0) -> np.ndarray:
    """``classification_scene``'s image."""
    return classification_scene(rng, size, cls, cue, contrast=contrast)[0]


def cue_conflict(seed: int, index: int, size: int = 64, contrast: float = 1.0):
    """Cue-conflict scene ``index``: an object of class c = index % 8 (``contrast``: its, ``draw_object``) with the
    marker of class c' = c + 1 + (index // 8) % 7 (mod 8, never c), each class pair equally often -> (image uint8,
    c, c', object mask, marker box)."""
    rng = np.random.default_rng([seed, CONFLICT_LAYOUT, index])
    n = len(CLASSES)
    c, c2 = index % n, (index % n + 1 + (index // n) % (n - 1)) % n
    img, mask, box = classification_scene(rng, size, c, float(rng.random()), c2, contrast)
    return img, c, c2, mask, box


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


def render_segmentation(rng: np.random.Generator, size: int, cue: float | None = None, contrast: float = 1.0):
    """Multi-object scene -> (image uint8, class label, instance label, objects [(cls, box, truncated)], instances).

    ``instances``: instance ids before the void border was cut (the boxes are taken from it). ``cue`` (u of
    ``add_marker``): the marker of the class with the most pixels on a free cell.
    """
    img = background(rng, size, size)
    n = int(rng.choice([1, 2, 3, 4], p=[0.25, 0.35, 0.25, 0.15]))
    inst = np.zeros((size, size), dtype=np.int32)
    classes = []
    for k in range(n):
        cls = int(rng.integers(len(CLASSES)))
        r = rng.uniform(0.12, 0.26) * size
        cx, cy = rng.uniform(0.5 * r, size - 0.5 * r), rng.uniform(0.5 * r, size - 0.5 * r)
        m = draw_object(img, rng, cls, cx, cy, r, contrast=contrast)
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
    if cue is not None and objects:
        areas = np.bincount(label[(label != IGNORE_INDEX) & (label > 0)].ravel(), minlength=len(CLASSES) + 1)
        add_marker(img, int(areas[1:].argmax()), cue, inst > 0)
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
