"""The k-NN check of a DINO run: the teacher [CLS] on the train -> val split, sharded over the ranks.

Multi-process rule: ``sharded_features`` is a collective (``all_gather``) that every rank reaches."""
from __future__ import annotations

from typing import Any, Optional

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, Subset

from lightning_modules.callbacks.periodic import epoch_check_due
from tokenmix.knn import knn_classify
from tokenmix.precision import inference_autocast


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
    from probes.core.features import gather_shards, shard_indices
    rank, world = trainer.global_rank, trainer.world_size
    loader = DataLoader(Subset(ds, shard_indices(len(ds), rank, world)), batch_size=batch_size, shuffle=False)
    f, y = backbone_features(model, loader, device)

    def gather(t):  # NCCL gathers device tensors
        return trainer.strategy.all_gather(t.to(device)).cpu()
    return gather_shards(f, len(ds), rank, world, gather), gather_shards(y, len(ds), rank, world, gather)


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
