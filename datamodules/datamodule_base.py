"""Shared Lightning DataModule: dataset name + root + splits + transforms + loader settings from config."""
from __future__ import annotations

from typing import Any, Callable, Optional

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, default_collate

LIST_KEYS = ("boxes", "box_labels", "box_difficult", "path")  # per-image lengths differ: always lists


def dense_collate(items: list[dict]) -> dict[str, Any]:
    """Stack tensors of equal shape; keep lists for per-image sizes (eval masks at label size, boxes, paths)."""
    out: dict[str, Any] = {}
    for key in items[0]:
        vals = [it[key] for it in items]
        if key in LIST_KEYS:
            out[key] = vals
        elif isinstance(vals[0], torch.Tensor) and any(v.shape != vals[0].shape for v in vals):
            out[key] = vals
        else:
            out[key] = default_collate(vals)
    return out


class DataModuleBase(pl.LightningDataModule):
    """Subclasses give ``default_transforms() -> (train, val)``.

    Args:
        data: dataset name for ``datamodules.build_dataset`` (``demo_*`` for the generated data).
        data_root: dataset folder ('' = not given: an error naming the expected layout, except for demo_*).
        train_split / val_split: split names of that dataset.
        train_transform / val_transform: dict -> dict callables; None = the protocol defaults.
        dataset_kwargs: extra options for the dataset (e.g. {"split_file": ...}, {"boxes": "auto"}).
        skip_corrupt: skip and count unreadable samples instead of raising.
    """

    def __init__(self, data: str, data_root: str = "", train_split: str = "train", val_split: str = "val",
                 batch_size: int = 32, num_workers: int = 4, train_transform: Optional[Callable] = None,
                 val_transform: Optional[Callable] = None, val_batch_size: Optional[int] = None,
                 dataset_kwargs: Optional[dict] = None, skip_corrupt: bool = False, pin_memory: bool = True):
        super().__init__()
        self.data, self.data_root = data, data_root or ""
        self.train_split, self.val_split = train_split, val_split
        self.batch_size, self.num_workers = batch_size, num_workers
        self.val_batch_size = val_batch_size or batch_size
        self.dataset_kwargs = dict(dataset_kwargs or {})
        self.skip_corrupt, self.pin_memory = skip_corrupt, pin_memory
        default_train, default_val = self.default_transforms()
        self.train_transform = train_transform or default_train
        self.val_transform = val_transform or default_val
        self.train_set = self.val_set = None

    def default_transforms(self) -> tuple[Callable, Callable]:
        raise NotImplementedError

    def _build(self, split: str, transform, train: bool = False):
        from . import build_dataset
        return build_dataset(self.data, self.data_root, split, transform=transform, skip_corrupt=self.skip_corrupt,
                             **self.dataset_kwargs)

    def setup(self, stage: Optional[str] = None) -> None:
        if stage in (None, "fit") and self.train_set is None and self.train_split:
            self.train_set = self._build(self.train_split, self.train_transform, train=True)
        if stage in (None, "fit", "validate", "test", "predict") and self.val_set is None and self.val_split:
            self.val_set = self._build(self.val_split, self.val_transform)

    def _loader(self, ds, batch_size: int, shuffle: bool, drop_last: bool) -> DataLoader:
        return DataLoader(ds, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last,
                          num_workers=self.num_workers, collate_fn=dense_collate,
                          pin_memory=self.pin_memory and torch.cuda.is_available(),
                          persistent_workers=self.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        self.setup("fit")
        drop_last = len(self.train_set) > self.batch_size
        return self._loader(self.train_set, self.batch_size, shuffle=True, drop_last=drop_last)

    def val_dataloader(self) -> DataLoader:
        self.setup("validate")
        return self._loader(self.val_set, self.val_batch_size, shuffle=False, drop_last=False)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()

    def num_skipped(self) -> int:
        """Samples skipped in this process (skip_corrupt=True); worker processes keep their own counts."""
        return sum(ds.num_skipped for ds in (self.train_set, self.val_set) if ds is not None)
