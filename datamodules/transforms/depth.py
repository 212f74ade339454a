"""Depth views and the evaluation mask.

``eval_depth_mask(name, depth)`` = valid pixels for metrics: the dataset's eval crop AND min < gt < max, with
the per-dataset ranges in ``DEPTH_RANGES`` (one table). Crops:
  * NYUv2 Eigen crop: rows 45:471, cols 41:601 of 480x640 (other sizes: the same fractions, e.g. demo data);
  * KITTI Garg crop: rows 0.40810811-0.99189189, cols 0.03594771-0.96405229 of H/W (constants of the BTS /
    Monodepth eval code);
  * SUN RGB-D: no crop.
"""
from __future__ import annotations

import torch
from torchvision.transforms import InterpolationMode

from .common import Normalize, crop, hflip, randint
from .dense import ResizeToPatchMultiple, _check_multiple

DEPTH_RANGES = {"nyuv2": (1e-3, 10.0), "sunrgbd": (1e-3, 10.0), "kitti": (1e-3, 80.0)}
EVAL_CROP = {"nyuv2": "eigen", "sunrgbd": None, "kitti": "garg"}
_ALIASES = {"nyu": "nyuv2", "demo_nyu": "nyuv2", "sun": "sunrgbd"}


def depth_config(name: str) -> tuple[str, float, float, str | None]:
    key = _ALIASES.get(name, name)
    if key not in DEPTH_RANGES:
        raise ValueError(f"no depth evaluation settings for '{name}'; known: {sorted(DEPTH_RANGES) + sorted(_ALIASES)}")
    lo, hi = DEPTH_RANGES[key]
    return key, lo, hi, EVAL_CROP[key]


def crop_mask(kind: str | None, H: int, W: int) -> torch.Tensor:
    m = torch.zeros(H, W, dtype=torch.bool)
    if kind is None:
        m[:] = True
    elif kind == "eigen":
        if (H, W) == (480, 640):
            m[45:471, 41:601] = True
        else:  # same fractions of the frame (only the demo data / resized copies need this)
            m[int(45 / 480 * H):int(471 / 480 * H), int(41 / 640 * W):int(601 / 640 * W)] = True
    elif kind == "garg":
        m[int(0.40810811 * H):int(0.99189189 * H), int(0.03594771 * W):int(0.96405229 * W)] = True
    else:
        raise ValueError(f"unknown depth eval crop {kind!r} (eigen, garg or None)")
    return m


def eval_depth_mask(name: str, depth: torch.Tensor, crop: str | None | bool = True) -> torch.Tensor:
    """Bool mask of the pixels that count in the metrics, same shape as ``depth`` ((H, W) or (B, H, W)).

    crop=True uses the dataset's standard crop, False/None none, or a crop name ('eigen', 'garg')."""
    _, lo, hi, kind = depth_config(name)
    if crop is not True:
        kind = crop or None
    H, W = depth.shape[-2:]
    return crop_mask(kind, H, W).to(depth.device) & (depth > lo) & (depth < hi)


class DepthTrain:
    """Random crop (``crop_size`` (h, w), multiples of the patch size) + horizontal flip + normalise.
    Crops out of range are padded with depth 0 (= unknown, excluded from the loss)."""

    def __init__(self, crop_size=(416, 544), flip_p: float = 0.5, patch_size: int = 16, normalize: bool = True,
                 generator: torch.Generator | None = None):
        ch, cw = (crop_size, crop_size) if isinstance(crop_size, int) else crop_size
        _check_multiple(ch, patch_size, "crop height")
        _check_multiple(cw, patch_size, "crop width")
        self.ch, self.cw, self.flip_p, self.generator = ch, cw, flip_p, generator
        self.norm = Normalize() if normalize else None

    def __call__(self, item: dict) -> dict:
        H, W = item["image"].shape[-2:]
        top, left = randint(max(0, H - self.ch), self.generator), randint(max(0, W - self.cw), self.generator)
        item = crop(item, top, left, self.ch, self.cw)
        if float(torch.rand((), generator=self.generator)) < self.flip_p:
            item = hflip(item)
        return self.norm(item) if self.norm else item


class DepthEval:
    """Image resized to patch multiples (shorter side ``size``, None = original scale); depth kept at full
    resolution for the metrics (predictions are upsampled to it)."""

    def __init__(self, size: int | None = None, patch_size: int = 16, normalize: bool = True):
        self.resize = ResizeToPatchMultiple(size, patch_size, resize_targets=False,
                                            interpolation=InterpolationMode.BILINEAR)
        self.norm = Normalize() if normalize else None

    def __call__(self, item: dict) -> dict:
        item = self.resize(item)
        return self.norm(item) if self.norm else item
