"""Semantic-segmentation DataModule (voc, voc_aug, ade20k, cityscapes, custom_seg, demo_voc); masks use ignore = 255."""
from __future__ import annotations

from .datamodule_base import DenseDataModule


class SegmentationDataModule(DenseDataModule):
    """The dense probes' view; ``num_classes``: the dataset's (VOC 21, ADE20K 150, Cityscapes 19, demo VOC 9)."""

    def __init__(self, data: str = "voc", data_root: str = "", **kw):
        super().__init__(data, data_root, **kw)

    @property
    def num_classes(self) -> int:
        self.setup("validate")
        ds = self.val_set
        return len(ds.classes) or int(ds.NUM_CLASSES)

    @property
    def class_names(self) -> tuple:
        """The class names (results.json names the per-class IoU with them); () when the dataset has none."""
        self.setup("validate")
        return tuple(self.val_set.classes)
