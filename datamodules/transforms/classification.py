"""Classification views (DINO eval_linear.py / eval_knn.py): train RandomResizedCrop 224 + flip, eval Resize 256
(bicubic) + CenterCrop 224. Boxes follow the eval geometry exactly (Point-in-Box maps GT boxes this way).
``RandomResizedCrop`` / ``RandomHorizontalFlip`` draw from a caller's generator (label-supervised training);
``LinearProbeTrain`` is torchvision's pair on the global RNG, as the official linear probe."""
from __future__ import annotations

import torch
from torchvision.transforms import InterpolationMode

from .common import center_crop_offsets, crop, hflip, log_uniform, randint, resize, shorter_side_size, uniform
from .views import eval_resize, random_resized_crop_box


class RandomResizedCrop:
    """torchvision's RandomResizedCrop sampling on the dict (bilinear, as DINO's eval_linear)."""

    def __init__(self, size: int = 224, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
                 interpolation=InterpolationMode.BILINEAR, generator: torch.Generator | None = None):
        self.size, self.scale, self.ratio = size, scale, ratio
        self.interpolation, self.generator = interpolation, generator

    def params(self, H: int, W: int) -> tuple[int, int, int, int]:
        g = self.generator
        return random_resized_crop_box(H, W, self.scale, self.ratio,
                                       draw=lambda: (uniform(*self.scale, g), log_uniform(*self.ratio, g)),
                                       place=lambda dh, dw: (randint(dh, g), randint(dw, g)))

    def __call__(self, item: dict) -> dict:
        H, W = item["image"].shape[-2:]
        top, left, h, w = self.params(H, W)
        return resize(crop(item, top, left, h, w), (self.size, self.size), self.interpolation)


class RandomHorizontalFlip:
    def __init__(self, p: float = 0.5, generator: torch.Generator | None = None):
        self.p, self.generator = p, generator

    def __call__(self, item: dict) -> dict:
        return hflip(item) if float(torch.rand((), generator=self.generator)) < self.p else item


class ResizeCenterCrop:
    """Resize(resize) with bicubic on the shorter side (torchvision size rule), then CenterCrop(crop): the DINO eval
    view of ``transforms.views.eval_view`` on a dict item, moving masks, depths and boxes with the image.
    ``resize=None``: ``views.eval_resize(crop)``."""

    def __init__(self, resize: int | None = 256, crop: int = 224, interpolation=InterpolationMode.BICUBIC):
        self.resize_to = eval_resize(crop) if resize is None else resize
        self.crop_to, self.interpolation = crop, interpolation

    def __call__(self, item: dict) -> dict:
        H, W = item["image"].shape[-2:]
        h, w = shorter_side_size(H, W, self.resize_to)
        item = resize(item, (h, w), self.interpolation)
        top, left = center_crop_offsets(h, w, self.crop_to, self.crop_to)
        return crop(item, top, left, self.crop_to, self.crop_to)


class LinearProbeTrain:
    """DINO ``eval_linear.py``'s train view: ``RandomResizedCrop(size)`` (bilinear) and ``RandomHorizontalFlip()``
    from the global torch RNG, as there. The image stays uint8 (the model normalises)."""

    def __init__(self, size: int = 224):
        import torchvision.transforms.v2 as T
        self.crop, self.flip = T.RandomResizedCrop(size, antialias=True), T.RandomHorizontalFlip()

    def __call__(self, item: dict) -> dict:
        return {**item, "image": self.flip(self.crop(item["image"]))}
