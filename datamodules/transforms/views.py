"""The data views every protocol shares, each written once: ``IMAGENET_MEAN`` / ``IMAGENET_STD`` and
:func:`normalize`; DINO's evaluation view, Resize(short side -> ``crop * 256/224``, bicubic) + CenterCrop(``crop``)
(:func:`eval_resize`, :func:`eval_view`; ``ResizeCenterCrop`` is the same on a dict item); and
:func:`random_resized_crop_box`, torchvision's ``RandomResizedCrop.get_params`` fed by the caller's randomness.

>>> img = torch.randint(0, 256, (3, 80, 100), dtype=torch.uint8)
>>> eval_view(img, 64).shape                       # short side -> eval_resize(64) = 73, then the 64 px centre
torch.Size([3, 64, 64])
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torchvision.transforms.v2.functional as TF
from torchvision.transforms import InterpolationMode

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
EVAL_RESIZE_RATIO = 256 / 224  # DINO / LAST-ViT evaluation: Resize(256) before CenterCrop(224)


def normalize(img: torch.Tensor, mean: Sequence[float] = IMAGENET_MEAN,
              std: Sequence[float] = IMAGENET_STD) -> torch.Tensor:
    """(..., 3, H, W) uint8 in [0, 255] (or float in [0, 1]) -> float32 ``(x - mean) / std``, on the image's device."""
    x = img.float() / 255.0 if img.dtype == torch.uint8 else img.float()
    m = torch.tensor(mean, dtype=torch.float32, device=x.device).view(3, 1, 1)
    s = torch.tensor(std, dtype=torch.float32, device=x.device).view(3, 1, 1)
    return (x - m) / s


def eval_resize(crop: int, ratio: float = EVAL_RESIZE_RATIO) -> int:
    """Short side before the centre crop: 256 for 224 (DINO), the nearest integer of the same ratio otherwise."""
    return int(round(crop * ratio))


def eval_view(img: torch.Tensor, crop: int, resize: int | None = None) -> torch.Tensor:
    """uint8 (3, H, W) -> uint8 (3, crop, crop): Resize(short side -> ``resize``, bicubic, antialiased, torchvision's
    size rule) + CenterCrop(``crop``). ``resize`` defaults to :func:`eval_resize` of the crop."""
    resize = eval_resize(crop) if resize is None else int(resize)
    if min(img.shape[-2:]) != resize:
        img = TF.resize(img, [resize], interpolation=InterpolationMode.BICUBIC, antialias=True)
    return TF.center_crop(img, [crop, crop])


def random_resized_crop_box(height: int, width: int, scale: Sequence[float], ratio: Sequence[float],
                            draw: Callable[[], tuple[float, float]],
                            place: Callable[[int, int], tuple[int, int]], tries: int = 10) -> tuple[int, int, int, int]:
    """torchvision ``RandomResizedCrop.get_params``: (top, left, height, width). ``draw()``: one try's (area share,
    aspect ratio); ``place(H - h, W - w)``: an accepted box's offsets; after ``tries`` misses the central crop."""
    area = height * width
    for _ in range(tries):
        share, aspect = draw()
        target_area = area * share
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top, left = place(height - h, width - w)
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w
