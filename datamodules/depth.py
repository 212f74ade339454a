"""Monocular-depth DataModule (nyuv2, sunrgbd, kitti, custom_depth, demo_nyu); depth in metres, 0 = unknown."""
from __future__ import annotations

from .datamodule_base import DenseDataModule
from .demo.names import demo_dataset


class DepthDataModule(DenseDataModule):
    """The dense probes' view (``DenseDataModule``); depth benchmarks evaluate their ``test`` split, and SUN RGB-D and
    the Eigen tests train on another dataset (``train_data``/``train_root``). ``eval_mask(depth)``: the pixels
    that count, by the validation set's protocol (``DepthDataset.eval_settings``)."""

    def __init__(self, data: str = "nyuv2", data_root: str = "", val_split: str = "test",
                 train_data: str | None = None, train_root: str | None = None, **kw):
        self.train_data, self.train_root = train_data, train_root
        super().__init__(data, data_root, val_split=val_split, **kw)
        from .datasets.depth_base import DepthDataset
        from .registry import DATASETS, canonical_name
        if not issubclass(DATASETS[canonical_name(demo_dataset(self.data, "demo_nyu"))], DepthDataset):
            raise ValueError(f"no depth evaluation settings for '{self.data}': not a depth dataset (depth datasets: "
                             f"{', '.join(k for k, c in DATASETS.items() if issubclass(c, DepthDataset))})")

    def _build(self, split, train=False):
        if train and self.train_data:
            from . import build_dataset
            return build_dataset(self.train_data, self.train_root or self.data_root, split,
                                 skip_corrupt=self.skip_corrupt)
        return super()._build(split, train)

    def eval_mask(self, depth):
        from .depth_protocol import settings_mask
        self.setup("validate")
        return settings_mask(self.val_set.eval_settings(), depth)
