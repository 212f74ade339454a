"""Monocular-depth DataModule (nyuv2, sunrgbd, kitti, custom_depth, demo_nyu); depth in metres, 0 = unknown."""
from __future__ import annotations

from .datamodule_base import DenseDataModule
from .demo.names import demo_dataset
from .transforms import depth_config


class DepthDataModule(DenseDataModule):
    """The dense probes' view (``DenseDataModule``). Depth benchmarks evaluate their ``test`` split. SUN RGB-D
    and the KITTI/NYU Eigen tests are evaluation sets: set ``train_data``/``train_root`` to train on another
    dataset (e.g. NYUv2 train, then validate on SUN RGB-D).
    ``eval_mask(depth)``: the pixels that count in the metrics (``datamodules.transforms.eval_depth_mask``)."""

    def __init__(self, data: str = "nyuv2", data_root: str = "", val_split: str = "test",
                 train_data: str | None = None, train_root: str | None = None, **kw):
        self.train_data, self.train_root = train_data, train_root
        super().__init__(data, data_root, val_split=val_split, **kw)
        if self.data != "custom_depth":  # custom_depth carries its own settings (datamodules/datasets/custom_depth.py)
            depth_config(demo_dataset(self.data, "demo_nyu"))  # a non-depth name fails now

    def _build(self, split, train=False):
        if train and self.train_data:
            from . import build_dataset
            return build_dataset(self.train_data, self.train_root or self.data_root, split,
                                 skip_corrupt=self.skip_corrupt)
        return super()._build(split, train)

    def eval_mask(self, depth):
        from .transforms import eval_depth_mask
        if self.data == "custom_depth":
            self.setup("validate")
            lo, hi, crop, _ = self.val_set.eval_settings()
            H, W = depth.shape[-2:]
            inside = (depth > lo) & (depth < hi)
            return inside if crop is None else inside & crop(H, W).to(depth.device)
        return eval_depth_mask(self.data, depth)
