"""mIoU of predictions whose ids are not class ids: the scoring of the head-free dense probes.

``confusion`` counts (ground truth, prediction) pairs; ``hungarian`` maps each prediction id to a class one-to-one
(scipy's ``linear_sum_assignment`` on 1 - IoU), ``majority`` maps each to the class most of its pixels carry (the
many-to-one matching of overclustering); ``matched_miou`` folds the columns by the map and averages IoU over every
class. This is the scoring of open-hummingbird-eval's ``PredsmIoU`` (and Leopart's, which it descends from):
float64 IoU matrix for the matching, classes with no pixel at all count as IoU 0 (on full validation sets every
class occurs, so this only matters on toy subsets).

>>> cm = confusion(torch.tensor([0, 0, 1, 1]), torch.tensor([1, 1, 0, 1]), 2, 2)
>>> cm.tolist()
[[0, 2], [1, 1]]
>>> hungarian(cm).tolist()   # prediction 1 -> class 0, prediction 0 -> class 1
[1, 0]
>>> round(matched_miou(cm, hungarian(cm))["mIoU"], 4)   # class 0: 2/3, class 1: 1/2
0.5833
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch


def confusion(gt: torch.Tensor, pred: torch.Tensor, num_gt: int, num_pred: int,
              ignore_index: Optional[int] = 255) -> torch.Tensor:
    """(num_gt, num_pred) int64 counts; pixels with ``gt == ignore_index`` or ids out of range are skipped."""
    gt, pred = gt.reshape(-1).long().cpu(), pred.reshape(-1).long().cpu()
    if gt.shape != pred.shape:
        raise ValueError(f"{gt.numel()} labels but {pred.numel()} predictions")
    keep = (gt >= 0) & (gt < num_gt) & (pred >= 0) & (pred < num_pred)
    if ignore_index is not None:
        keep &= gt != ignore_index
    idx = gt[keep] * num_pred + pred[keep]
    return torch.bincount(idx, minlength=num_gt * num_pred).reshape(num_gt, num_pred)


def iou_matrix(cm: torch.Tensor) -> np.ndarray:
    """IoU of every (class, prediction id) pair, float64; an empty union gives 0."""
    c = cm.double()
    union = c.sum(1, keepdim=True) + c.sum(0, keepdim=True) - c
    return (c / union.clamp(min=1e-8)).numpy()


def hungarian(cm: torch.Tensor) -> torch.Tensor:
    """prediction id -> class, one-to-one, maximising the summed IoU; ids left unmatched (more ids than classes)
    go to class 0, as in the reference."""
    from scipy.optimize import linear_sum_assignment
    rows, cols = linear_sum_assignment(1.0 - iou_matrix(cm))
    mapping = torch.zeros(cm.shape[1], dtype=torch.long)
    mapping[torch.as_tensor(cols, dtype=torch.long)] = torch.as_tensor(rows, dtype=torch.long)
    return mapping


def majority(cm: torch.Tensor) -> torch.Tensor:
    """prediction id -> the class that most of its pixels carry (ties: the lowest class id)."""
    return cm.argmax(dim=0)


def matched_miou(cm: torch.Tensor, mapping: Optional[torch.Tensor] = None) -> dict:
    """{"mIoU": mean over all classes (absent classes count 0), "IoU": per class} after folding the prediction
    columns by ``mapping`` (None: prediction ids are class ids)."""
    g = cm.shape[0]
    if mapping is None:
        if cm.shape[1] != g:
            raise ValueError(f"without a mapping the confusion matrix must be square, got {tuple(cm.shape)}")
        folded = cm
    else:
        folded = torch.zeros(g, g, dtype=cm.dtype).index_add_(1, mapping.long(), cm)
    f = folded.double()
    tp = f.diag()
    iou = tp / (f.sum(0) + f.sum(1) - tp).clamp(min=1e-8)
    return {"mIoU": float(iou.mean()), "IoU": iou.tolist()}
