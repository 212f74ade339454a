"""Segmentation views. Train (mmseg-style): random rescale of the shorter side to crop*[0.5, 2], random crop
(pad image 0 / mask 255), horizontal flip. Eval: resize the image so its shorter side is ``size`` and both
sides are multiples of the patch size; the mask keeps its original size (the probe upsamples logits to it)
unless ``resize_mask=True``. mmseg's cat_max_ratio crop retry and photometric distortion are not used: the
probe is linear on frozen features, as in DINOv2's linear segmentation evaluation."""
from __future__ import annotations

import torch
from torchvision.transforms import InterpolationMode

from .common import Normalize, crop, hflip, randint, resize, round_to_multiple, uniform


def _check_multiple(size: int, patch: int, what: str) -> None:
    if size % patch:
        raise ValueError(f"{what}={size} is not a multiple of the patch size {patch}; the ViT needs whole patches "
                         f"(use {round_to_multiple(size, patch)}).")


class SegmentationTrain:
    def __init__(self, crop_size: int = 448, scale_range=(0.5, 2.0), flip_p: float = 0.5, patch_size: int = 16,
                 normalize: bool = True, generator: torch.Generator | None = None):
        _check_multiple(crop_size, patch_size, "crop_size")
        self.crop_size, self.scale_range, self.flip_p, self.generator = crop_size, scale_range, flip_p, generator
        self.norm = Normalize() if normalize else None

    def __call__(self, item: dict) -> dict:
        H, W = item["image"].shape[-2:]
        s = uniform(*self.scale_range, self.generator) * self.crop_size / min(H, W)
        h, w = max(1, int(round(H * s))), max(1, int(round(W * s)))
        item = resize(item, (h, w), InterpolationMode.BILINEAR)
        c = self.crop_size
        top, left = randint(max(0, h - c), self.generator), randint(max(0, w - c), self.generator)
        item = crop(item, top, left, c, c)  # pads bottom/right when the image is smaller than the crop
        if float(torch.rand((), generator=self.generator)) < self.flip_p:
            item = hflip(item)
        return self.norm(item) if self.norm else item


class ResizeToPatchMultiple:
    """Shorter side -> ``size`` (None: keep the scale), then each side rounded to a multiple of ``patch_size``."""

    def __init__(self, size: int | None = None, patch_size: int = 16, resize_targets: bool = False,
                 interpolation=InterpolationMode.BILINEAR):
        self.size, self.patch, self.resize_targets, self.interpolation = size, patch_size, resize_targets, interpolation

    def out_size(self, H: int, W: int) -> tuple[int, int]:
        s = 1.0 if self.size is None else self.size / min(H, W)
        return round_to_multiple(H * s, self.patch), round_to_multiple(W * s, self.patch)

    def __call__(self, item: dict) -> dict:
        H, W = item["image"].shape[-2:]
        return resize(item, self.out_size(H, W), self.interpolation, targets=self.resize_targets)


class SegmentationEval:
    def __init__(self, size: int | None = 448, patch_size: int = 16, resize_mask: bool = False, normalize: bool = True):
        self.resize = ResizeToPatchMultiple(size, patch_size, resize_targets=resize_mask)
        self.norm = Normalize() if normalize else None

    def __call__(self, item: dict) -> dict:
        item = self.resize(item)
        return self.norm(item) if self.norm else item
