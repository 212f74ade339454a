"""The dense probes' view (segmentation and depth): the image resized to a fixed (h, w), multiples of the patch size.
Training targets follow (nearest, so batches stack); evaluation targets keep the label size (the probe upsamples
to it). No random crop or flip: the head is linear on frozen features, and a fixed view lets the probe cache them.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

DENSE_TARGETS = ("mask", "depth")


def floor_to_multiple(size: int | Sequence[int], patch: int) -> tuple[int, int]:
    """(h, w) rounded down to multiples of ``patch`` (at least one patch), so every pixel lies in a patch.

    >>> floor_to_multiple(60, 16), floor_to_multiple((120, 7), 8)
    ((48, 48), (120, 8))
    """
    hw = (size, size) if isinstance(size, int) else tuple(size)
    return tuple(max(patch, (int(s) // patch) * patch) for s in hw)  # type: ignore[return-value]


def resize_image(img: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """uint8 (3, H, W) -> uint8 (3, h, w): bilinear, antialiased, in float, rounded back."""
    if tuple(img.shape[-2:]) == tuple(size):
        return img
    x = F.interpolate(img[None].float(), size=size, mode="bilinear", align_corners=False, antialias=True)[0]
    return x.round().clamp(0, 255).to(torch.uint8)


def resize_target(t: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(H, W) mask or depth map -> (h, w), nearest (labels and depths are never interpolated)."""
    if tuple(t.shape[-2:]) == tuple(size):
        return t
    return F.interpolate(t[None, None].float(), size=size, mode="nearest")[0, 0].to(t.dtype)


class FixedResize:
    """Image -> ``size`` (h, w); with ``targets`` the mask / depth map follow (training), else they stay as loaded."""

    def __init__(self, size: tuple[int, int], targets: bool):
        self.size, self.targets = tuple(int(s) for s in size), targets

    def __call__(self, item: dict) -> dict:
        out = {**item, "image": resize_image(torch.as_tensor(item["image"]), self.size)}
        for key in DENSE_TARGETS if self.targets else ():
            if item.get(key) is not None:
                out[key] = resize_target(torch.as_tensor(item[key]), self.size)
        return out

    def __repr__(self) -> str:
        return f"FixedResize(size={self.size}, targets={self.targets})"
