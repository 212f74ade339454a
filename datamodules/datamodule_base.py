"""Shared Lightning DataModule of the evaluation protocols: dataset name + root + splits + protocol view + loaders.

Every process reads a fixed shard of each split (:class:`ShardSampler`): equal lengths for training (the same
step count everywhere), every sample exactly once for evaluation (no padding: no sample counted twice). Items
carry ``"index"``, their position in the split (the feature cache's key; predict outputs are gathered with it).
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, RandomSampler, Subset, default_collate

from . import transforms

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


def shard_indices(n: int, rank: int, world: int) -> list[int]:
    """The samples rank ``rank`` of ``world`` handles: every world-th, no padding (so none is counted twice).

    >>> shard_indices(5, 1, 2)
    [1, 3]
    """
    return list(range(rank, n, world))


def evenly_spaced(ds: Dataset, n: Optional[int]) -> Dataset:
    """``n`` evenly spaced samples of ``ds`` (every class of a class-sorted folder stays); all when n is None."""
    if not n or n >= len(ds):
        return ds
    return Subset(ds, torch.linspace(0, len(ds) - 1, n).round().long().unique().tolist())


class SplitView(Dataset):
    """One split as the protocol sees it: ``transform(item)`` plus ``"index"``; other attributes are the dataset's."""

    def __init__(self, dataset: Dataset, transform: Optional[Callable[[dict], dict]] = None):
        self.dataset, self.transform = dataset, transform
        self.base = dataset.dataset if isinstance(dataset, Subset) else dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = self.dataset[i]
        if not isinstance(item, dict) or "image" not in item:
            raise TypeError(f"dataset {type(self.base).__name__} item {i}: expected a dict with 'image', got "
                            f"{type(item).__name__}")
        item = self.transform(item) if self.transform is not None else dict(item)
        item["index"] = i
        return item

    def __getattr__(self, name: str):
        if name.startswith("_") or name in ("dataset", "base", "transform"):
            raise AttributeError(name)
        return getattr(self.base, name)


class ShardSampler(DistributedSampler):
    """Process ``rank``'s fixed part of a dataset. ``train=True``: the first n - n % world samples (equal lengths),
    reshuffled every epoch from the global RNG; else every sample once, in order. A DistributedSampler, so
    Lightning never wraps it in its own (padding) one."""

    def __init__(self, dataset: Dataset, rank: int = 0, world: int = 1, train: bool = False):
        super().__init__(dataset, num_replicas=world, rank=rank, shuffle=train, drop_last=train)
        n = len(dataset)
        self.indices = shard_indices(n - n % world if train else n, rank, world)
        self.train = train

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self) -> Iterator[int]:
        if not self.train:
            return iter(self.indices)
        return (self.indices[j] for j in RandomSampler(range(len(self.indices))))


class DataModuleBase(pl.LightningDataModule):
    """Subclasses give ``default_transforms() -> (train, val)``; the base class gives the items as stored.
    ``data_root`` '' = not given (an error naming the layout, except for demo_*); split names '' = none;
    transforms None = the protocol defaults; ``dataset_kwargs``: extra dataset options (e.g. ``{"boxes":
    "auto"}``); ``max_samples``: that many evenly spaced samples of each split (None: all)."""

    def __init__(self, data: str, data_root: str = "", train_split: str = "train", val_split: str = "val",
                 batch_size: int = 32, num_workers: int = 0, train_transform: Optional[Callable] = None,
                 val_transform: Optional[Callable] = None, val_batch_size: Optional[int] = None,
                 dataset_kwargs: Optional[dict] = None, skip_corrupt: bool = False, pin_memory: bool = True,
                 max_samples: Optional[int] = None):
        super().__init__()
        self.data, self.data_root = data, str(data_root or "")
        self.train_split, self.val_split = train_split, val_split
        self.batch_size, self.num_workers = batch_size, num_workers
        self.val_batch_size = val_batch_size or batch_size
        self.dataset_kwargs = dict(dataset_kwargs or {})
        self.skip_corrupt, self.pin_memory, self.max_samples = skip_corrupt, pin_memory, max_samples
        default_train, default_val = self.default_transforms()
        self.train_transform = train_transform or default_train
        self.val_transform = val_transform or default_val
        self.train_set: Optional[SplitView] = None
        self.val_set: Optional[SplitView] = None

    def default_transforms(self) -> tuple[Optional[Callable], Optional[Callable]]:
        return None, None

    def _build(self, split: str, train: bool = False) -> Dataset:
        from . import build_dataset
        return build_dataset(self.data, self.data_root, split, skip_corrupt=self.skip_corrupt, **self.dataset_kwargs)

    def setup(self, stage: Optional[str] = None) -> None:
        if stage in (None, "fit", "predict") and self.train_set is None and self.train_split:
            self.train_set = SplitView(evenly_spaced(self._build(self.train_split, True), self.max_samples),
                                       self.train_transform)
        if self.val_set is None and self.val_split:
            self.val_set = SplitView(evenly_spaced(self._build(self.val_split), self.max_samples), self.val_transform)

    def _rank_world(self) -> tuple[int, int]:
        t = self.trainer
        return (t.global_rank, t.world_size) if t is not None else (0, 1)

    def loader(self, ds: Dataset, batch_size: int, train: bool) -> DataLoader:
        """This process's shard of ``ds`` in batches (``train``: equal-length shards, reshuffled each epoch)."""
        rank, world = self._rank_world()
        return DataLoader(ds, batch_size=batch_size, sampler=ShardSampler(ds, rank, world, train),
                          num_workers=self.num_workers, collate_fn=dense_collate,
                          pin_memory=self.pin_memory and torch.cuda.is_available())

    def train_dataloader(self) -> DataLoader:
        self.setup("fit")
        return self.loader(self.train_set, self.batch_size, train=True)

    def val_dataloader(self) -> DataLoader:
        self.setup("validate")
        return self.loader(self.val_set, self.val_batch_size, train=False)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()

    def predict_dataloader(self) -> list[DataLoader]:
        """Every split in order, each sharded without padding (k-NN embeds train and val)."""
        self.setup("predict")
        return [self.loader(ds, self.val_batch_size, train=False) for ds in (self.train_set, self.val_set)
                if ds is not None]

    def num_skipped(self) -> int:
        """Samples skipped in this process (skip_corrupt=True); worker processes keep their own counts."""
        return sum(ds.num_skipped for ds in (self.train_set, self.val_set) if ds is not None)


class DenseDataModule(DataModuleBase):
    """Images resized to ``img_size`` (h, w), rounded down to multiples of ``patch_size``; training targets follow
    (batches stack), validation targets keep the label size (batches hold lists when sizes differ)."""

    def __init__(self, data: str, data_root: str = "", img_size=(448, 448), patch_size: int = 16, **kw):
        self.img_size = transforms.floor_to_multiple(img_size, patch_size)
        super().__init__(data, data_root, **kw)

    def default_transforms(self):
        return (transforms.FixedResize(self.img_size, targets=True),
                transforms.FixedResize(self.img_size, targets=False))
