"""Watch a DINO run: TensorBoard images / attention + token statistics, the k-NN check, and a summary.

Multi-process rule: a collective (``trainer.log_dir``, ``all_gather``) is reached by every rank; rank-0-only
work (TensorBoard images, summary.json) comes after it and calls none."""
from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any, Optional

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader, Subset

from tokenmix.attention_stats import attention_stats as _attention_stats
from tokenmix.knn import knn_classify
from tokenmix.pca import pca_rgb as _pca_rgb
from tokenmix.precision import inference_autocast
from tokenmix.results import write_summary


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
    """Every ``every_n_epochs`` (and at the start and end), on a fixed set of validation images through the
    teacher backbone: PCA maps of the patch features, [CLS] attention maps of the last block (per head),
    per-layer attention sparsity and entropy, and patch-token norm statistics."""

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
        prefix = last.shape[-1] - grid[0] * grid[1]
        cls_maps = last[:, :, 0, prefix:].reshape(x.shape[0], -1, grid[0], grid[1])  # (B, heads, h, w)
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



@torch.no_grad()
def backbone_features(model: torch.nn.Module, loader, device) -> tuple[torch.Tensor, torch.Tensor]:
    feats, labels = [], []
    for x, y in loader:
        with inference_autocast(device):
            feats.append(model(x.to(device)).float().cpu())
        labels.append(torch.as_tensor(y))
    if not feats:  # an empty shard (fewer samples than ranks)
        return torch.zeros(0, model.embed_dim), torch.zeros(0, dtype=torch.long)
    return torch.cat(feats), torch.cat(labels)


def sharded_features(trainer: pl.Trainer, model: torch.nn.Module, ds, device,
                     batch_size: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Features of all of ``ds`` on every rank, each rank embedding only its shard (a collective: every rank
    calls it)."""
    from probes.features import gather_shards, shard_indices
    rank, world = trainer.global_rank, trainer.world_size
    loader = DataLoader(Subset(ds, shard_indices(len(ds), rank, world)), batch_size=batch_size, shuffle=False)
    f, y = backbone_features(model, loader, device)

    def gather(t):  # NCCL gathers device tensors
        return trainer.strategy.all_gather(t.to(device)).cpu()
    return gather_shards(f, len(ds), rank, world, gather), gather_shards(y, len(ds), rank, world, gather)


def epoch_check_due(trainer: pl.Trainer, every_n_epochs: int) -> bool:
    """At an epoch end: whether a periodic check (``every_n_epochs``, 0 = off) runs now. Never after the last
    epoch, where the check's ``on_train_end`` runs anyway."""
    last = trainer.max_epochs is not None and trainer.current_epoch + 1 >= trainer.max_epochs
    return bool(every_n_epochs) and (trainer.current_epoch + 1) % every_n_epochs == 0 and not last


class KNNCheck(pl.Callback):
    """DINO weighted k-NN (k=20, T=0.07) of the teacher [CLS] on the train -> val split, at the exact
    starting weights (before the first step) and at the end of training; logs ``knn/*`` and the gain.
    With ``every_n_epochs`` it also logs ``knn/top1`` at those epoch ends (a learning curve in TensorBoard).
    Under DDP each rank embeds a shard and the features are gathered, so every rank gets the same numbers."""

    def __init__(self, k: int = 20, temperature: float = 0.07, max_train: Optional[int] = None,
                 every_n_epochs: int = 0):
        self.k, self.temperature, self.max_train = k, temperature, max_train
        self.every_n_epochs = every_n_epochs
        self.random_init_top1: Optional[float] = None
        self.final_top1: Optional[float] = None

    def state_dict(self) -> dict[str, Any]:
        return {"random_init_top1": self.random_init_top1}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.random_init_top1 = state_dict.get("random_init_top1")

    def evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> float:
        dm = trainer.datamodule
        model = pl_module.teacher.backbone
        was_training = model.training
        model.eval()
        train = dm.eval_dataset(dm.train_split)
        if self.max_train and len(train) > self.max_train:  # evenly spread subset, deterministic
            train = Subset(train, torch.linspace(0, len(train) - 1, self.max_train).round().long().tolist())
        tr_f, tr_y = sharded_features(trainer, model, train, pl_module.device)
        va_f, va_y = sharded_features(trainer, model, dm.eval_dataset(dm.val_split), pl_module.device)
        model.train(was_training)
        num_classes = int(max(tr_y.max(), va_y.max())) + 1
        pred = knn_classify(tr_f, tr_y, va_f, num_classes, k=self.k, T=self.temperature)
        return 100.0 * (pred == va_y).float().mean().item()

    def on_train_start(self, trainer, pl_module):
        if self.random_init_top1 is None and trainer.global_step == 0:
            self.random_init_top1 = self.evaluate(trainer, pl_module)
            rank_zero_info(f"k-NN top-1 at random init (exact starting weights): {self.random_init_top1:.2f}%")
            for lg in trainer.loggers:
                lg.log_metrics({"knn/top1_random_init": self.random_init_top1}, step=0)

    def on_train_epoch_end(self, trainer, pl_module):
        if epoch_check_due(trainer, self.every_n_epochs):
            top1 = self.evaluate(trainer, pl_module)
            for lg in trainer.loggers:
                lg.log_metrics({"knn/top1": top1}, step=trainer.global_step)
            rank_zero_info(f"k-NN top-1 after epoch {trainer.current_epoch}: {top1:.2f}%")

    def on_train_end(self, trainer, pl_module):
        self.final_top1 = self.evaluate(trainer, pl_module)
        metrics = {"knn/top1": self.final_top1}
        if self.random_init_top1 is not None:
            metrics["knn/top1_random_init"] = self.random_init_top1
            metrics["knn/gain"] = self.final_top1 - self.random_init_top1
        for lg in trainer.loggers:
            lg.log_metrics(metrics, step=trainer.global_step)
        # ``self.log`` is not allowed in on_train_end: publish where callbacks read metrics (RunSummary does)
        trainer.callback_metrics.update({k: torch.tensor(v, dtype=torch.float64) for k, v in metrics.items()})  # exact
        rank_zero_info("k-NN top-1: " + ", ".join(f"{k}={v:.2f}" for k, v in metrics.items()))


class RunSummary(pl.Callback):
    """Loss at the start vs the end, the collapse watch verdict and the k-NN numbers -> summary.json in the
    log folder (and printed). Collapse: per-image teacher entropy near ln K (uniform) or batch-mean entropy
    near 0 (one prototype for every image).

    Reads only logged metrics (``trainer.callback_metrics``): ``train/loss`` (every step), ``collapse/*`` (the
    module's statistics steps) and ``knn/*`` (``KNNCheck``, placed before this callback). The losses stay
    tensors on their device until the end (no host sync per step); ``state_dict`` turns them into floats."""

    def __init__(self, window: int = 20, uniform_frac: float = 0.98, one_hot_frac: float = 0.05):
        self.window, self.uniform_frac, self.one_hot_frac = window, uniform_frac, one_hot_frac
        self.first: list[Any] = []  # tensors, or floats after a resume
        self.last: deque = deque(maxlen=window)
        self.last_stats: dict[str, Any] = {}

    def state_dict(self) -> dict[str, Any]:
        return {"first": [float(x) for x in self.first]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.first = list(state_dict.get("first", []))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        metrics = trainer.callback_metrics
        loss = metrics.get("train/loss")
        if loss is None:
            return
        if len(self.first) < self.window:
            self.first.append(loss)
        self.last.append(loss)
        self.last_stats.update((k, v) for k, v in metrics.items() if k.startswith("collapse/"))
        self.last_stats["train/loss"] = loss

    def collapse_verdict(self) -> tuple[bool, str]:
        ent = _as_float(self.last_stats.get("collapse/teacher_entropy_frac"))
        bent = _as_float(self.last_stats.get("collapse/batch_mean_entropy_frac"))
        if ent is None or bent is None:
            return True, "no statistics"
        if ent > self.uniform_frac:
            return False, f"uniform collapse: teacher entropy {ent:.3f} x ln K"
        if bent < self.one_hot_frac:
            return False, f"one-prototype collapse: batch-mean entropy {bent:.3f} x ln K"
        return True, f"healthy (teacher entropy {ent:.3f} x ln K, batch-mean entropy {bent:.3f} x ln K)"

    def on_train_end(self, trainer, pl_module):
        log_dir = trainer.log_dir or trainer.default_root_dir  # a broadcast: every rank must ask
        if trainer.global_rank != 0:
            return
        summary = self.summary(trainer, pl_module)
        if not summary["collapse_healthy"]:
            rank_zero_warn(f"collapse watch: {summary['collapse']}")
        write_summary(log_dir, objective="dino", variant=pl_module.hparams.variant, metrics=summary,
                      data=getattr(trainer.datamodule, "data", None), backbone_config=dict(pl_module.backbone.config),
                      config=dict(pl_module.hparams),
                      checkpoint=getattr(trainer.checkpoint_callback, "last_model_path", None))
        fmt = {k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in summary.items()
               if not k.startswith("collapse/") and not isinstance(v, list)}  # series: in the file only
        rank_zero_info("pretraining summary: " + ", ".join(f"{k}={v}" for k, v in fmt.items()))
        rank_zero_info(f"summary written to {Path(log_dir) / 'summary.json'}")

    def summary(self, trainer, pl_module) -> dict[str, Any]:
        """The summary.json dict (plain python values)."""
        healthy, why = self.collapse_verdict()
        first, last = [float(x) for x in self.first], [float(x) for x in self.last]
        knn = {k: _as_float(trainer.callback_metrics.get(f"knn/{k}")) for k in ("top1_random_init", "top1", "gain")}
        return {"variant": pl_module.hparams.variant, "arch": pl_module.hparams.arch, "steps": trainer.global_step,
                "epochs": trainer.current_epoch,
                "loss_start": sum(first) / len(first) if first else None,
                "loss_end": sum(last) / len(last) if last else None,
                "collapse_healthy": healthy, "collapse": why,
                **{k: _as_float(v) for k, v in self.last_stats.items()},
                **({f"knn_{k}": v for k, v in knn.items()} if knn["top1"] is not None else {}),
                **getattr(trainer.datamodule, "data_report", dict)(),  # DATA=folder: index, unreadable files
                **{k: v for cb in trainer.callbacks if callable(getattr(cb, "summary_entries", None))
                   for k, v in cb.summary_entries().items()}}  # DenseProbeCheck: its series


def _as_float(v: Any) -> Optional[float]:
    return None if v is None else float(v)
