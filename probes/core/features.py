"""Frozen features for the probes, and the cache that computes them only once.

``FrozenFeatures`` turns uint8 images into what a probe head consumes:
- ``kind="cls"``: the [CLS] outputs of the chosen blocks concatenated (DINO eval_linear: last 4 blocks);
- ``kind="dense"``: the patch grid (B, C, h, w) of the chosen blocks concatenated along channels, each
  optionally followed by its [CLS] broadcast over the grid (DINOv2 linear heads).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn as nn

from torch.utils.data import DataLoader

from datamodules.datamodule_base import ShardSampler, shard_indices
from datamodules.transforms.views import normalize
from tokenmix.precision import inference_autocast


@dataclass
class FeatureSpec:
    kind: str = "dense"                       # "cls" | "dense"
    n_last_blocks: int = 1                    # used when blocks is None
    blocks: Optional[Sequence[int]] = None    # explicit block indices (layer-wise probing)
    with_cls: bool = False                    # dense: append [CLS] broadcast to every patch

    def describe(self) -> dict:
        return {"kind": self.kind, "n_last_blocks": self.n_last_blocks,
                "blocks": list(self.blocks) if self.blocks is not None else None, "with_cls": self.with_cls}


normalize_images = normalize  # uint8 (B, 3, H, W) -> float, ImageNet mean/std (what DINO backbones were trained on)


class FrozenFeatures(nn.Module):
    """A backbone that never trains (eval mode, no grad) plus the feature recipe of one probe."""

    def __init__(self, backbone: nn.Module, spec: FeatureSpec):
        super().__init__()
        self.backbone, self.spec = backbone, spec
        for p in self.backbone.parameters():
            p.requires_grad_(False)
        self.backbone.eval()
        depth = int(getattr(backbone, "depth", 1))
        if spec.blocks is not None:
            bad = [b for b in spec.blocks if not -depth <= int(b) < depth]
            if bad and depth > 1:
                raise ValueError(f"block index {bad} out of range for a {depth}-block backbone (valid 0..{depth - 1})")
        self.n_blocks = len(spec.blocks) if spec.blocks is not None else spec.n_last_blocks
        if depth == 1:  # raw pixels: one "block" only
            self.n_blocks = 1
        per_block = backbone.embed_dim * (2 if spec.kind == "dense" and spec.with_cls else 1)
        self.out_dim = per_block * self.n_blocks

    def train(self, mode: bool = True):  # the backbone stays in eval mode (drop-path, BN-free but be safe)
        super().train(mode)
        self.backbone.eval()
        return self

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = normalize_images(images)
        bb, spec = self.backbone, self.spec
        with inference_autocast(x.device):  # bf16 on CUDA (tokenmix/precision.py); the features leave as fp32
            if getattr(bb, "depth", 1) == 1:
                outs = bb.extract(x, n_last_blocks=1)
            elif spec.blocks is not None:
                outs = bb.extract(x, blocks=list(spec.blocks))
            else:
                outs = bb.extract(x, n_last_blocks=spec.n_last_blocks)
        outs = [{k: v.float() if torch.is_tensor(v) else v for k, v in o.items()} for o in outs]
        if spec.kind == "cls":
            return torch.cat([o["cls"] for o in outs], dim=-1)
        h, w = bb.grid_size(x)
        maps = []
        for o in outs:
            patch = o["patch"]
            B, N, D = patch.shape
            grid = patch.transpose(1, 2).reshape(B, D, h, w)
            maps.append(grid)
            if spec.with_cls:
                maps.append(o["cls"][:, :, None, None].expand(B, D, h, w))
        return torch.cat(maps, dim=1).contiguous()


class FeatureCache:
    """Features of a fixed (augmentation-free) dataset, by sample index, filled during the first epoch.

    Stored on CPU; ``dtype=torch.float16`` halves the memory for large datasets."""

    def __init__(self, size: int, dtype: torch.dtype = torch.float32):
        self.size, self.dtype = int(size), dtype
        self.feats: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self.feats)

    @property
    def complete(self) -> bool:
        return len(self.feats) >= self.size

    def has(self, indices: Sequence[int]) -> bool:
        return all(int(i) in self.feats for i in indices)

    def put(self, indices: Sequence[int], feats: torch.Tensor) -> None:
        for i, f in zip(indices, feats.detach().to("cpu", self.dtype)):
            self.feats[int(i)] = f.clone()

    def get(self, indices: Sequence[int], device=None) -> torch.Tensor:
        return torch.stack([self.feats[int(i)] for i in indices]).to(device=device, dtype=torch.float32)


def gather_shards(local: torch.Tensor, n: int, rank: int, world: int, all_gather) -> torch.Tensor:
    """Inverse of ``shard_indices`` (``datamodules.datamodule_base``): each rank's (len(shard), ...) rows -> all
    ``n`` rows in dataset order, on every rank. ``all_gather(t) -> (world, *t.shape)`` is a collective (e.g.
    ``trainer.strategy.all_gather``): every rank must call this. Shards differ in length by at most one; they are
    padded for the collective and the padding is dropped again."""
    if world == 1:
        return local
    per = -(-n // world)
    mine = len(shard_indices(n, rank, world))
    if local.shape[0] != mine:
        raise ValueError(f"rank {rank}: {local.shape[0]} rows, but its shard of {n} has {mine}")
    padded = torch.cat([local, local.new_zeros((per - local.shape[0], *local.shape[1:]))])
    gathered = all_gather(padded).reshape(world, per, *local.shape[1:])
    out = local.new_empty((n, *local.shape[1:]))
    for r in range(world):
        out[r::world] = gathered[r, :len(shard_indices(n, r, world))].to(out.device)
    return out


def extraction_module(features: FrozenFeatures):
    """A LightningModule whose ``trainer.predict(module, datamodule=dm)`` embeds every split of ``dm`` (items with
    "image" and "label"; a ``datamodules`` DataModule shards each split without padding) and gathers them:
    afterwards ``module.results[i]`` is (features, labels) of split i in dataset order, identical on every rank.

    >>> # m = extraction_module(FrozenFeatures(vit, FeatureSpec(kind="cls")))
    >>> # L.Trainer(devices=2).predict(m, datamodule=ClassificationDataModule(...), return_predictions=False)
    """
    import lightning as L

    class FeatureExtraction(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.features = features
            self.results: list[tuple[torch.Tensor, torch.Tensor]] = []
            self._local: list[list[tuple[torch.Tensor, torch.Tensor]]] = []

        def on_predict_epoch_start(self) -> None:
            self._local = [[] for _ in self.trainer.predict_dataloaders]

        def predict_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
            self._local[dataloader_idx].append((self.features(batch["image"]).float(),
                                                torch.as_tensor(batch["label"]).to(self.device)))
            return self._local[dataloader_idx][-1]  # return_predictions=False: Lightning keeps nothing

        def on_predict_epoch_end(self) -> None:  # every rank: all_gather is a collective
            rank, world = self.global_rank, self.trainer.world_size
            self.results = []
            for loader, parts in zip(self.trainer.predict_dataloaders, self._local):
                n = len(loader.dataset)
                f = torch.cat([p[0] for p in parts]) if parts else torch.zeros(0, features.out_dim, device=self.device)
                y = torch.cat([p[1] for p in parts]) if parts else torch.zeros(0, dtype=torch.long, device=self.device)
                self.results.append((gather_shards(f, n, rank, world, self.all_gather).cpu(),
                                     gather_shards(y, n, rank, world, self.all_gather).cpu()))
            self._local = []

    return FeatureExtraction()


def sharded_predict(trainer, net: nn.Module, dataset, step: Callable, end: Callable, *, batch_size: int,
                    collate_fn: Callable, num_workers: int = 0) -> Any:
    """``trainer.predict`` over ``dataset`` sharded over the trainer's processes (``ShardSampler``): ``step(module,
    batch)`` per batch, its outputs kept in ``module.local``; ``end(module)`` once on every process (collectives go
    there), whose value is returned. ``net`` is ``module.net``: Lightning moves it to the device."""
    import lightning as L

    class Pass(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net, self.local, self.result = net, [], None

        def predict_dataloader(self):
            sampler = ShardSampler(dataset, self.global_rank, self.trainer.world_size, train=False)
            return DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate_fn,
                              num_workers=num_workers)

        def predict_step(self, batch, batch_idx: int):
            self.local.append(step(self, batch))
            return self.local[-1]  # return_predictions=False: Lightning keeps nothing

        def on_predict_epoch_end(self):
            self.result = end(self)

    module = Pass()
    trainer.predict(module, return_predictions=False)
    return module.result
