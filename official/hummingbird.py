"""vpariza/open-hummingbird-eval (commit 5e79da292730edded800a89828b84f38469f5476, v2.0.0), transcribed: the training
view of the retrieval memory, the reference of tests/test_probe_retrieval.py.

- ``hbird/utils/transforms.py``: ``IMAGENET_MEAN``, ``IMAGENET_STD`` (its 0.255 typo kept), ``_build_color_jitter_block``,
  ``_build_image_tensor_block``, ``get_hbird_train_transforms``;
- ``hbird/utils/image_transformations.py``: ``_as_tuple_size``, ``_ensure_tensor_target``, ``_resized_crop_pair``,
  ``random_resize_crop``, the paired ``RandomResizedCrop`` and ``Compose``, ``CombTransforms``.

Deviations that change no number: the fallbacks for torchvision versions without ``antialias`` dropped, and the
``__repr__`` methods. Nothing here imports the project.
"""
from __future__ import annotations

import random
from typing import Iterable, List, Optional, Sequence, Tuple, Union

import torch
import torchvision.transforms as trn
import torchvision.transforms.functional as F
from torchvision import transforms
from torchvision.transforms import InterpolationMode as _IM

_BILINEAR = _IM.BILINEAR
_NEAREST = _IM.NEAREST

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.255]


def _build_color_jitter_block(brightness: float, contrast: float, saturation: float, hue: float,
                              p_brightness: float, p_contrast: float, p_saturation: float,
                              p_hue: float) -> List[trn.RandomApply]:
    return [
        trn.RandomApply([trn.ColorJitter(brightness=brightness)], p=p_brightness),
        trn.RandomApply([trn.ColorJitter(contrast=contrast)], p=p_contrast),
        trn.RandomApply([trn.ColorJitter(saturation=saturation)], p=p_saturation),
        trn.RandomApply([trn.ColorJitter(hue=hue)], p=p_hue),
    ]


def _build_image_tensor_block(mean: Optional[list], std: Optional[list]) -> trn.Compose:
    steps = [trn.ToTensor()]
    if mean is not None and std is not None:
        steps.append(trn.Normalize(mean=mean, std=std))
    return trn.Compose(steps)


def _as_tuple_size(size: Union[int, Sequence[int]]) -> Tuple[int, int]:
    if isinstance(size, int):
        return (size, size)
    if len(size) != 2:
        raise ValueError(f"size must be int or (h, w), got {size}")
    return int(size[0]), int(size[1])


def _ensure_tensor_target(target) -> torch.Tensor:
    if isinstance(target, torch.Tensor):
        return target
    return transforms.ToTensor()(target)


def _resized_crop_pair(image, target: torch.Tensor, i: int, j: int, h: int, w: int, size):
    size = _as_tuple_size(size)
    image = F.resized_crop(image, i, j, h, w, size, interpolation=_BILINEAR, antialias=True)
    target = F.resized_crop(target, i, j, h, w, size, interpolation=_NEAREST)
    return image, target


def random_resize_crop(image, target, size: Tuple[int, int] = (256, 256), scale: Tuple[float, float] = (0.08, 1.0),
                       ratio: Tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)):
    target = _ensure_tensor_target(target)
    i, j, h, w = transforms.RandomResizedCrop.get_params(image, scale=scale, ratio=ratio)
    return _resized_crop_pair(image, target, i, j, h, w, size)


class RandomResizedCrop(object):
    def __init__(self, size: Union[int, Tuple[int, int]], scale: Tuple[float, float] = (0.5, 2),
                 ratio: Tuple[float, float] = (3. / 4., 4. / 3.), probability: float = 1.0):
        self.size = size
        self.scale = scale
        self.ratio = ratio
        self.probability = float(probability)

    def __call__(self, img, target):
        if random.random() < self.probability:
            return random_resize_crop(img, target, self.size, self.scale, self.ratio)
        return img, target


class Compose(object):
    def __init__(self, transforms: Iterable):
        self.transforms: List = list(transforms)

    def __call__(self, img, target):
        for t in self.transforms:
            img, target = t(img, target)
        return img, target


class CombTransforms(object):
    def __init__(self, img_transform=None, tgt_transform=None, img_tgt_transform=None):
        self.img_transform = img_transform
        self.tgt_transform = tgt_transform
        self.img_tgt_transform = img_tgt_transform

    def __call__(self, img, tgt):
        if self.img_transform:
            img = self.img_transform(img)
        if self.tgt_transform:
            tgt = self.tgt_transform(tgt)
        if self.img_tgt_transform:
            return self.img_tgt_transform(img, tgt)
        return img, tgt


def get_hbird_train_transforms(input_size: int = 224, min_scale_factor: float = 0.5, max_scale_factor: float = 2.0,
                               brightness_jitter_range: float = 0.1, contrast_jitter_range: float = 0.1,
                               saturation_jitter_range: float = 0.1, hue_jitter_range: float = 0.1,
                               brightness_jitter_probability: float = 0.5, contrast_jitter_probability: float = 0.5,
                               saturation_jitter_probability: float = 0.5, hue_jitter_probability: float = 0.5,
                               img_mean: list = IMAGENET_MEAN, img_std: list = IMAGENET_STD):
    image_train_transform = trn.Compose(
        [
            *_build_color_jitter_block(
                brightness=brightness_jitter_range,
                contrast=contrast_jitter_range,
                saturation=saturation_jitter_range,
                hue=hue_jitter_range,
                p_brightness=brightness_jitter_probability,
                p_contrast=contrast_jitter_probability,
                p_saturation=saturation_jitter_probability,
                p_hue=hue_jitter_probability,
            ),
            *_build_image_tensor_block(img_mean, img_std).transforms,
        ]
    )

    shared_train_transform = Compose(
        [
            RandomResizedCrop(
                size=(input_size, input_size),
                scale=(min_scale_factor, max_scale_factor),
            ),
        ]
    )

    return {"img": image_train_transform, "target": None, "shared": shared_train_transform}
