"""The depth evaluation protocol of each dataset (which pixels count, up to which depth), and the KITTI KB crop.

The protocols of zhyever/Monocular-Depth-Estimation-Toolbox (``depth/datasets/{nyu,sunrgbd,kitti}.py``), which
the DINOv2 line of work evaluates with, one table each: ``DEPTH_RANGES`` (min < gt < max), ``EVAL_CROP`` and
``EVAL_CLIP``; the clip applies first, then the crop AND the range. The crops' numbers and their sources:
docs/data.md ("eval_depth_mask"). ``crop='eigen'`` on KITTI is KITTI's Eigen crop (as BTS), not NYU's.
"""
from __future__ import annotations

from functools import partial
from typing import Callable, Optional

import torch

DEPTH_RANGES = {"nyuv2": (1e-3, 10.0), "sunrgbd": (1e-3, 10.0), "kitti": (1e-3, 80.0)}
EVAL_CROP = {"nyuv2": "eigen", "sunrgbd": "eigen_abs", "kitti": "garg"}
EVAL_CLIP = {"nyuv2": None, "sunrgbd": 8.0, "kitti": None}  # gt and prediction clipped above, before the mask
KB_CROP = (352, 1216)  # KITTI (h, w), bottom-centre
_ALIASES = {"nyu": "nyuv2", "demo_nyu": "nyuv2", "sun": "sunrgbd"}


def depth_config(name: str) -> tuple[str, float, float, str | None]:
    key = _ALIASES.get(name, name)
    if key not in DEPTH_RANGES:
        raise ValueError(f"no depth evaluation settings for '{name}'; known: {sorted(DEPTH_RANGES) + sorted(_ALIASES)}")
    lo, hi = DEPTH_RANGES[key]
    return key, lo, hi, EVAL_CROP[key]


def depth_clip(name: str) -> float | None:
    """The upper clip of gt and prediction before evaluation (SUN RGB-D: 8 m), None for none."""
    return EVAL_CLIP[depth_config(name)[0]]


def kb_crop_box(H: int, W: int, h: int = KB_CROP[0], w: int = KB_CROP[1]) -> tuple[int, int, int, int]:
    """(top, left, h, w) of the KB crop: the bottom ``h`` rows, ``w`` columns centred (left = (W - w) // 2)."""
    if H < h or W < w:
        raise ValueError(f"KB crop needs a frame of at least {h}x{w}, got {H}x{W} (KITTI frames are ~375x1242)")
    return H - h, (W - w) // 2, h, w


def crop_mask(kind: str | None, H: int, W: int) -> torch.Tensor:
    m = torch.zeros(H, W, dtype=torch.bool)
    if kind is None:
        m[:] = True
    elif kind == "eigen":
        if (H, W) == (480, 640):
            m[45:471, 41:601] = True
        else:  # same fractions of the frame (only the demo data / resized copies need this)
            m[int(45 / 480 * H):int(471 / 480 * H), int(41 / 640 * W):int(601 / 640 * W)] = True
    elif kind == "eigen_abs":  # the toolbox's SUN RGB-D mask: fixed indices, clipped by the frame
        m[45:471, 41:601] = True
    elif kind == "garg":
        m[int(0.40810811 * H):int(0.99189189 * H), int(0.03594771 * W):int(0.96405229 * W)] = True
    elif kind == "eigen_kitti":  # KITTI's Eigen crop (BTS / the toolbox's kitti eigen_crop), of the KB-cropped map
        m[int(0.3324324 * H):int(0.91351351 * H), int(0.0359477 * W):int(0.96405229 * W)] = True
    else:
        raise ValueError(f"unknown depth eval crop {kind!r} (eigen, eigen_abs, eigen_kitti, garg or None)")
    return m


CropFn = Callable[[int, int], torch.Tensor]
EvalSettings = tuple[float, float, Optional[CropFn], Optional[float]]  # min, max, crop(H, W) -> mask or None, clip


def eval_settings(name: str) -> EvalSettings:
    """(min_depth, max_depth, crop(H, W) -> bool mask or None, clip) of a benchmark (or its demo copy)."""
    _, lo, hi, kind = depth_config(name)
    return lo, hi, (None if kind is None else partial(crop_mask, kind)), depth_clip(name)


def settings_mask(settings: EvalSettings, depth: torch.Tensor) -> torch.Tensor:
    """Pixels that count under ``settings``: the clip first (12 m counts, as 8 m), then crop AND min < gt < max."""
    lo, hi, crop, clip = settings
    if clip is not None:
        depth = depth.clamp(max=clip)
    inside = (depth > lo) & (depth < hi)
    return inside if crop is None else inside & crop(*depth.shape[-2:]).to(depth.device)


def eval_depth_mask(name: str, depth: torch.Tensor, crop: str | None | bool = True) -> torch.Tensor:
    """Bool mask (shaped like ``depth``) of the pixels that count. ``crop``: True = the dataset's standard crop,
    False/None none, or a name ('eigen', 'garg', ...); the dataset's clip (SUN RGB-D 8 m) applies first."""
    key, lo, hi, kind = depth_config(name)
    if crop is not True:
        kind = crop or None
    if key == "kitti" and kind == "eigen":  # KITTI's Eigen crop has its own fractions, not NYU's
        kind = "eigen_kitti"
    clip = depth_clip(name)
    if clip is not None:
        depth = depth.clamp(max=clip)
    H, W = depth.shape[-2:]
    return crop_mask(kind, H, W).to(depth.device) & (depth > lo) & (depth < hi)
