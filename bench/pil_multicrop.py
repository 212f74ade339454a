"""The reference DINO multi-crop: ``DataAugmentationDINO`` on PIL images with torchvision v1 transforms and the
official randomness (python ``random`` / torch's global RNG), read from the same ``MultiCropConfig`` as the fast
pipeline. Not used in training: it is the baseline ``bench/multicrop.py`` measures against and the reference
``tests/test_multicrop.py`` compares with (it lives here, not under tests/, because the installed ``bench``
package must not import the test folder)."""
from __future__ import annotations

import random
from dataclasses import replace

import torch
from PIL import Image, ImageFilter, ImageOps
from torchvision import transforms as T
from torchvision.transforms import InterpolationMode

from datamodules.transforms.multicrop_config import MultiCropConfig, make_config


class PILGaussianBlur:
    """dino utils.GaussianBlur: with probability p, PIL GaussianBlur with radius ~ U(radius_min, radius_max)."""

    def __init__(self, p: float, radius_min: float = 0.1, radius_max: float = 2.0):
        self.p, self.radius_min, self.radius_max = p, radius_min, radius_max

    def __call__(self, img: Image.Image) -> Image.Image:
        if random.random() <= self.p:  # '<=' as in the official code
            return img.filter(ImageFilter.GaussianBlur(radius=random.uniform(self.radius_min, self.radius_max)))
        return img


class PILSolarization:
    """dino utils.Solarization: with probability p, ``ImageOps.solarize`` (threshold 128)."""

    def __init__(self, p: float, threshold: int = 128):
        self.p, self.threshold = p, threshold

    def __call__(self, img: Image.Image) -> Image.Image:
        if random.random() < self.p:
            return ImageOps.solarize(img, self.threshold)
        return img


class DinoPILMultiCrop:
    """Reference ``DataAugmentationDINO`` on PIL images (torchvision v1 transforms), read from a config."""

    def __init__(self, config: MultiCropConfig | None = None, **kwargs):
        if config is not None and kwargs:
            config = replace(config, **kwargs)
        cfg = self.cfg = config if config is not None else MultiCropConfig(**kwargs)
        b, c, s, h = cfg.jitter_strengths
        flip_and_color_jitter = T.Compose([
            T.RandomHorizontalFlip(p=cfg.flip_p),
            T.RandomApply([T.ColorJitter(brightness=b, contrast=c, saturation=s, hue=h)], p=cfg.color_jitter_p),
            T.RandomGrayscale(p=cfg.grayscale_p),
        ])
        normalize = T.Compose([T.ToTensor(), T.Normalize(cfg.mean, cfg.std)])

        def branch(size, scale, slot):
            steps = [T.RandomResizedCrop(size, scale=scale, ratio=cfg.ratio, interpolation=InterpolationMode.BICUBIC),
                     flip_and_color_jitter, PILGaussianBlur(cfg.blur_p[slot], *cfg.blur_radius)]
            if cfg.solarize_p[slot] > 0:
                steps.append(PILSolarization(cfg.solarize_p[slot], cfg.solarize_threshold))
            return T.Compose(steps + [normalize])

        self.global_transfo1 = branch(cfg.global_size, cfg.global_scale, 0)
        self.global_transfo2 = branch(cfg.global_size, cfg.global_scale, 1)
        self.local_transfo = branch(cfg.local_size, cfg.local_scale, 2)

    @classmethod
    def from_preset(cls, preset: str = "official", **overrides) -> "DinoPILMultiCrop":
        return cls(make_config(preset, **overrides))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.cfg})"

    def __call__(self, image: Image.Image) -> list[torch.Tensor]:
        if not isinstance(image, Image.Image):
            raise TypeError(f"DinoPILMultiCrop expects a PIL image, got {type(image).__name__}")
        image = image.convert("RGB")
        crops = [self.global_transfo1(image), self.global_transfo2(image)]
        crops += [self.local_transfo(image) for _ in range(self.cfg.n_local)]
        return crops
