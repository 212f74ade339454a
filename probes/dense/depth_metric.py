"""Depth metrics as one torchmetrics Metric, computed like mmsegmentation's DepthMetric and the depth toolbox.

Per image, on valid pixels only (min_depth < gt < max_depth, inside the dataset's evaluation crop; with
``clip``, gt and prediction are first clipped above, SUN RGB-D's 8 m): RMSE, AbsRel, SqRel, delta1-3
(max(gt/pred, pred/gt) < 1.25^k), RMSE-log, log10 and two SILogs, d = log pred - log gt:
  * ``silog_mmseg``   = sqrt(mean(d^2) - 0.5 mean(d)^2), no x100 (mmseg 1.x ``DepthMetric``);
  * ``silog_toolbox`` = 100 sqrt(mean(d^2) - mean(d)^2), 0 where that is NaN (zhyever/Monocular-Depth-
    Estimation-Toolbox ``depth/core/evaluation/metrics.py``).
The dataset value is the mean of the per-image values (as mmseg and the toolbox do), not a pixel-pooled value.
An image without a single valid pixel is skipped (the toolbox's nanmean; mmseg would produce NaN).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torchmetrics import Metric

DEPTH_METRICS = ("d1", "d2", "d3", "abs_rel", "sq_rel", "rmse", "rmse_log", "log10", "silog_mmseg", "silog_toolbox")


def image_depth_metrics(gt: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
    """The metrics of one image's valid pixels (1-D gt, pred), in DEPTH_METRICS order."""
    gt, pred = gt.double(), pred.double()
    ratio = torch.maximum(gt / pred, pred / gt)
    diff = pred - gt
    dlog = pred.log() - gt.log()
    return torch.stack([
        (ratio < 1.25).double().mean(),
        (ratio < 1.25 ** 2).double().mean(),
        (ratio < 1.25 ** 3).double().mean(),
        (diff.abs() / gt).mean(),
        (diff ** 2 / gt).mean(),
        (diff ** 2).mean().sqrt(),
        (dlog ** 2).mean().sqrt(),
        (pred.log10() - gt.log10()).abs().mean(),
        ((dlog ** 2).mean() - 0.5 * dlog.mean() ** 2).sqrt(),
        100 * ((dlog ** 2).mean() - dlog.mean() ** 2).clamp(min=0).sqrt(),  # < 0 only by rounding: NaN -> 0
    ])


class DepthMetrics(Metric):
    """``update(pred, gt, valid=None)``: depth maps (B, H, W) or (B, 1, H, W) in metres; ``valid`` an
    optional extra boolean mask (B, H, W), e.g. the dataset's evaluation crop. ``crop`` may also be a
    function (H, W) -> bool mask applied to every image; ``clip`` clips gt and prediction above before the
    mask. ``compute()`` -> dict of mean per-image values.

    >>> m = DepthMetrics(max_depth=10.0, clip=8.0)   # SUN RGB-D: a 9 m gt counts, as 8 m
    >>> m.update(torch.tensor([[[2.0, 9.5]]]), torch.tensor([[[2.0, 9.0]]]))
    >>> float(m.compute()["rmse"])
    0.0
    """

    full_state_update = False
    higher_is_better = None

    def __init__(self, min_depth: float = 1e-3, max_depth: float = float("inf"),
                 crop: Optional[Callable[[int, int], torch.Tensor]] = None, clip: Optional[float] = None, **kwargs):
        super().__init__(**kwargs)
        self.min_depth, self.max_depth, self.crop = float(min_depth), float(max_depth), crop
        self.clip = None if clip is None else float(clip)
        self.add_state("sums", default=torch.zeros(len(DEPTH_METRICS), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("images", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def eval_mask(self, gt: torch.Tensor) -> torch.Tensor:
        mask = (gt > self.min_depth) & (gt < self.max_depth)
        if self.crop is not None:
            mask &= self.crop(*gt.shape[-2:]).to(gt.device)
        return mask

    def update(self, pred: torch.Tensor, gt: torch.Tensor, valid: Optional[torch.Tensor] = None) -> None:
        if pred.ndim == 4:
            pred = pred.squeeze(1)
        if gt.ndim == 4:
            gt = gt.squeeze(1)
        if pred.shape != gt.shape:
            raise ValueError(f"prediction shape {tuple(pred.shape)} != ground-truth shape {tuple(gt.shape)}; "
                             "upsample the prediction to the label size first")
        if self.clip is not None:
            gt, pred = gt.clamp(max=self.clip), pred.clamp(max=self.clip)
        mask = self.eval_mask(gt)
        if valid is not None:
            mask &= valid.reshape(mask.shape).bool()
        for p, g, m in zip(pred, gt, mask):
            if m.any():
                self.sums += image_depth_metrics(g[m], p[m]).to(self.sums.device)
                self.images += 1

    def compute(self) -> dict[str, torch.Tensor]:
        vals = self.sums / self.images if self.images > 0 else torch.full_like(self.sums, float("nan"))
        return dict(zip(DEPTH_METRICS, vals))
