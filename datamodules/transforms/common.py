"""Building blocks of the dict -> dict transforms: geometry that keeps image, mask, depth and boxes aligned."""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torchvision.transforms.v2.functional as TF
from torchvision.transforms import InterpolationMode

from .views import IMAGENET_MEAN, IMAGENET_STD

DENSE_KEYS = ("mask", "depth")  # pixel-aligned targets: resized with nearest, never interpolated


class Compose:
    def __init__(self, transforms: Sequence[Callable[[dict], dict]]):
        self.transforms = list(transforms)

    def __call__(self, item: dict) -> dict:
        for t in self.transforms:
            item = t(item)
        return item

    def __repr__(self) -> str:
        return f"Compose({self.transforms})"


class Normalize:
    """uint8 image -> float32, ImageNet mean/std (DINO / timm defaults)."""

    def __init__(self, mean=IMAGENET_MEAN, std=IMAGENET_STD):
        self.mean = torch.tensor(mean, dtype=torch.float32).view(3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(3, 1, 1)

    def __call__(self, item: dict) -> dict:
        img = item["image"]
        if img.dtype != torch.uint8:
            raise TypeError(f"Normalize expects the uint8 image of a dataset item, got {img.dtype} "
                            "(normalised twice?)")
        return {**item, "image": (img.float() / 255.0 - self.mean) / self.std}


def shorter_side_size(h: int, w: int, size: int) -> tuple[int, int]:
    """torchvision Resize(int) output size: the shorter side becomes ``size``, the longer one is truncated."""
    if h <= w:
        return size, int(size * w / h)
    return int(size * h / w), size


def resize(item: dict, size: tuple[int, int], interpolation=InterpolationMode.BICUBIC,
           targets: bool = True) -> dict:
    """Resize the image to (h, w); masks/depths with nearest (when ``targets``); boxes scaled per axis."""
    out = dict(item)
    h0, w0 = item["image"].shape[-2:]
    h, w = int(size[0]), int(size[1])
    if (h0, w0) == (h, w):
        return out
    out["image"] = TF.resize(item["image"], [h, w], interpolation=interpolation, antialias=True)
    if targets:
        for k in DENSE_KEYS:
            if k in item:
                t = item[k]
                out[k] = TF.resize(t[None], [h, w], interpolation=InterpolationMode.NEAREST_EXACT)[0] \
                    if t.dtype != torch.float32 else \
                    torch.nn.functional.interpolate(t[None, None], size=(h, w), mode="nearest-exact")[0, 0]
    if "boxes" in item:
        scale = torch.tensor([w / w0, h / h0, w / w0, h / h0], dtype=torch.float32)
        out["boxes"] = item["boxes"] * scale
    return out


def crop(item: dict, top: int, left: int, h: int, w: int, pad_image: float = 0, pad_mask: int = 255) -> dict:
    """Crop (pad where the window leaves the image: image 0, mask 255, depth 0); boxes shifted and clipped."""
    out = dict(item)
    H, W = item["image"].shape[-2:]
    pads = (max(0, -left), max(0, -top), max(0, left + w - W), max(0, top + h - H))  # l, t, r, b

    def cut(t, fill):
        t3 = t if t.ndim == 3 else t[None]
        if any(pads):
            t3 = TF.pad(t3, list(pads), fill=fill)
        return t3[..., top + pads[1]: top + pads[1] + h, left + pads[0]: left + pads[0] + w]

    out["image"] = cut(item["image"], pad_image)
    for k, fill in (("mask", pad_mask), ("depth", 0.0)):
        if k in item:
            out[k] = cut(item[k], fill)[0]
    if "boxes" in item:
        b = item["boxes"] - torch.tensor([left, top, left, top], dtype=torch.float32)
        b[:, 0::2] = b[:, 0::2].clamp(0, w)
        b[:, 1::2] = b[:, 1::2].clamp(0, h)
        out["boxes"] = b
    return out


def center_crop_offsets(H: int, W: int, h: int, w: int) -> tuple[int, int]:
    """torchvision CenterCrop's offsets: int(round((H - h) / 2))."""
    return int(round((H - h) / 2.0)), int(round((W - w) / 2.0))


def hflip(item: dict) -> dict:
    out = dict(item)
    W = item["image"].shape[-1]
    out["image"] = item["image"].flip(-1)
    for k in DENSE_KEYS:
        if k in item:
            out[k] = item[k].flip(-1)
    if "boxes" in item:
        b = item["boxes"].clone()
        b[:, 0], b[:, 2] = W - item["boxes"][:, 2], W - item["boxes"][:, 0]
        out["boxes"] = b
    return out


def uniform(low: float, high: float, generator: torch.Generator | None = None) -> float:
    return float(low + (high - low) * torch.rand((), generator=generator))


def randint(high: int, generator: torch.Generator | None = None) -> int:
    """Uniform in [0, high] inclusive."""
    return int(torch.randint(0, high + 1, (), generator=generator)) if high > 0 else 0


def log_uniform(low: float, high: float, generator=None) -> float:
    return math.exp(uniform(math.log(low), math.log(high), generator))
