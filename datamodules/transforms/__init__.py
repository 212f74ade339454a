"""Dict -> dict transforms per protocol (classification, dense probes). Shared views and the ImageNet mean/std:
``views``; DINO's multi-crop: ``multicrop`` (imported on its own); the depth protocol: ``datamodules.depth_protocol``."""
from .classification import LinearProbeTrain, RandomHorizontalFlip, RandomResizedCrop, ResizeCenterCrop
from .common import Compose, Normalize
from .dense import FixedResize, floor_to_multiple
from .views import IMAGENET_MEAN, IMAGENET_STD, eval_resize, eval_view, normalize

__all__ = ["LinearProbeTrain", "RandomHorizontalFlip", "RandomResizedCrop", "ResizeCenterCrop", "Compose",
           "Normalize", "FixedResize", "floor_to_multiple", "IMAGENET_MEAN", "IMAGENET_STD", "eval_resize", "eval_view",
           "normalize"]
