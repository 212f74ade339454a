"""The probe task table: which dataset, which kind of probe (``Kind``; how each kind runs:
``probes.core.kinds.KINDS``) and the per-dataset evaluation settings."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import partial
from typing import Callable, Optional

import torch


def depth_eval_settings(dataset: str, ds=None) -> tuple[float, float, Optional[Callable[[int, int], torch.Tensor]],
                                                         Optional[float]]:
    """(min_depth, max_depth, crop(H, W) -> bool mask, clip) from datamodules' one table of depth eval settings
    (NYUv2 Eigen crop; SUN RGB-D clip 8 m + Eigen crop; KITTI Garg crop of the KB-cropped map); a dataset that
    carries its own (``custom_depth``: depth_scale, min/max depth, eval crop from its options) gives them itself."""
    if ds is not None and hasattr(ds, "eval_settings"):
        return ds.eval_settings()
    from datamodules.depth_protocol import crop_mask, depth_clip, depth_config
    _, lo, hi, kind = depth_config(dataset)
    return lo, hi, (None if kind is None else partial(crop_mask, kind)), depth_clip(dataset)


class Kind(str, Enum):
    """The kinds of probe; ``probes.core.kinds.KINDS[kind]`` says how to run one."""
    KNN = "knn"        # weighted k-NN on the last block's [CLS] (DINO eval_knn)
    LINEAR = "linear"  # linear classifier on [CLS] tokens (DINO eval_linear)
    SEG = "seg"        # linear segmentation head on patch tokens (entmax paper / DINOv2)
    DEPTH = "depth"    # linear depth head (bins or regression) on patch tokens (+[CLS])
    RETRIEVAL = "retrieval"      # dense nearest-neighbour retrieval, no head (Hummingbird); --kind on a seg task
    OVERCLUSTER = "overcluster"  # k-means on patch tokens matched to classes, no head; --kind on a seg task
    DAVIS = "davis"    # DAVIS-2017 video object segmentation by label propagation, no head (DINO)
    IMAGE_RETRIEVAL = "image_retrieval"  # [CLS] retrieval, revisited Oxford / Paris mAP, no head (DINO, revisitop)
    COPY_DETECTION = "copy_detection"    # [CLS] + GeM copy detection on Copydays, no head (DINO)


# the kinds a task can be run with besides its own (--kind): the head-free dense probes read segmentation tasks
ALT_KINDS = {Kind.SEG: (Kind.RETRIEVAL, Kind.OVERCLUSTER)}


@dataclass(frozen=True)
class TaskSpec:
    name: str
    kind: Kind
    dataset: str                   # dataset name for datamodules.build_dataset with a real --data-root
    demo_dataset: Optional[str]    # the generated dataset used with --data demo (None: no demo equivalent)
    num_classes: int = 0
    img_size: tuple = (224, 224)   # probe input (H, W) for real data
    demo_img_size: tuple = (56, 56)  # demo data: native size (classification: 64 * 224/256, DINO's centre crop)
    val_split: str = "val"         # the split evaluated (depth datasets: "test")


TASKS: dict[str, TaskSpec] = {t.name: t for t in [
    TaskSpec("imagenet", Kind.LINEAR, "imagenet", "demo_cls", num_classes=1000),
    TaskSpec("knn", Kind.KNN, "imagenet", "demo_cls", num_classes=1000),
    TaskSpec("voc", Kind.SEG, "voc", "demo_voc", num_classes=21, img_size=(448, 448), demo_img_size=(128, 128)),
    TaskSpec("ade20k", Kind.SEG, "ade20k", None, num_classes=150, img_size=(448, 448)),
    TaskSpec("cityscapes", Kind.SEG, "cityscapes", None, num_classes=19, img_size=(448, 896)),
    TaskSpec("nyuv2", Kind.DEPTH, "nyuv2", "demo_nyu", img_size=(480, 640),
             demo_img_size=(120, 160), val_split="test"),
    TaskSpec("sunrgbd", Kind.DEPTH, "sunrgbd", None, img_size=(480, 640), val_split="test"),
    TaskSpec("kitti", Kind.DEPTH, "kitti", None, img_size=(352, 1216),
             val_split="test"),
    # your own data (docs/data.md "Your own data"); DATA names the dataset, --img-size the probe input
    TaskSpec("seg", Kind.SEG, "custom_seg", None, img_size=(448, 448)),
    TaskSpec("depth", Kind.DEPTH, "custom_depth", None, img_size=(448, 448)),
    # frames at DINO's size (480 px short side, probes/video/propagation.py), not img_size
    TaskSpec("davis", Kind.DAVIS, "davis", None, img_size=(480, 832)),
    # image level: img_size's first value is the longer side (retrieval) or the square side (copy detection);
    # DINO's README commands: Oxford 224 single-scale, Paris 512 multi-scale; eval_copy_detection's 320
    TaskSpec("roxford5k", Kind.IMAGE_RETRIEVAL, "roxford5k", None, img_size=(224, 224), val_split="query"),
    TaskSpec("rparis6k", Kind.IMAGE_RETRIEVAL, "rparis6k", None, img_size=(512, 512), val_split="query"),
    TaskSpec("copydays", Kind.COPY_DETECTION, "copydays", None, img_size=(320, 320), val_split="strong"),
]}


def get_task(name: str) -> TaskSpec:
    if name not in TASKS:
        raise ValueError(f"unknown probe task {name!r}; valid tasks: {', '.join(TASKS)}")
    return TASKS[name]
