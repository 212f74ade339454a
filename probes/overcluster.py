"""Overclustering (unsupervised segmentation), as Leopart (Ziegler & Asano, CVPR 2022), NeCo and CAPI report it:
k-means on the L2-normalised validation patch features, clusters matched to classes (Hungarian for K = the number
of classes, majority vote for larger K), mIoU (``probes.matching``).

k-means here is Lloyd's algorithm with a fixed-seed init of K distinct feature vectors (as faiss' ``Kmeans``, which
Leopart uses), iterated until no assignment changes or ``max_iter``; an emptied cluster keeps its centre. Given the
same init it is scikit-learn's ``KMeans(init=..., n_init=1, algorithm="lloyd")`` (tests/test_probe_cluster.py).

>>> x = torch.tensor([[0.0], [0.1], [5.0], [5.2]])
>>> kmeans(x, 2, init=torch.tensor([[0.0], [5.0]]))[0].tolist()
[0, 0, 1, 1]
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from .matching import confusion, hungarian, majority, matched_miou

DEFAULT_MULTIPLES = (1, 2, 5, 10)  # K = multiples of the number of classes


def init_centres(x: torch.Tensor, k: int, seed: int) -> torch.Tensor:
    """K rows of ``x`` drawn without replacement by a generator seeded with ``seed``."""
    if k > x.shape[0]:
        raise ValueError(f"k-means with K={k} needs at least {k} patches, got {x.shape[0]}")
    g = torch.Generator().manual_seed(int(seed))
    return x[torch.randperm(x.shape[0], generator=g)[:k].to(x.device)].clone()


def _assign(x: torch.Tensor, c: torch.Tensor, chunk: int = 65536) -> torch.Tensor:
    """Index of the nearest centre (squared Euclidean) of every row, in row chunks."""
    cc = (c * c).sum(1)
    return torch.cat([((cc - 2 * x[s:s + chunk] @ c.T)).argmin(1) for s in range(0, x.shape[0], chunk)])


@torch.no_grad()
def kmeans(x: torch.Tensor, k: int, seed: int = 0, max_iter: int = 100,
           init: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(labels (N,), centres (K, D)) of Lloyd's k-means on (N, D) ``x``."""
    c = (init_centres(x, k, seed) if init is None else init.to(x)).clone()
    labels = _assign(x, c)
    for _ in range(max_iter):
        sums = torch.zeros_like(c).index_add_(0, labels, x)
        counts = torch.bincount(labels, minlength=c.shape[0]).to(x.dtype)
        filled = counts > 0
        c[filled] = sums[filled] / counts[filled, None]
        new = _assign(x, c)
        if torch.equal(new, labels):
            break
        labels = new
    return labels, c


def resolve_ks(spec: str, num_classes: int) -> list[int]:
    """'1x,2x,300' -> [C, 2C, 300]: multiples of the number of classes ('Nx') or plain K values."""
    ks = []
    for part in (p.strip() for p in str(spec).split(",") if p.strip()):
        ks.append(int(part[:-1]) * num_classes if part.endswith("x") else int(part))
    if not ks or any(k < 1 for k in ks):
        raise ValueError(f"--cluster-k {spec!r}: expected e.g. '1x,2x,5x,10x' or '21,100,300'")
    return ks


@torch.no_grad()
def overcluster(feats: torch.Tensor, masks: torch.Tensor, num_classes: int, ks: Sequence[int], seed: int = 0,
                max_iter: int = 100, ignore_index: int = 255) -> dict[int, dict]:
    """Per K: mIoU of the k-means clusters of (N, D, h, w) patch features against (N, H, W) masks; the cluster map
    is upsampled (nearest) to the mask size. K = num_classes: Hungarian matching; larger K: majority vote."""
    n, d, h, w = feats.shape
    x = F.normalize(feats.permute(0, 2, 3, 1).reshape(-1, d).float(), dim=1)
    out = {}
    for k in ks:
        labels, _ = kmeans(x, int(k), seed=seed, max_iter=max_iter)
        maps = F.interpolate(labels.reshape(n, 1, h, w).float(), size=tuple(masks.shape[-2:]), mode="nearest")
        cm = confusion(masks, maps[:, 0].long(), num_classes, int(k), ignore_index)
        mapping = hungarian(cm) if k <= num_classes else majority(cm)
        out[int(k)] = {**matched_miou(cm, mapping), "matching": "hungarian" if k <= num_classes else "majority"}
    return out
