"""Linear segmentation probe (DINOv2 linear / linear4 head) with mIoU, per-class IoU, pixel accuracy."""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from probes.core.heads import LinearSegHead
from probes.core.module_base import ProbeModule
from probes.dense.options import SegOptions
from probes.dense.seg_metric import SegmentationMetrics
from probes.dense.visualize import colour_mask, panel


def warmup_cosine(step: int, total: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


class SegmentationProbe(ProbeModule):
    """BN + 1x1 conv on frozen patch tokens; logits bilinearly upsampled to the label size;
    cross-entropy ignoring 255. Optimiser: AdamW (lr 1e-3, wd 1e-4 as DINOv2's linear configs), with a
    short linear warm-up and cosine decay per step (DINOv2: poly decay; a stated deviation)."""

    def __init__(self, features, data, num_classes: int, lr: float = 1e-3,
                 weight_decay: float = 1e-4, ignore_index: int = 255, **kw):
        super().__init__(features, data, **kw)
        self.num_classes, self.lr, self.weight_decay, self.ignore_index = num_classes, lr, weight_decay, ignore_index
        self.head = LinearSegHead(features.out_dim, num_classes)
        self.metric = SegmentationMetrics(num_classes, ignore_index=ignore_index)
        self.vis_images: dict[int, torch.Tensor] = {}

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        feats = self.get_features(batch, "train")
        mask = batch["mask"]
        if isinstance(mask, list):
            raise ValueError("training masks must share one size (the DataModule's training view resizes them)")
        logits = F.interpolate(self.head(feats), size=mask.shape[-2:], mode="bilinear", align_corners=False)
        loss = F.cross_entropy(logits, mask.long(), ignore_index=self.ignore_index)
        self.log("train/loss", loss, prog_bar=True, batch_size=len(mask))
        return loss

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        feats = self.get_features(batch, "val")
        logits = self.head(feats)
        masks = batch["mask"]
        for j, idx in enumerate(batch["index"].tolist()):
            gt = masks[j]
            up = F.interpolate(logits[j:j + 1], size=gt.shape[-2:], mode="bilinear", align_corners=False)
            pred = up.argmax(1)
            self.metric.update(pred, gt[None].to(pred.device))
            if idx in self.vis_indices:
                if "image" in batch:
                    self.vis_images[idx] = batch["image"][j].cpu()
                if idx in self.vis_images:
                    self._vis[idx] = panel(self.vis_images[idx], colour_mask(gt), colour_mask(pred[0]))

    def on_validation_epoch_start(self) -> None:
        self._vis: dict[int, torch.Tensor] = {}

    def on_validation_epoch_end(self) -> None:
        res = self.metric.compute()
        self.metric.reset()
        self.log("val/mIoU", res["mIoU"].float() * 100, prog_bar=True)
        self.log("val/aAcc", res["aAcc"].float() * 100)
        self.log("val/mAcc", res["mAcc"].float() * 100)
        self.last_metrics = {
            "mIoU": 100 * res["mIoU"].item(), "aAcc": 100 * res["aAcc"].item(), "mAcc": 100 * res["mAcc"].item(),
            "per_class_IoU": [None if math.isnan(v) else 100 * v for v in res["IoU"].tolist()],
            "epoch": self.current_epoch,
        }
        names = tuple(getattr(self.data, "class_names", ()) or ())
        if len(names) == self.num_classes:  # the same numbers, keyed by class name
            self.last_metrics["per_class_IoU_named"] = dict(zip(names, self.last_metrics["per_class_IoU"]))
        self.history.append({k: v for k, v in self.last_metrics.items() if not k.startswith("per_class_IoU")})
        if self._vis:
            self.log_images("pred_mask", [self._vis[i] for i in sorted(self._vis)])

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.head.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = min(max(1, total // 20), 1500)  # DINOv2: 1500 warm-up iterations of 40k
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, total, warmup))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def build_seg(ctx, features, kw: dict) -> SegmentationProbe:
    """``KINDS[Kind.SEG].build``: the head on the task's DataModule, --lr or the protocol's."""
    opts: SegOptions = ctx.options
    lr = {"lr": opts.train.lr} if opts.train.lr else {}
    return SegmentationProbe(features, ctx.dm, ctx.dm.num_classes, cache=opts.train.cache, **lr, **kw)
