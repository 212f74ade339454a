"""Dict -> dict transforms per protocol (classification, dense probes) and the depth evaluation protocol.

Shared views and the ImageNet mean/std: ``datamodules.transforms.views``. The DINO multi-crop augmentation lives in
``datamodules.transforms.multicrop`` (imported on its own)."""
from .classification import LinearProbeTrain, RandomHorizontalFlip, RandomResizedCrop, ResizeCenterCrop
from .common import Compose, Normalize
from .dense import FixedResize, floor_to_multiple
from .depth import (DEPTH_RANGES, EVAL_CLIP, EVAL_CROP, KB_CROP, depth_clip, depth_config, eval_depth_mask,
                    kb_crop_box)
from .views import IMAGENET_MEAN, IMAGENET_STD, eval_resize, eval_view, normalize

__all__ = ["LinearProbeTrain", "RandomHorizontalFlip", "RandomResizedCrop", "ResizeCenterCrop", "Compose",
           "Normalize", "FixedResize", "floor_to_multiple", "DEPTH_RANGES", "EVAL_CROP", "EVAL_CLIP", "KB_CROP",
           "depth_clip", "depth_config", "eval_depth_mask", "kb_crop_box", "IMAGENET_MEAN", "IMAGENET_STD",
           "eval_resize", "eval_view", "normalize"]
