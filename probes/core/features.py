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
from tokenmix.cli import Launch
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
    """A backbone that never trains (eval mode, no grad) plus the feature recipe of one probe. ``bf16``: the
    backbone under bf16 autocast on CUDA (tokenmix/precision.py); False: fp32, as DINO's protocols run."""

    def __init__(self, backbone: nn.Module, spec: FeatureSpec, bf16: bool = True):
        super().__init__()
        self.backbone, self.spec, self.bf16 = backbone, spec, bf16
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
        with inference_autocast(x.device, self.bf16):  # bf16 on CUDA unless fp32 is asked; features leave as fp32
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


def gather_objects(module, dst: Optional[int] = None) -> Optional[list]:
    """Every process's ``module.local`` (picklable items), concatenated in rank order: on every process, or on
    rank ``dst`` alone (None elsewhere). A collective: every process calls it."""
    world = module.trainer.world_size
    if world == 1:
        return list(module.local)
    import torch.distributed as dist
    parts = [None] * world if dst is None or module.global_rank == dst else None
    if dst is None:
        dist.all_gather_object(parts, module.local)
    else:
        dist.gather_object(module.local, parts, dst=dst)
    return None if parts is None else [x for part in parts for x in part]


def gather_rows(module, n: int) -> tuple[torch.Tensor, ...]:
    """``module.local`` (one tuple of tensors per batch, rows in shard order) -> each field's ``n`` rows in dataset
    order, on the CPU of every process (``gather_shards``). An empty shard gives each field's row shape from one
    forward of the first item, so that it can take part in the collective."""
    local = module.local or [tuple(x[:0] for x in module.step_one())]
    return tuple(gather_shards(torch.cat(field), n, module.global_rank, module.trainer.world_size,
                               module.all_gather).cpu() for field in zip(*local))


def sharded_predict(launch: Launch, net: nn.Module, datasets: Sequence, step: Callable, *, batch_size: int,
                    collate_fn: Callable, num_workers: int = 0, progress: bool = False,
                    end: Optional[Callable] = None, move_batch: bool = True) -> list:
    """The one sharded extraction of the probes, the analyses and DAVIS: one ``trainer.predict`` (the probes'
    Trainer on ``launch``, ``pass_trainer``) over each of ``datasets``, each sharded over the processes
    (``ShardSampler``: every world-th item, no padding); ``step(module, batch)`` per batch with the net as
    ``module.net`` (moved to the device by Lightning), its outputs kept in ``module.local``. Per dataset,
    ``end(module)`` runs once on every process (collectives go there); by default ``gather_rows``: ``step``
    returns a tuple of tensors and every process gets each field in dataset order. Returns one ``end`` value per
    dataset. ``move_batch=False``: batches reach ``step`` as collated."""
    import lightning as L

    from probes.core.trainer import pass_trainer

    class ShardedPass(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net, self.local, self.results, self._locals, self._i = net, [], [], [], 0

        def predict_dataloader(self):
            return [DataLoader(ds, batch_size=batch_size, collate_fn=collate_fn, num_workers=num_workers,
                               sampler=ShardSampler(ds, self.global_rank, self.trainer.world_size, train=False))
                    for ds in datasets]

        def transfer_batch_to_device(self, batch, device, dataloader_idx):
            return super().transfer_batch_to_device(batch, device, dataloader_idx) if move_batch else batch

        def step_one(self):
            one = collate_fn([datasets[self._i][0]])
            return step(self, self.transfer_batch_to_device(one, self.device, self._i))

        def on_predict_epoch_start(self):
            self._locals = [[] for _ in datasets]

        def predict_step(self, batch, batch_idx: int, dataloader_idx: int = 0):
            self._locals[dataloader_idx].append(step(self, batch))
            return self._locals[dataloader_idx][-1]  # return_predictions=False: Lightning keeps nothing

        def on_predict_epoch_end(self):
            for i, ds in enumerate(datasets):  # every process, in the same order: the collectives match
                self._i, self.local = i, self._locals[i]
                self.results.append(end(self) if end is not None else gather_rows(self, len(ds)))

    module = ShardedPass()
    pass_trainer(launch, progress).predict(module, return_predictions=False)
    return module.results
