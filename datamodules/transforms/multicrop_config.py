"""The DINO multi-crop recipe as data: :class:`MultiCropConfig`, its presets and the per-sample generator.

Presets: ``official`` (main_dino.py defaults), ``released_vits16`` (the released ViT-S/16 run) and ``demo``
(64 px demo data, see docs/demo-data.md). ``make_config("demo", n_local=2)`` applies overrides on a preset.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from .views import IMAGENET_MEAN, IMAGENET_STD

DINO_JITTER = (0.4, 0.4, 0.2, 0.1)  # brightness, contrast, saturation, hue


@dataclass(frozen=True)
class MultiCropConfig:
    """Everything the recipe lets you change. Probabilities are per crop."""
    global_size: int = 224
    local_size: int = 96
    n_local: int = 8
    global_scale: tuple[float, float] = (0.4, 1.0)
    local_scale: tuple[float, float] = (0.05, 0.4)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_p: float = 0.5
    # True -> DINO strengths, False -> off, or (brightness, contrast, saturation, hue)
    color_jitter: bool | tuple[float, float, float, float] = True
    color_jitter_p: float = 0.8
    grayscale_p: float = 0.2
    blur_p: tuple[float, float, float] = (1.0, 0.1, 0.5)  # global 1, global 2, locals
    blur_radius: tuple[float, float] = (0.1, 2.0)  # PIL GaussianBlur radius (standard deviation, px)
    solarize_p: tuple[float, float, float] = (0.0, 0.2, 0.0)  # global 1, global 2, locals
    solarize_threshold: int = 128  # PIL ImageOps.solarize default: values >= 128 are inverted
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    def __post_init__(self):
        def bad(msg):
            raise ValueError(f"MultiCropConfig: {msg}")
        for name in ("global_scale", "local_scale", "ratio", "blur_p", "blur_radius", "solarize_p", "mean", "std"):
            try:  # lists from YAML / the CLI become tuples
                object.__setattr__(self, name, tuple(float(v) for v in getattr(self, name)))
            except (TypeError, ValueError):
                bad(f"{name} must be a sequence of numbers, got {getattr(self, name)!r}")
        if isinstance(self.color_jitter, list):
            object.__setattr__(self, "color_jitter", tuple(self.color_jitter))
        for name in ("global_size", "local_size"):
            if int(getattr(self, name)) <= 0:
                bad(f"{name} must be a positive int, got {getattr(self, name)!r}")
        if int(self.n_local) < 0:
            bad(f"n_local must be >= 0, got {self.n_local!r}")
        for name in ("global_scale", "local_scale", "ratio", "blur_radius"):
            lo, hi = getattr(self, name)
            if not 0 < lo <= hi:
                bad(f"{name} must be (low, high) with 0 < low <= high, got {getattr(self, name)!r}")
        for name in ("global_scale", "local_scale"):
            if getattr(self, name)[1] > 1:
                bad(f"{name} is a share of the image area, at most 1, got {getattr(self, name)!r}")
        for name in ("flip_p", "color_jitter_p", "grayscale_p"):
            if not 0 <= getattr(self, name) <= 1:
                bad(f"{name} must be a probability in [0, 1], got {getattr(self, name)!r}")
        for name in ("blur_p", "solarize_p"):
            ps = getattr(self, name)
            if len(ps) != 3 or not all(0 <= p <= 1 for p in ps):
                bad(f"{name} must be 3 probabilities (global 1, global 2, locals), got {ps!r}")
        if self.jitter_strengths[3] > 0.5 or min(self.jitter_strengths) < 0:
            bad(f"color_jitter strengths must be >= 0 and hue <= 0.5, got {self.color_jitter!r}")

    @property
    def jitter_strengths(self) -> tuple[float, float, float, float]:
        if self.color_jitter is True:
            return DINO_JITTER
        if self.color_jitter is False or self.color_jitter is None:
            return (0.0, 0.0, 0.0, 0.0)
        cj = tuple(float(v) for v in self.color_jitter)
        if len(cj) != 4:
            raise ValueError("MultiCropConfig: color_jitter must be True/False or "
                             f"(brightness, contrast, saturation, hue), got {self.color_jitter!r}")
        return cj  # type: ignore[return-value]

    @property
    def n_crops(self) -> int:
        return 2 + self.n_local

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}


PRESETS: dict[str, dict] = {
    # main_dino.py argument defaults
    "official": {},
    # the released ViT-S/16 run (README / args of dino_deitsmall16)
    "released_vits16": dict(n_local=10, global_scale=(0.25, 1.0), local_scale=(0.05, 0.25)),
    # 64 px demo scenes (ViT patch 8): classes differ by colour, so no hue jitter, no grayscale and no
    # solarize; larger crops so a local crop still shows an object part; blur scaled to the small images.
    "demo": dict(global_size=64, local_size=32, n_local=6, global_scale=(0.5, 1.0), local_scale=(0.2, 0.5),
                 color_jitter=(0.4, 0.4, 0.2, 0.0), grayscale_p=0.0, blur_radius=(0.1, 0.8),
                 solarize_p=(0.0, 0.0, 0.0)),
}


def make_config(preset: str = "official", **overrides) -> MultiCropConfig:
    if preset not in PRESETS:
        raise ValueError(f"unknown multi-crop preset {preset!r}; valid: {sorted(PRESETS)}")
    return MultiCropConfig(**{**PRESETS[preset], **overrides})


def sample_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """Per-sample generator: the crops of (seed, epoch, index) are the same whatever worker draws them."""
    g = torch.Generator()
    # large odd multipliers keep (epoch, index) pairs apart; fits in 63 bits for any realistic run
    g.manual_seed((int(seed) * 1_000_003 + int(epoch) * 2_654_435_761 + int(index) * 97) % (2**63 - 1))
    return g
