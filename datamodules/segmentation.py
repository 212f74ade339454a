"""Semantic-segmentation DataModule (voc, voc_aug, ade20k, cityscapes, demo_voc); masks use ignore = 255."""
from __future__ import annotations

from .datamodule_base import DataModuleBase
from .transforms import SegmentationEval, SegmentationTrain


class SegmentationDataModule(DataModuleBase):
    """Train: random rescale + crop ``crop_size`` + flip; val: shorter side ``eval_size`` rounded to patch
    multiples, masks at label size (batches hold lists when sizes differ: use val_batch_size=1 or handle lists)."""

    def __init__(self, data: str = "voc_aug", data_root: str = "", crop_size: int = 448,
                 eval_size: int | None = 448, patch_size: int = 16, **kw):
        self.crop_size, self.eval_size, self.patch_size = crop_size, eval_size, patch_size
        super().__init__(data, data_root, **kw)

    def default_transforms(self):
        return (SegmentationTrain(self.crop_size, patch_size=self.patch_size),
                SegmentationEval(self.eval_size, self.patch_size))

    @property
    def num_classes(self) -> int:
        self.setup("validate")
        return self.val_set.NUM_CLASSES  # per instance: the demo VOC has its own 9 classes
