"""DINO multi-crop augmentation: the fast implementation of facebookresearch/dino ``DataAugmentationDINO``
(uint8 CHW in, crop then resize, photometric ops on float, every random choice from a ``torch.Generator``).
Parts: the recipe (``multicrop_config.py``), the draws (``crop_plan.py``), the kernels (``photometric.py``); the
PIL reference it is tested against: ``bench/pil_multicrop.py``.
"""
from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as torch_F
import torchvision.transforms.v2.functional as F
from PIL import Image

from .crop_plan import CropParams, sample_crop_box, sample_params
from .multicrop_config import DINO_JITTER, PRESETS, MultiCropConfig, make_config, sample_generator
from .photometric import adjust_hue, gaussian_blur, grayscale, pil_blur_kernel, solarize
from .views import IMAGENET_MEAN, IMAGENET_STD

__all__ = ["MultiCropTransform", "MultiCropConfig", "CropParams", "PRESETS", "DINO_JITTER", "make_config",
           "sample_generator", "sample_params", "sample_crop_box", "gaussian_blur", "adjust_hue", "grayscale",
           "solarize", "pil_blur_kernel", "IMAGENET_MEAN", "IMAGENET_STD"]


def _to_uint8_chw(img) -> torch.Tensor:
    if isinstance(img, Image.Image):
        return F.pil_to_tensor(img.convert("RGB"))
    if not isinstance(img, torch.Tensor):
        raise TypeError(f"MultiCropTransform expects a uint8 CHW tensor or a PIL image, got {type(img).__name__}")
    if img.dtype != torch.uint8 or img.ndim != 3 or img.shape[0] not in (1, 3, 4):
        raise ValueError("MultiCropTransform expects a uint8 tensor of shape (C, H, W) with C in {1, 3, 4} "
                         f"(e.g. torchvision.io.decode_image(..., mode=RGB)), got dtype={img.dtype} "
                         f"shape={tuple(img.shape)}")
    if img.shape[0] == 1:
        return img.expand(3, -1, -1)
    return img[:3]


def _channels_last(img: torch.Tensor) -> torch.Tensor:
    return img.unsqueeze(0).contiguous(memory_format=torch.channels_last)


class MultiCropTransform:
    """``t(img_uint8_chw, generator=None) -> [global1, global2, *locals]``, normalised float32 (3, size, size).
    Every draw comes from ``generator`` (default: torch's global RNG) in a fixed order. Deviations from PIL:
    photometric ops run on float32 after the uint8 resize (no 8-bit rounding between ops)."""

    def __init__(self, config: MultiCropConfig | None = None, **kwargs):
        if config is not None and kwargs:
            config = replace(config, **kwargs)
        self.cfg = config if config is not None else MultiCropConfig(**kwargs)
        self._mean = torch.tensor(self.cfg.mean).view(3, 1, 1)
        self._std = torch.tensor(self.cfg.std).view(3, 1, 1)

    @classmethod
    def from_preset(cls, preset: str = "official", **overrides) -> "MultiCropTransform":
        return cls(make_config(preset, **overrides))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.cfg})"

    def plan(self, img, generator: torch.Generator | None = None) -> tuple[torch.Tensor, list[CropParams]]:
        """The decode-side half: the uint8 (3, H, W) image and every crop's parameters, drawn from ``generator``
        as ``__call__`` draws them. The batched path (``batched.py``, ``data.augment_on=gpu``) applies them."""
        img = _to_uint8_chw(img)
        return img, sample_params(self.cfg, img.shape[-2], img.shape[-1], generator)

    def __call__(self, img, generator: torch.Generator | None = None) -> list[torch.Tensor]:
        img, params = self.plan(img, generator)
        img = _channels_last(img)  # once per image, for the fast uint8 resize of every crop
        return [self.apply(img, p) for p in params]

    @staticmethod
    def crop_resize(img: torch.Tensor, p: CropParams) -> torch.Tensor:
        """Crop ``p.box`` then resize to ``p.size`` (bicubic, antialiased like PIL): uint8 (3, size, size). ``img``:
        (3, H, W), or (1, 3, H, W) channels-last (torch's uint8 resize is ~3x faster on it); only the crop is read."""
        x = img if img.ndim == 4 else _channels_last(img)
        top, left, h, w = p.box
        out = torch_F.interpolate(x[:, :, top:top + h, left:left + w], size=(p.size, p.size), mode="bicubic",
                                  antialias=True, align_corners=False)
        return out[0].contiguous()

    def apply(self, img: torch.Tensor, p: CropParams, normalize: bool = True) -> torch.Tensor:
        """One crop. Crops are processed one by one: a batch of crops falls out of the CPU cache and was
        measured slower than this loop, despite fewer op calls."""
        x = self.crop_resize(img, p)
        if p.flip:
            x = x.flip(-1)
        x = x.float().div_(255.0)
        for op in p.jitter_order:
            f = p.jitter_factors[op]
            if op == 0:
                x = F.adjust_brightness(x, f)
            elif op == 1:
                x = F.adjust_contrast(x, f)
            elif op == 2:
                x = F.adjust_saturation(x, f)
            else:
                x = adjust_hue(x, f)
        if p.grayscale:
            x = grayscale(x)
        if p.blur_sigma is not None:
            x = gaussian_blur(x, p.blur_sigma)
        if p.solarize:
            x = solarize(x, self.cfg.solarize_threshold)
        if normalize:
            x = (x - self._mean) / self._std
        return x
