"""ImageNet linear probe (DINO eval_linear): [CLS] of the last 4 blocks concatenated, one linear layer,
SGD momentum 0.9, wd 0, lr 0.001 x total batch / 256, cosine over epochs; the best val top-1 is reported."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from tokenmix.topk import TopK

from probes.core.heads import LinearClassifier
from probes.core.module_base import ProbeModule
from probes.core.options import Training


@dataclass(frozen=True)
class LinearOptions:
    train: Training
    aug: bool = True    # not --no-aug: eval_linear's RandomResizedCrop + flip (then the features are not cached)
    bf16: bool = False  # --bf16: the backbone in bf16 autocast on CUDA (DINO: fp32)


def build_linear(ctx, features, kw: dict) -> "LinearClassificationProbe":
    """``KINDS[Kind.LINEAR].build``: the DataModule's train view is eval_linear's RandomResizedCrop + flip."""
    opts: LinearOptions = ctx.options
    return LinearClassificationProbe(features, ctx.dm, ctx.dm.num_classes, lr=opts.train.lr,
                                     cache=not opts.aug and opts.train.cache, **kw)


class LinearClassificationProbe(ProbeModule):
    def __init__(self, features, data, num_classes: int, lr: float | None = None,
                 momentum: float = 0.9, weight_decay: float = 0.0, **kw):
        super().__init__(features, data, **kw)
        self.num_classes = num_classes
        self.lr = lr  # None: 0.001 x total batch (all devices) / 256, set in configure_optimizers
        self.momentum, self.weight_decay = momentum, weight_decay
        self.head = LinearClassifier(features.out_dim, num_classes)
        self.best_top1 = float("-inf")
        # torchmetrics: counts summed over ranks at compute() (every validation sample is on exactly one rank)
        self.topk = TopK(num_classes)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        feats = self.get_features(batch, "train")
        loss = F.cross_entropy(self.head(feats), batch["label"].long())
        self.log("train/loss", loss, prog_bar=True, batch_size=len(feats))
        return loss

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        logits = self.head(self.get_features(batch, "val"))
        y = batch["label"].long().to(logits.device)
        self.topk.update(logits, y)

    def on_validation_epoch_end(self) -> None:
        top1, top5 = self.topk.compute()
        self.best_top1 = max(self.best_top1, top1)
        self.log("val/top1", top1, prog_bar=True)
        self.log("val/top5", top5)
        self.log("val/best_top1", self.best_top1)
        self.last_metrics = {"top1": top1, "top5": top5, "best_top1": self.best_top1, "epoch": self.current_epoch}
        self.history.append(dict(self.last_metrics))

    def configure_optimizers(self):
        lr = self.lr if self.lr is not None else 0.001 * self.batch_size * self.trainer.world_size / 256
        opt = torch.optim.SGD(self.head.parameters(), lr=lr, momentum=self.momentum,
                              weight_decay=self.weight_decay)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, self.trainer.max_epochs), eta_min=0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}
