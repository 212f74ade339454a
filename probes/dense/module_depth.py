"""Linear depth probe (DINOv2 depth BNHead: 256 uniform bins or regression, SigLoss) with the depth metrics."""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

from probes.dense.depth_metric import DepthMetrics
from probes.core.heads import LinearDepthHead, SigLoss
from probes.core.module_base import ProbeModule
from probes.dense.options import DepthHead, DepthOptions
from probes.dense.module_seg import warmup_cosine
from probes.dense.visualize import colour_depth, panel


class DepthProbe(ProbeModule):
    """Depth = head(features) predicted on the patch grid upsampled x``upsample`` (DINOv2 BNHead
    upsample=4), then bilinearly resized to the label size; SigLoss on valid pixels. ``crop``/``clip``: the
    dataset's evaluation protocol (``probes.core.task_table.depth_eval_settings``).
    Optimiser: AdamW, lr 3e-4, wd 1e-2, warm-up + cosine per step."""

    def __init__(self, features, data, min_depth: float = 1e-3, max_depth: float = 10.0,
                 crop: Optional[Callable] = None, clip: Optional[float] = None, classify: bool = True, n_bins: int = 256, norm: str = "linear",
                 upsample: int = 4, lr: float = 3e-4, weight_decay: float = 1e-2, **kw):
        super().__init__(features, data, **kw)
        self.min_depth, self.max_depth, self.upsample = min_depth, max_depth, upsample
        self.lr, self.weight_decay = lr, weight_decay
        self.head = LinearDepthHead(features.out_dim, min_depth, max_depth, classify=classify, n_bins=n_bins,
                                    norm=norm)
        self.loss_fn = SigLoss(min_depth=0.0, max_depth=max_depth)
        self.metric = DepthMetrics(min_depth=min_depth, max_depth=max_depth, crop=crop, clip=clip)
        self.vis_images: dict[int, torch.Tensor] = {}

    def predict_depth(self, feats: torch.Tensor, size) -> torch.Tensor:
        depth = self.head(feats, upsample=self.upsample)
        depth = F.interpolate(depth, size=size, mode="bilinear", align_corners=False)
        return depth.clamp(min=self.min_depth, max=self.max_depth)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        feats = self.get_features(batch, "train")
        gt = batch["depth"]
        if isinstance(gt, list):
            raise ValueError("training depth maps must share one size (the DataModule's training view resizes them)")
        pred = self.predict_depth(feats, gt.shape[-2:])[:, 0]
        loss = self.loss_fn(pred, gt.float())
        self.log("train/loss", loss, prog_bar=True, batch_size=len(gt))
        return loss

    def on_validation_epoch_start(self) -> None:
        self._vis: dict[int, torch.Tensor] = {}

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        feats = self.get_features(batch, "val")
        gts = batch["depth"]
        for j, idx in enumerate(batch["index"].tolist()):
            gt = gts[j].float().to(feats.device)
            pred = self.predict_depth(feats[j:j + 1], gt.shape[-2:])[0, 0]
            self.metric.update(pred[None], gt[None])
            if idx in self.vis_indices:
                if "image" in batch:
                    self.vis_images[idx] = batch["image"][j].cpu()
                if idx in self.vis_images:
                    vmax = float(gt.max().clamp(min=1e-3))
                    self._vis[idx] = panel(self.vis_images[idx], colour_depth(gt, vmax), colour_depth(pred, vmax))

    def on_validation_epoch_end(self) -> None:
        res = {k: v.item() for k, v in self.metric.compute().items()}
        self.metric.reset()
        for k, v in res.items():
            self.log(f"val/{k}", v, prog_bar=k == "rmse")
        self.last_metrics = {**res, "epoch": self.current_epoch}
        self.history.append(dict(self.last_metrics))
        if self._vis:
            self.log_images("pred_depth", [self._vis[i] for i in sorted(self._vis)])

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.head.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = min(max(1, total // 20), 1500)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, total, warmup))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def build_depth(ctx, features, kw: dict) -> DepthProbe:
    """``KINDS[Kind.DEPTH].build``: the dataset's depth range, crop and clip (a custom dataset: its own)."""
    from probes.core.task_table import depth_eval_settings
    opts: DepthOptions = ctx.options
    lo, hi, crop, clip = depth_eval_settings(ctx.dataset, getattr(ctx.dm, "val_set", None))
    return DepthProbe(features, ctx.dm, min_depth=lo, max_depth=hi, crop=crop, clip=clip,
                      classify=opts.depth_head == DepthHead.BINS, norm=opts.bin_norm.value, cache=opts.train.cache,
                      **({"lr": opts.train.lr} if opts.train.lr else {}), **kw)
