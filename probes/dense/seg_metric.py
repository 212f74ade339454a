"""Segmentation metrics as one torchmetrics Metric: mIoU, per-class IoU, pixel accuracy.

Built on torchmetrics' confusion matrix (ignore_index=255 dropped before counting) and its Jaccard
reduction, so the numbers follow mmsegmentation's IoUMetric: intersections/unions are summed over the
whole evaluation set first, and classes absent from both prediction and ground truth (union 0) are left
out of the mean (mmseg: NaN + nanmean).
"""
from __future__ import annotations

import torch
from torchmetrics.classification import MulticlassConfusionMatrix
from torchmetrics.functional.classification.jaccard import _jaccard_index_reduce


class SegmentationMetrics(MulticlassConfusionMatrix):
    """``update(preds, target)``: preds as labels (B, H, W) or logits (B, C, H, W); target (B, H, W)
    with ``ignore_index`` for unlabelled pixels. ``compute()`` -> dict of tensors:
    mIoU, IoU (per class, NaN where the class never occurs), aAcc (pixel accuracy), mAcc."""

    def __init__(self, num_classes: int, ignore_index: int = 255, **kwargs):
        # validate_args off: its unique() over every pixel costs more than the update itself
        kwargs.setdefault("validate_args", False)
        super().__init__(num_classes=num_classes, ignore_index=ignore_index, **kwargs)

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        if preds.ndim == target.ndim + 1:  # logits
            preds = preds.argmax(dim=1)
        if preds.shape != target.shape:
            raise ValueError(f"prediction shape {tuple(preds.shape)} != label shape {tuple(target.shape)}; "
                             "upsample logits to the label size first")
        bad = (target != self.ignore_index) & ((target < 0) | (target >= self.num_classes))
        if bad.any():
            raise ValueError(f"label values {target[bad].unique()[:10].tolist()} outside [0, {self.num_classes}) "
                             f"and not the ignore index {self.ignore_index}")
        if preds.device.type != "cpu":
            super().update(preds, target)
            return
        # CPU bincount is deterministic; torchmetrics' deterministic-mode fallback (enabled globally by a
        # deterministic Trainer earlier in the process) would build a (pixels x C^2) matrix instead
        valid = target != self.ignore_index
        idx = target[valid].long() * self.num_classes + preds[valid].long()
        self.confmat += torch.bincount(idx, minlength=self.num_classes ** 2).reshape(
            self.num_classes, self.num_classes).to(self.confmat.dtype)

    def compute(self) -> dict[str, torch.Tensor]:
        return confmat_scores(self.confmat)


def confmat_scores(confmat: torch.Tensor) -> dict[str, torch.Tensor]:
    """``SegmentationMetrics.compute`` of a (C, C) count matrix (rows: ground truth, columns: prediction)."""
    cm = confmat.double()
    tp = cm.diag()
    union = cm.sum(0) + cm.sum(1) - tp
    gt_area = cm.sum(1)
    iou = torch.where(union > 0, tp / union.clamp(min=1), torch.full_like(tp, float("nan")))
    acc = torch.where(gt_area > 0, tp / gt_area.clamp(min=1), torch.full_like(tp, float("nan")))
    # torchmetrics' macro Jaccard skips union-0 classes: the same mean as mmseg's nanmean
    miou = _jaccard_index_reduce(confmat, average="macro")
    return {
        "mIoU": miou.double(),
        "IoU": iou,
        "aAcc": tp.sum() / cm.sum().clamp(min=1),
        "mAcc": torch.nanmean(acc),
    }
