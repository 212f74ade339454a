"""Dict -> dict transforms per protocol (classification, segmentation, depth) and the depth eval mask.

The DINO multi-crop augmentation lives in ``datamodules.transforms.multicrop`` (imported on its own)."""
from .classification import (ClassificationEval, ClassificationTrain, RandomHorizontalFlip, RandomResizedCrop,
                             ResizeCenterCrop)
from .common import IMAGENET_MEAN, IMAGENET_STD, Compose, Normalize, round_to_multiple
from .dense import ResizeToPatchMultiple, SegmentationEval, SegmentationTrain
from .depth import (DEPTH_RANGES, EVAL_CLIP, EVAL_CROP, KB_CROP, DepthEval, DepthTrain, depth_clip, depth_config,
                    eval_depth_mask, kb_crop_box)

__all__ = ["ClassificationEval", "ClassificationTrain", "RandomHorizontalFlip", "RandomResizedCrop",
           "ResizeCenterCrop", "IMAGENET_MEAN", "IMAGENET_STD", "Compose", "Normalize", "round_to_multiple",
           "ResizeToPatchMultiple", "SegmentationEval", "SegmentationTrain", "DEPTH_RANGES", "EVAL_CROP",
           "EVAL_CLIP", "KB_CROP", "DepthEval", "DepthTrain", "depth_clip", "depth_config", "eval_depth_mask",
           "kb_crop_box"]
