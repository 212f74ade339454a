"""Classification / linear-probe DataModule (ImageNet ImageFolder, or demo_cls). DINO pretraining with
multi-crop is ``datamodules.pretraining.DINOPretrainDataModule``; this one gives the eval_linear views."""
from __future__ import annotations

from .datamodule_base import DataModuleBase
from .transforms import ClassificationEval, ClassificationTrain


class ClassificationDataModule(DataModuleBase):
    """Train: RandomResizedCrop(img_size) + flip; val: Resize(img_size*256/224, bicubic) + CenterCrop(img_size)."""

    def __init__(self, data: str = "imagenet", data_root: str = "", img_size: int = 224, patch_size: int = 16,
                 **kw):
        if img_size % patch_size:
            raise ValueError(f"img_size={img_size} must be a multiple of the patch size {patch_size}")
        self.img_size = img_size
        super().__init__(data, data_root, **kw)

    def default_transforms(self):
        return ClassificationTrain(self.img_size), ClassificationEval(None, self.img_size)

    @property
    def num_classes(self) -> int:
        self.setup("validate")
        return len(self.val_set.classes)
