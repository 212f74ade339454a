"""Weighted k-NN classifier of DINO's ``eval_knn.py``: cosine similarity of L2-normalised features, each of the k
nearest training samples voting for its label with weight exp(sim / T).
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch
import torch.nn.functional as F

DEFAULT_KS = (10, 20, 100, 200)


def _check(train_feats: torch.Tensor, train_labels: torch.Tensor, test_feats: torch.Tensor) -> None:
    if train_feats.ndim != 2 or test_feats.ndim != 2:
        raise ValueError(f"features must be 2-D (samples, dim); got train {tuple(train_feats.shape)}, "
                         f"test {tuple(test_feats.shape)}")
    if train_feats.shape[1] != test_feats.shape[1]:
        raise ValueError(f"train/test feature dims differ: {train_feats.shape[1]} vs {test_feats.shape[1]}")
    if train_labels.ndim != 1 or train_labels.shape[0] != train_feats.shape[0]:
        raise ValueError(f"train_labels must be 1-D with {train_feats.shape[0]} entries; "
                         f"got {tuple(train_labels.shape)}")
    if train_feats.shape[0] == 0:
        raise ValueError("k-NN needs at least one training sample")


@torch.no_grad()
def knn_scores(train_feats: torch.Tensor, train_labels: torch.Tensor, test_feats: torch.Tensor,
               num_classes: int, k: int = 20, T: float = 0.07, chunk: int = 1024) -> torch.Tensor:
    """(num_test, num_classes) summed vote weights; k capped at the training size (DINO's topk would fail)."""
    _check(train_feats, train_labels, test_feats)
    train = F.normalize(train_feats.float(), dim=1)
    labels = train_labels.long().to(train.device)
    k = min(int(k), train.shape[0])
    out = []
    for start in range(0, test_feats.shape[0], chunk):  # chunks bound the (chunk, num_train) similarity matrix
        test = F.normalize(test_feats[start:start + chunk].float().to(train.device), dim=1)
        sim, idx = (test @ train.T).topk(k, dim=1, largest=True, sorted=True)
        weights = (sim / T).exp()
        votes = torch.zeros(test.shape[0], num_classes, dtype=weights.dtype, device=train.device)
        votes.scatter_add_(1, labels[idx], weights)  # same as DINO's one-hot * weight summed over neighbours
        out.append(votes)
    if not out:
        return torch.zeros(0, num_classes)
    return torch.cat(out)


def knn_classify(train_feats: torch.Tensor, train_labels: torch.Tensor, test_feats: torch.Tensor,
                 num_classes: int, k: int = 20, T: float = 0.07) -> torch.Tensor:
    """Predicted labels (num_test,) of the weighted k-NN vote."""
    return knn_scores(train_feats, train_labels, test_feats, num_classes, k=k, T=T).argmax(dim=1)


def knn_top1(train_feats: torch.Tensor, train_labels: torch.Tensor, test_feats: torch.Tensor,
             test_labels: torch.Tensor, num_classes: int, ks: Iterable[int] = DEFAULT_KS,
             T: float = 0.07) -> dict[int, float]:
    """Top-1 accuracy in percent for every k in ``ks`` (DINO reports k = 10, 20, 100, 200; 20 is the headline)."""
    test_labels = test_labels.long().cpu()
    if test_labels.shape[0] != test_feats.shape[0]:
        raise ValueError(f"{test_feats.shape[0]} test features but {test_labels.shape[0]} test labels")
    result = {}
    for k in ks:
        pred = knn_classify(train_feats, train_labels, test_feats, num_classes, k=k, T=T).cpu()
        result[int(k)] = 100.0 * (pred == test_labels).float().mean().item() if len(test_labels) else float("nan")
    return result


def knn_top1_topk(train_feats, train_labels, test_feats, test_labels, num_classes: int,
                  ks: Sequence[int] = DEFAULT_KS, T: float = 0.07) -> dict[int, dict[str, float]]:
    """Top-1 and top-5 per k (top-5 as in DINO: only among min(5, k) classes)."""
    test_labels = test_labels.long().cpu()
    res = {}
    for k in ks:
        scores = knn_scores(train_feats, train_labels, test_feats, num_classes, k=k, T=T).cpu()
        order = scores.argsort(dim=1, descending=True, stable=True)
        correct = order.eq(test_labels.view(-1, 1))
        res[int(k)] = {"top1": 100.0 * correct[:, :1].any(1).float().mean().item(),
                       "top5": 100.0 * correct[:, :min(5, k, num_classes)].any(1).float().mean().item()}
    return res
