"""The random choices of a multi-crop sample, one :class:`CropParams` per crop, drawn in a fixed order from one
``torch.Generator``: a generator state fixes every crop (what makes pretraining resumable bit for bit).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

from .multicrop_config import MultiCropConfig
from .views import random_resized_crop_box


@dataclass
class CropParams:
    kind: str  # "global1", "global2", "local"
    size: int
    box: tuple[int, int, int, int]  # top, left, height, width in the input image
    flip: bool = False
    jitter_order: list[int] = field(default_factory=list)  # applied op ids: 0 bright 1 contrast 2 sat 3 hue
    jitter_factors: tuple[float, float, float, float] = (1.0, 1.0, 1.0, 0.0)
    grayscale: bool = False
    blur_sigma: float | None = None
    solarize: bool = False


_TRIES = 10  # RandomResizedCrop attempts before the centre-crop fallback
_BOX_DRAWS = 2 * _TRIES + 2  # (area, log-ratio) per try, then the position
_CROP_DRAWS = _BOX_DRAWS + 14


def _crop_box(height: int, width: int, scale: Sequence[float], ratio: Sequence[float],
              u: Sequence[float]) -> tuple[int, int, int, int]:
    """torchvision ``RandomResizedCrop.get_params`` (10 tries, then a centre crop) from 22 uniforms in [0, 1):
    try t reads u[2t] (area) and u[2t + 1] (log-ratio), an accepted box u[-2], u[-1] (position)."""
    lr0, lr1 = math.log(ratio[0]), math.log(ratio[1])
    tries = iter(range(_TRIES))

    def draw() -> tuple[float, float]:
        t = next(tries)
        return scale[0] + (scale[1] - scale[0]) * u[2 * t], math.exp(lr0 + (lr1 - lr0) * u[2 * t + 1])

    def place(dh: int, dw: int) -> tuple[int, int]:
        return min(int(u[-2] * (dh + 1)), dh), min(int(u[-1] * (dw + 1)), dw)

    return random_resized_crop_box(height, width, scale, ratio, draw, place, tries=_TRIES)


def sample_crop_box(height: int, width: int, scale: Sequence[float], ratio: Sequence[float],
                    g: torch.Generator | None = None) -> tuple[int, int, int, int]:
    """One RandomResizedCrop box (top, left, height, width), drawn from ``g``."""
    return _crop_box(height, width, scale, ratio, torch.rand(_BOX_DRAWS, generator=g, dtype=torch.float64).tolist())


def sample_params(cfg: MultiCropConfig, height: int, width: int,
                  g: torch.Generator | None = None) -> list[CropParams]:
    """All random choices for one image, globals first: one ``torch.rand`` call (a fixed number of uniforms per
    crop), then plain Python (drawing one by one cost more than the crops of a small image)."""
    b, c, s, h = cfg.jitter_strengths
    strengths = (b, c, s, h)
    kinds = ["global1", "global2"] + ["local"] * cfg.n_local
    draws = torch.rand(len(kinds), _CROP_DRAWS, generator=g, dtype=torch.float64).tolist()
    out = []
    for n, (kind, u) in enumerate(zip(kinds, draws)):
        is_global = kind != "local"
        box = _crop_box(height, width, cfg.global_scale if is_global else cfg.local_scale, cfg.ratio,
                        u[:_BOX_DRAWS])
        p = CropParams(kind, cfg.global_size if is_global else cfg.local_size, box)
        v = u[_BOX_DRAWS:]
        p.flip = v[0] < cfg.flip_p
        # ColorJitter: with probability p, the 4 ops in a random order, factors uniform in [1-s, 1+s]
        # (hue: [-h, h]) as torchvision draws them; an op of strength 0 is skipped
        if v[1] < cfg.color_jitter_p:
            order = sorted(range(4), key=lambda k: v[2 + k])  # a uniformly random permutation
            p.jitter_order = [o for o in order if strengths[o] > 0]
            p.jitter_factors = (max(0.0, 1 - b) + (1 + b - max(0.0, 1 - b)) * v[6],
                                max(0.0, 1 - c) + (1 + c - max(0.0, 1 - c)) * v[7],
                                max(0.0, 1 - s) + (1 + s - max(0.0, 1 - s)) * v[8],
                                -h + 2 * h * v[9])
        p.grayscale = v[10] < cfg.grayscale_p
        slot = min(n, 2)
        if v[11] < cfg.blur_p[slot]:
            p.blur_sigma = cfg.blur_radius[0] + (cfg.blur_radius[1] - cfg.blur_radius[0]) * v[12]
        p.solarize = v[13] < cfg.solarize_p[slot]
        out.append(p)
    return out
