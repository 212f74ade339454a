"""Shared machinery of the probe LightningModules: frozen features, feature cache, dataloaders,
prediction images for a fixed set of validation samples."""
from __future__ import annotations

from typing import Any, Optional

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from .data import TARGET_KEYS, collate
from .features import FeatureCache, FrozenFeatures, shard_indices


class _CachedSplit(Dataset):
    """A split replayed from the cache: features plus the targets stored beside them."""

    def __init__(self, cache: FeatureCache, targets: dict[int, dict[str, Any]]):
        self.keys = sorted(cache.feats)
        self.cache, self.targets = cache, targets

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> dict[str, Any]:
        k = self.keys[i]
        return {"index": k, "feats": self.cache.feats[k], **self.targets[k]}


class ProbeModule(L.LightningModule):
    """Trains ``self.head`` on ``self.features`` (frozen). Subclasses define ``head``, ``loss``,
    ``validation_update`` and ``metrics_dict``.

    With ``cache=True`` (no training augmentation) the first epoch stores every sample's features; from
    then on the dataloaders replay the cache and the backbone never runs again (Trainer needs
    ``reload_dataloaders_every_n_epochs=1`` so the switch happens; probes.run sets it)."""

    def __init__(self, features: FrozenFeatures, train_set: Optional[Dataset], val_set: Dataset,
                 batch_size: int = 16, num_workers: int = 0, cache: bool = True, n_vis: int = 4,
                 cache_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.features = features
        self.train_set, self.val_set = train_set, val_set
        self.batch_size, self.num_workers, self.use_cache = batch_size, num_workers, cache
        self.caches = {s: FeatureCache(len(d), cache_dtype) for s, d in (("train", train_set), ("val", val_set))
                       if d is not None}
        self.cached_targets: dict[str, dict[int, dict[str, Any]]] = {"train": {}, "val": {}}
        self.vis_indices = list(range(min(n_vis, len(val_set))))
        self.last_metrics: dict[str, Any] = {}
        self.history: list[dict[str, Any]] = []

    # -- data --------------------------------------------------------------------------------------
    def _shard(self, ds: Dataset, split: str) -> Dataset:
        """This rank's fixed part of a split under DDP (the trainer runs with use_distributed_sampler=False).
        Train: equal lengths, so every rank takes the same number of steps (the last n % world samples
        rest, as DistributedSampler(drop_last=True)); fixed shards keep each rank's feature cache valid.
        Val: every sample exactly once, no padding; torchmetrics sums the states over ranks."""
        world = self._trainer.world_size if self._trainer is not None else 1
        if world == 1:
            return ds
        rank, n = self.global_rank, len(ds)
        return Subset(ds, shard_indices(n - n % world if split == "train" else n, rank, world))

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        ds = self.train_set if split == "train" else self.val_set
        cache = self.caches[split]
        if self.use_cache and cache.complete:
            ds = _CachedSplit(cache, self.cached_targets[split])
            return DataLoader(ds, batch_size=self.batch_size, shuffle=shuffle, collate_fn=collate, num_workers=0)
        ds = self._shard(ds, split)
        cache.size = len(ds)  # complete once this rank's shard is in
        return DataLoader(ds, batch_size=self.batch_size, shuffle=shuffle, collate_fn=collate,
                          num_workers=self.num_workers, persistent_workers=False)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def get_features(self, batch: dict[str, Any], split: str) -> torch.Tensor:
        """Features of a batch: from the cache replay, or computed (and stored when caching)."""
        if "feats" in batch:
            return batch["feats"].float()
        idx = batch["index"].tolist()
        cache = self.caches[split]
        if self.use_cache and cache.has(idx):  # a shuffled sample already computed this epoch
            return cache.get(idx, device=self.device)
        feats = self.features(batch["image"])
        if self.use_cache:
            cache.put(idx, feats)
            for j, k in enumerate(idx):
                self.cached_targets[split][k] = {key: batch[key][j] for key in TARGET_KEYS if key in batch}
        return feats

    def configure_optimizers(self):  # subclasses may override
        raise NotImplementedError

    # -- logging -------------------------------------------------------------------------------------
    def log_images(self, tag: str, images: list[torch.Tensor]) -> None:
        """(3, H, W) float [0, 1] images to TensorBoard, one per fixed validation sample."""
        logger = self.logger
        if logger is None or not hasattr(logger, "experiment") or not hasattr(logger.experiment, "add_image"):
            return
        for i, img in zip(self.vis_indices, images):
            logger.experiment.add_image(f"{tag}/val_{i}", img.clamp(0, 1), global_step=self.current_epoch)
