"""Shared machinery of the probe LightningModules: frozen features, feature cache, the DataModule's loaders,
prediction images for a fixed set of validation samples."""
from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from datamodules.datamodule_base import DataModuleBase, dense_collate

from probes.core.features import FeatureCache, FrozenFeatures

TARGET_KEYS = ("mask", "depth", "label")  # what the cache keeps beside the features


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
    """Trains ``self.head`` on ``self.features`` (frozen), on the splits of ``data`` (a ``datamodules`` DataModule:
    its datasets, its per-process shards, its loaders). Subclasses define ``head``, ``loss``, ``validation_update``
    and ``metrics_dict``.

    With ``cache=True`` (no training augmentation) the first epoch stores every sample's features; from
    then on the dataloaders replay the cache and the backbone never runs again (Trainer needs
    ``reload_dataloaders_every_n_epochs=1`` so the switch happens; probes.run sets it)."""

    def __init__(self, features: FrozenFeatures, data: DataModuleBase, cache: bool = True, n_vis: int = 4,
                 cache_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.features, self.data, self.use_cache = features, data, cache
        data.setup("fit")
        self.caches = {"train": FeatureCache(len(data.train_set), cache_dtype),
                       "val": FeatureCache(len(data.val_set), cache_dtype)}
        self.cached_targets: dict[str, dict[int, dict[str, Any]]] = {"train": {}, "val": {}}
        self.vis_indices = list(range(min(n_vis, len(data.val_set))))
        self.last_metrics: dict[str, Any] = {}
        self.history: list[dict[str, Any]] = []

    @property
    def batch_size(self) -> int:
        return self.data.batch_size

    # -- data --------------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        self.data.trainer = self.trainer  # the DataModule shards by this trainer's rank and world size

    def _loader(self, split: str) -> DataLoader:
        """The DataModule's loader of this process's fixed shard (train: equal lengths; val: every sample once),
        or the cache replay once the shard's features are all in."""
        cache = self.caches[split]
        if self.use_cache and cache.complete:
            ds = _CachedSplit(cache, self.cached_targets[split])
            return DataLoader(ds, batch_size=self.batch_size, shuffle=split == "train", collate_fn=dense_collate)
        loader = self.data.train_dataloader() if split == "train" else self.data.val_dataloader()
        cache.size = len(loader.sampler)  # complete once this rank's shard is in
        return loader

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

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
