"""TensorBoard images of fixed validation images: DINO's PCA / attention maps and token statistics
(``PretrainVisuals``), LaSt-ViT's vote-count maps (``VoteMaps``). Rank 0 only: ``log_now`` calls no collective."""
from __future__ import annotations

from typing import Optional

import lightning.pytorch as pl
import torch

from tokenmix.attention_stats import attention_stats as _attention_stats, cls_attention_maps
from tokenmix.pca import pca_rgb as _pca_rgb
from tokenmix.precision import inference_autocast


def _tb(trainer: pl.Trainer):
    from lightning.pytorch.loggers import TensorBoardLogger
    for lg in trainer.loggers:
        if isinstance(lg, TensorBoardLogger):
            return lg.experiment
    return None


def _grid_images(x: torch.Tensor, scale: int) -> torch.Tensor:
    """(B, C, h, w) in [0, 1] -> nearest-upsampled for visibility."""
    return torch.nn.functional.interpolate(x, scale_factor=scale, mode="nearest").clamp(0, 1)


class FixedImagesCallback(pl.Callback):
    """TensorBoard images of a fixed set of validation images, at the start, every ``every_n_epochs`` and at the
    end. Subclasses write ``log_now`` (rank 0 only: it must not call a collective)."""

    def __init__(self, every_n_epochs: int = 1, num_images: int = 8):
        self.every_n_epochs, self.num_images = max(1, every_n_epochs), num_images
        self._images: Optional[torch.Tensor] = None

    def fixed_images(self, ds) -> torch.Tensor:
        """``num_images`` images spread over ``ds`` (class-sorted folders: spread over the classes), kept."""
        if self._images is None:
            idx = torch.linspace(0, len(ds) - 1, min(self.num_images, len(ds))).round().long().tolist()
            self._images = torch.stack([ds[i][0] for i in idx])
        return self._images

    def log_now(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        raise NotImplementedError

    def on_train_start(self, trainer, pl_module):
        self.log_now(trainer, pl_module)

    def on_train_epoch_end(self, trainer, pl_module):
        if (trainer.current_epoch + 1) % self.every_n_epochs == 0:
            self.log_now(trainer, pl_module)

    def on_train_end(self, trainer, pl_module):
        if trainer.current_epoch % self.every_n_epochs != 0:
            self.log_now(trainer, pl_module)


class PretrainVisuals(FixedImagesCallback):
    """Every ``every_n_epochs`` (and at the start and end), fixed validation images through the teacher: PCA maps,
    last-block [CLS] attention per head, per-layer attention sparsity and entropy, and patch-token norms."""

    @torch.no_grad()
    def log_now(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        tb = _tb(trainer)
        if tb is None or trainer.global_rank != 0:
            return
        step = trainer.global_step
        model = pl_module.teacher.backbone
        x = self.fixed_images(trainer.datamodule.eval_dataset(trainer.datamodule.val_split)).to(pl_module.device)
        grid = model.grid_size(x)
        with inference_autocast(x.device):  # bf16 on CUDA (tokenmix/precision.py); read back as fp32 below
            out = model.extract(x, n_last_blocks=model.depth)
            attns = model.attention_maps(x)
        patch = out[-1]["patch"].float()
        tb.add_images("images/pca_patch_features", _grid_images(_pca_rgb(patch.cpu(), grid), model.patch_size),
                      step)
        norms = patch.norm(dim=-1)
        tb.add_scalar("tokens/patch_norm_mean", norms.mean().item(), step)
        tb.add_scalar("tokens/patch_norm_std", norms.std().item(), step)
        tb.add_scalar("tokens/patch_norm_max_over_median", (norms.max() / norms.median()).item(), step)
        for i, o in enumerate(out):
            tb.add_scalar(f"tokens/patch_norm_mean/block{i}", o["patch"].float().norm(dim=-1).mean().item(), step)
        for i, a in enumerate(attns):
            st = _attention_stats(a.float().cpu())
            tb.add_scalar(f"attention/zero_share/block{i}", st["zero_share"].mean().item(), step)
            tb.add_scalar(f"attention/entropy/block{i}", st["entropy"].mean().item(), step)
        last = attns[-1].float()
        cls_maps = cls_attention_maps(last, last.shape[-1] - grid[0] * grid[1], grid)  # (B, heads, h, w)
        cls_maps = cls_maps / cls_maps.amax(dim=(-2, -1), keepdim=True).clamp_min(1e-12)
        heads = cls_maps.shape[1]
        tiles = cls_maps.permute(1, 0, 2, 3).reshape(heads * x.shape[0], 1, grid[0], grid[1])
        tb.add_images("images/cls_attention_last_block", _grid_images(tiles, model.patch_size).cpu(), step)
        mean = torch.tensor(trainer.datamodule.crop_cfg.mean, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(trainer.datamodule.crop_cfg.std, device=x.device).view(1, 3, 1, 1)
        if step == 0 or not getattr(self, "_logged_inputs", False):
            tb.add_images("images/inputs", (x * std + mean).clamp(0, 1).cpu(), step)
            self._logged_inputs = True
        tb.flush()


class VoteMaps(FixedImagesCallback):
    """``lastvit`` variants: TensorBoard images of fixed val images and their vote-count maps (how many of the D
    channels picked each patch), at the start, every ``every_n_epochs`` and at the end; rank 0 only."""

    @torch.no_grad()
    def log_now(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        model = pl_module.backbone
        tb = _tb(trainer)
        if tb is None or trainer.global_rank != 0 or model.aggregator is None:
            return
        if self._images is None:
            self.fixed_images(trainer.datamodule.eval_dataset())
            from datamodules.transforms.views import IMAGENET_MEAN, IMAGENET_STD
            mean, std = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)
            tb.add_images("votes/inputs", (self._images * std + mean).clamp(0, 1), trainer.global_step)
        was = model.training
        model.eval()
        x = self._images.to(pl_module.device)
        votes = model.extract(x, votes=True)[-1]["votes"].float()
        model.train(was)
        grid = model.grid_size(x)
        maps = (votes / votes.amax(1, keepdim=True).clamp_min(1)).reshape(-1, 1, *grid).cpu()
        tb.add_images("votes/vote_count_maps", _grid_images(maps, model.patch_size), trainer.global_step)
        tb.add_scalar("votes/max_share", (votes.amax(1) / votes.sum(1)).mean().item(), trainer.global_step)
        tb.flush()
