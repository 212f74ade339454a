"""Dict -> dict transforms per protocol (classification, dense probes); the depth evaluation protocol is
``datamodules.depth_protocol``.

Shared views and the ImageNet mean/std: ``datamodules.transforms.views``. The DINO multi-crop augmentation lives in
``datamodules.transforms.multicrop`` (imported on its own)."""
from .classification import LinearProbeTrain, RandomHorizontalFlip, RandomResizedCrop, ResizeCenterCrop
from .common import Compose, Normalize
from .dense import FixedResize, floor_to_multiple
from .views import IMAGENET_MEAN, IMAGENET_STD, eval_resize, eval_view, normalize

__all__ = ["LinearProbeTrain", "RandomHorizontalFlip", "RandomResizedCrop", "ResizeCenterCrop", "Compose",
           "Normalize", "FixedResize", "floor_to_multiple", "IMAGENET_MEAN", "IMAGENET_STD", "eval_resize", "eval_view",
           "normalize"]
