"""Your own depth data (``DATA=custom_depth``), in the custom layout of the segmentation toolboxes.

    DATA_ROOT/img_dir/{train,val}/<name>.jpg        (img_suffix; <name> may hold sub-folders)
    DATA_ROOT/depth_dir/{train,val}/<name>.png      (16-bit PNG of raw values) or <name>.npy (any numeric array)
    DATA_ROOT/metainfo.yaml                          (optional: the options below)

metres = raw / ``depth_scale`` (1000: millimetres, as NYUv2; 256: KITTI; 1 for .npy already in metres); 0 (and
non-finite values) = unknown. The metrics are the depth toolbox's, as for NYUv2 (``probes.dense.depth_metric``): pixels
with ``min_depth < gt < max_depth`` inside the optional ``eval_crop`` (``eigen``, ``eigen_abs``, ``garg`` as NYU /
SUN RGB-D / KITTI, or fractions ``"top,bottom,left,right"`` of the frame). Options: keyword arguments, else the
root's ``metainfo.yaml``, else the defaults (depth_scale 1000, min_depth 1e-3, max_depth 10, no crop, depth_suffix
.png when such files exist, else .npy). Opening a split checks every pair before any work starts (``validate``).
"""
from __future__ import annotations

from functools import lru_cache, partial
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from ..errors import CorruptFileError, DatasetError, DepthFormatError, SizeMismatchError
from .base import check_same_size, image_tensor, load_depth_u16, load_rgb
from .custom_base import image_size, option, pair_files, parallel_map, read_metainfo
from .depth_base import DepthDataset

LAYOUT = """  img_dir/{train,val}/<name>.jpg       (img_suffix)
  depth_dir/{train,val}/<name>.png     (16-bit PNG, metres = value / depth_scale; 0 = unknown) or <name>.npy
  metainfo.yaml                        (optional: depth_scale, min_depth, max_depth, eval_crop, suffixes)"""
NAMED_CROPS = ("eigen", "eigen_abs", "garg")


def fraction_crop(box: tuple[float, float, float, float], H: int, W: int) -> torch.Tensor:
    """Bool (H, W): rows top*H..bottom*H, columns left*W..right*W (the Garg crop's arithmetic)."""
    t, b, l, r = box
    m = torch.zeros(H, W, dtype=torch.bool)
    m[int(t * H):int(b * H), int(l * W):int(r * W)] = True
    return m


def parse_crop(crop) -> Optional[Callable[[int, int], torch.Tensor]]:
    """None / 'none' -> no crop; a named crop of ``datamodules.depth_protocol``; or 4 fractions t,b,l,r."""
    from ..depth_protocol import crop_mask
    if crop in (None, "", "none", False):
        return None
    if isinstance(crop, str) and crop in NAMED_CROPS:
        return partial(crop_mask, crop)
    vals = crop.split(",") if isinstance(crop, str) else list(crop)
    try:
        box = tuple(float(v) for v in vals)
    except (TypeError, ValueError):
        box = ()
    if len(box) != 4 or not (0 <= box[0] < box[1] <= 1 and 0 <= box[2] < box[3] <= 1):
        raise DatasetError(f"eval_crop {crop!r}: expected one of {', '.join(NAMED_CROPS)}, 'none', or four "
                           "fractions 'top,bottom,left,right' in [0, 1] (e.g. '0.1,0.95,0.05,0.95').")
    return partial(fraction_crop, box)


def load_raw_depth(path: Path) -> np.ndarray:
    """(H, W) raw depth values: a 16-bit PNG or a .npy array (float32; non-finite -> 0)."""
    if path.suffix.lower() != ".npy":
        return load_depth_u16(path).astype(np.float32)
    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise CorruptFileError(f"{path}: cannot read the .npy depth map ({e}). Re-save it with numpy.save.",
                               str(path)) from e
    arr = np.squeeze(arr)
    if arr.ndim != 2 or not np.issubdtype(arr.dtype, np.number):
        raise DepthFormatError(f"{path}: .npy depth map has shape {arr.shape} / dtype {arr.dtype}; expected a "
                               "numeric (H, W) array (raw values; metres = value / depth_scale).", str(path))
    arr = arr.astype(np.float32)
    arr[~np.isfinite(arr)] = 0
    return arr


def _scan_pair(pair, scale: float, lo: float, hi: float) -> tuple:
    img, dep = pair
    d = load_raw_depth(dep) / scale
    return image_size(img), d.shape, bool(np.any((d > lo) & (d < hi))), float(d.min()), float(d.max())


@lru_cache(maxsize=16)
def depth_stats(pairs: tuple, scale: float, lo: float, hi: float) -> tuple:
    return tuple(parallel_map(lambda p: _scan_pair(p, scale, lo, hi), pairs))


class CustomDepthDataset(DepthDataset):
    name = "custom_depth"
    LAYOUT = LAYOUT
    SOURCE = "your own data (docs/data.md 'Your own data')"

    def __init__(self, root, split="train", transform=None, skip_corrupt=False, *, img_suffix=None,
                 depth_suffix=None, depth_scale=None, min_depth=None, max_depth=None, eval_crop=None,
                 validate=True):
        super().__init__(root, split, transform, skip_corrupt)
        meta = read_metainfo(self.root)
        self.img_suffix = option("img_suffix", img_suffix, meta, ".jpg")
        self.DEPTH_SCALE = float(option("depth_scale", depth_scale, meta, 1000.0))
        self.min_depth = float(option("min_depth", min_depth, meta, 1e-3))
        self.max_depth = float(option("max_depth", max_depth, meta, 10.0))
        if not (self.DEPTH_SCALE > 0 and 0 <= self.min_depth < self.max_depth):
            raise DatasetError(f"custom_depth under {self.root}: need depth_scale > 0 and 0 <= min_depth < max_depth, "
                               f"got {self.DEPTH_SCALE}, {self.min_depth}, {self.max_depth}.")
        self.eval_crop = option("eval_crop", eval_crop, meta, None)
        self.crop = parse_crop(self.eval_crop)
        ddir = self.root / "depth_dir" / split
        default_suffix = ".npy" if ddir.is_dir() and not any(ddir.rglob("*.png")) else ".png"
        self.depth_suffix = option("depth_suffix", depth_suffix, meta, default_suffix)
        for img, dep in pair_files(self.root / "img_dir" / split, ddir, self.img_suffix, self.depth_suffix,
                                   "depth map", self.LAYOUT, tgt_opt="depth_suffix"):
            self.samples.append({"image": img, "depth": dep})
        self._finish()
        if validate:
            self.validate()

    def eval_settings(self):
        """(min_depth, max_depth, crop(H, W) -> bool mask or None, clip None), from its options."""
        return self.min_depth, self.max_depth, self.crop, None

    def validate(self) -> None:
        """Refuse, naming the file and the fix: image/depth size mismatch, and a depth map with no value inside
        (min_depth, max_depth) after scaling (a wrong depth_scale, or an empty map)."""
        pairs = tuple((r["image"], r["depth"]) for r in self.samples)
        for (img, dep), (ihw, dhw, ok, lo, hi) in zip(pairs, depth_stats(pairs, self.DEPTH_SCALE, self.min_depth,
                                                                         self.max_depth)):
            if tuple(ihw) != tuple(dhw):
                raise SizeMismatchError(f"{dep}: depth map is {dhw[1]}x{dhw[0]} (WxH) but its image {img} is "
                                        f"{ihw[1]}x{ihw[0]}. They must be pixel-aligned: re-export the depth at the "
                                        "image's size, or pair the right files.", str(dep))
            if not ok:
                raise DepthFormatError(
                    f"{dep}: no depth value inside ({self.min_depth}, {self.max_depth}) m after dividing by "
                    f"depth_scale={self.DEPTH_SCALE:g} (values {lo:g}..{hi:g} m). Set depth_scale to the raw units "
                    "per metre (1000 for millimetres, 256 for KITTI, 1 for metres) and min_depth/max_depth to the "
                    "sensor's range in metainfo.yaml, or remove this empty map.", str(dep))

    def load(self, rec: dict) -> dict:
        img = load_rgb(rec["image"])
        raw = load_raw_depth(rec["depth"])
        check_same_size(img, raw, rec["image"], rec["depth"], "depth map")
        return {"image": image_tensor(img), "depth": torch.from_numpy(raw / self.DEPTH_SCALE),
                "path": str(rec["image"])}
