"""Classification DataModule (ImageNet ImageFolder, or demo_cls) with the views of DINO's linear and k-NN evaluations.
DINO pretraining with multi-crop is ``datamodules.pretraining.DINOPretrainDataModule``."""
from __future__ import annotations

from .datamodule_base import DataModuleBase
from .transforms import LinearProbeTrain, ResizeCenterCrop, floor_to_multiple


class ClassificationDataModule(DataModuleBase):
    """Train: RandomResizedCrop(img_size) + flip (``eval_linear.py``; ``train_aug=False``: the eval view, as
    ``eval_knn.py``); val: Resize(img_size*256/224, bicubic) + CenterCrop(img_size), ``img_size`` rounded down to
    a multiple of ``patch_size``. Images stay uint8 (the model normalises)."""

    def __init__(self, data: str = "imagenet", data_root: str = "", img_size: int = 224, patch_size: int = 16,
                 train_aug: bool = True, **kw):
        self.img_size, self.train_aug = floor_to_multiple(img_size, patch_size)[0], train_aug
        super().__init__(data, data_root, **kw)

    def default_transforms(self):
        view = ResizeCenterCrop(None, self.img_size)
        return (LinearProbeTrain(self.img_size) if self.train_aug else view), view

    @property
    def num_classes(self) -> int:
        """Classes of the training split: its class list, else (small sets without one) the largest label + 1."""
        self.setup("fit")
        ds = self.train_set
        if ds.classes:
            return len(ds.classes)
        labels = [int(ds.dataset[i]["label"]) for i in range(len(ds))]
        return max(labels) + 1
