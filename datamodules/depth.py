"""Monocular-depth DataModule (nyuv2, sunrgbd, kitti, demo_nyu); depth in metres, 0 = unknown.
Use ``datamodules.transforms.eval_depth_mask(data, depth)`` for the evaluation pixels."""
from __future__ import annotations

from .datamodule_base import DataModuleBase
from .transforms import DepthEval, DepthTrain, depth_config


class DepthDataModule(DataModuleBase):
    """Train: random crop ``crop_size`` (h, w) + flip; val: image resized to patch multiples, depth at full size.

    SUN RGB-D and the KITTI/NYU Eigen tests are evaluation sets: set ``train_data``/``train_root`` to train on
    another dataset (e.g. NYUv2 train, then validate on SUN RGB-D, as the usual protocol)."""

    def __init__(self, data: str = "nyuv2", data_root: str = "", train_split: str = "train", val_split: str = "test",
                 crop_size=(416, 544), eval_size: int | None = None, patch_size: int = 16,
                 train_data: str | None = None, train_root: str | None = None, **kw):
        self.crop_size, self.eval_size, self.patch_size = crop_size, eval_size, patch_size
        self.train_data, self.train_root = train_data, train_root
        super().__init__(data, data_root, train_split=train_split, val_split=val_split, **kw)
        depth_config(self.data if not self.data.startswith("demo") else "demo_nyu")  # fail early on a non-depth name

    def default_transforms(self):
        return DepthTrain(self.crop_size, patch_size=self.patch_size), DepthEval(self.eval_size, self.patch_size)

    def _build(self, split, transform, train=False):
        if train and self.train_data:
            from . import build_dataset
            return build_dataset(self.train_data, self.train_root or self.data_root, split, transform=transform,
                                 skip_corrupt=self.skip_corrupt)
        return super()._build(split, transform, train)

    def eval_mask(self, depth):
        from .transforms import eval_depth_mask
        return eval_depth_mask(self.data, depth)
