"""The probes' data: the Lightning DataModule of a task (``datamodules``) with the task's protocol view.

knn -> ``ClassificationDataModule`` with the eval view for both splits (DINO eval_knn); imagenet -> the same with
RandomResizedCrop + flip for training (eval_linear; ``aug=False``: the eval view); voc / ade20k / cityscapes / seg
-> ``SegmentationDataModule``; nyuv2 / sunrgbd / kitti / depth -> ``DepthDataModule`` (image resized to the probe size;
training targets follow, validation targets stay at label size). Images stay uint8; ``FrozenFeatures`` normalises them.

>>> # dm = probe_datamodule(get_task("voc"), "demo_voc", root, (128, 128), patch_size=8, batch_size=16)
>>> # dm.setup("fit"); dm.train_set[0].keys()  -> image, mask, path, index
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from datamodules import resolve_data as _resolve
from datamodules.classification import ClassificationDataModule
from datamodules.datamodule_base import DataModuleBase
from datamodules.demo import is_demo
from datamodules.depth import DepthDataModule
from datamodules.segmentation import SegmentationDataModule

from probes.core.task_table import TaskSpec

DATAMODULES = {"knn": ClassificationDataModule, "linear": ClassificationDataModule, "seg": SegmentationDataModule,
               "depth": DepthDataModule}


# your own data: which probe kinds each custom layout feeds (docs/data.md "Your own data")
OWN_DATA = {"imagefolder": ("knn", "linear"), "custom_seg": ("seg",), "custom_depth": ("depth",), "folder": ()}
OWN_TASK = {"knn": "knn", "linear": "imagenet", "seg": "seg", "depth": "depth"}


def check_own_data(task: TaskSpec, name: str) -> None:
    """Refuse a custom layout the task's kind cannot read (e.g. TASK=knn DATA=folder: a folder has no labels)."""
    if name in OWN_DATA and task.kind not in OWN_DATA[name]:
        fits = [f"TASK={OWN_TASK[k]}" for k in OWN_DATA[name]]
        raise ValueError(
            f"TASK={task.name} cannot read DATA={name}" + (f" (it feeds {' or '.join(fits)})" if fits else
                                                           " (images without labels: pretraining and analyses only)")
            + ". Labelled data for the probes: TASK=knn|imagenet DATA=imagefolder (train/ and val/ class folders), "
            "TASK=seg DATA=custom_seg (img_dir + ann_dir), TASK=depth DATA=custom_depth (img_dir + depth_dir); in a "
            "study give each task its data with --task-data TASK=DATA:ROOT.")


def probe_dataset(task: TaskSpec, data: str, data_root: str) -> tuple[str, Path]:
    """(dataset name, root) of the task for --data/--data-root ('' means not given): the task's own demo dataset,
    and the checks of what the task can read, on ``datamodules.resolve_data``."""
    check_own_data(task, (data or "").strip())
    if is_demo(data) and task.demo_dataset is None:
        raise ValueError(f"task '{task.name}' has no built-in demo data (demo exists for imagenet, knn, voc, "
                         f"nyuv2). Run it on the real dataset: make probe TASK={task.name} DATA={task.dataset} "
                         f"DATA_ROOT=/path/to/{task.dataset}")
    return _resolve(data, data_root, task.demo_dataset or "")




def voc_trainaug(name: str, root: Path) -> tuple[str, Optional[str]]:
    """The retrieval protocol's VOC training set: (dataset name, note). ``voc`` becomes ``voc_aug`` (the 10,582
    SBD train_aug images; val stays VOC val) when its list is under ``root``; otherwise VOC train stays, with a note
    saying so (e.g. the fixture, which holds no train_aug list). Other datasets pass unchanged."""
    if name != "voc":
        return name, None
    from datamodules.datasets.voc import VOCAugDataset, find_voc_dir
    voc = find_voc_dir(Path(root), "2012", name)
    if any((voc / rel).is_file() for rel in VOCAugDataset.AUG_LISTS):
        return "voc_aug", None
    return name, (f"VOC trainaug asked for, but no {' / '.join(VOCAugDataset.AUG_LISTS)} under {voc}: the memory "
                  "uses VOC train; the published figures use trainaug (SegmentationClassAug + train_aug.txt, "
                  "docs/data.md)")


def probe_datamodule(task: TaskSpec, name: str, root: Path, size, patch_size: int, batch_size: int,
                     num_workers: int = 0, aug: bool = True, train_split: str = "train",
                     val_split: Optional[str] = None, max_samples: Optional[int] = None) -> DataModuleBase:
    """The task's DataModule on dataset ``name`` at ``root``, probe input ``size`` (int or (h, w); rounded down to
    patch multiples). ``aug`` only matters for the linear probe (RandomResizedCrop + flip)."""
    kw = dict(train_split=train_split, val_split=val_split or task.val_split, batch_size=batch_size,
              num_workers=num_workers, max_samples=max_samples, patch_size=patch_size)
    cls = DATAMODULES[task.kind]
    if cls is ClassificationDataModule:
        s = size if isinstance(size, int) else size[0]
        return cls(name, str(root), img_size=s, train_aug=aug and task.kind == "linear", **kw)
    return cls(name, str(root), img_size=size, **kw)
