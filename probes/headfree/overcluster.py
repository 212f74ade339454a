"""Overclustering (unsupervised segmentation) as Leopart (Ziegler & Asano, CVPR 2022) and NeCo evaluate it
(``experiments/overcluster/sup_overcluster.py`` / ``eval_overcluster.py`` and ``experiments/utils.py``; transcribed
in ``official/leopart.py``, which tests/test_probe_cluster.py compares with):

1. the validation patch tokens (N·h·w, D) are standardised per channel (scikit-learn's ``StandardScaler``, fitted
   and applied in chunks of 100,000 rows as the reference) and reduced to 50 dimensions (faiss ``PCAMatrix``);
2. for each seed i = 0..4: ``faiss.Kmeans(niter=100, nredo=5, seed=i)`` (faiss trains on at most 256·K patches,
   drawn with the seed) and every patch takes its nearest centre;
3. the cluster map (h, w) and the masks (already at the input size) are resized to 100×100, nearest; pixels with
   the ignore label are dropped;
4. K = number of classes: Hungarian matching on IoU; any other K: many-to-one, each cluster to the class with the
   highest precision (which is its majority class; ``probes.headfree.matching``);
5. mIoU over all classes, reported per seed and as mean ± std (population std) over the seeds.

>>> resolve_ks("1x,2x,300", 21)
[21, 42, 300]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from probes.headfree.matching import confusion, hungarian, majority, matched_miou

DEFAULT_MULTIPLES = (1, 2, 5, 10)  # K = multiples of the number of classes


@dataclass(frozen=True)
class ClusterSettings:
    """The reference's constants (``overcluster_dev.yml``, ``utils.cluster``, ``Overcluster(mask_eval_size=100)``)."""
    seeds: int = 5            # k-means runs with seed = 0 .. seeds - 1, averaged
    pca_dim: int = 50         # capped at the feature dimension
    eval_size: int = 100      # masks and cluster maps scored at eval_size x eval_size
    niter: int = 100
    nredo: int = 5
    scaler_chunk: int = 100_000


def _faiss():
    try:
        import faiss
    except ImportError:
        raise ImportError("overclustering runs faiss' k-means and PCA as Leopart / NeCo do: install faiss-cpu "
                          "(a dependency in pyproject.toml): .venv/bin/pip install faiss-cpu") from None
    return faiss


def standardize_pca(x: np.ndarray, pca_dim: int, chunk: int = 100_000) -> np.ndarray:
    """(N, D) float32 -> (N, pca_dim) float32: StandardScaler fitted and applied chunk by chunk, then faiss PCA."""
    from sklearn.preprocessing import StandardScaler
    x = np.array(x, dtype=np.float32, copy=True)
    scaler = StandardScaler()
    for s in range(0, x.shape[0], chunk):
        scaler.partial_fit(x[s:s + chunk])
    for s in range(0, x.shape[0], chunk):
        x[s:s + chunk] = scaler.transform(x[s:s + chunk])
    pca = _faiss().PCAMatrix(x.shape[1], int(pca_dim))
    pca.train(x)
    return pca.apply_py(x)


def kmeans_labels(x: np.ndarray, k: int, seed: int, niter: int = 100, nredo: int = 5) -> np.ndarray:
    """(N,) index of the nearest centre of faiss k-means (best of ``nredo`` runs) on (N, d) float32 rows."""
    if k > x.shape[0]:
        raise ValueError(f"k-means with K={k} needs at least {k} patches, got {x.shape[0]}: lower --cluster-k or "
                         "evaluate more images")
    km = _faiss().Kmeans(x.shape[1], int(k), niter=niter, nredo=nredo, verbose=False, gpu=False, spherical=False,
                         seed=int(seed))
    km.train(x)
    return km.index.search(x, 1)[1].reshape(-1)


def resolve_ks(spec: str, num_classes: int) -> list[int]:
    """'1x,2x,300' -> [C, 2C, 300]: multiples of the number of classes ('Nx') or plain K values."""
    ks = []
    for part in (p.strip() for p in str(spec).split(",") if p.strip()):
        ks.append(int(part[:-1]) * num_classes if part.endswith("x") else int(part))
    if not ks or any(k < 1 for k in ks):
        raise ValueError(f"--cluster-k {spec!r}: expected e.g. '1x,2x,5x,10x' or '21,100,300'")
    return ks


def _nearest(t: torch.Tensor, size: int) -> torch.Tensor:
    """(N, h, w) ids -> (N, size, size), nearest (the reference's ``F.interpolate(..., mode='nearest')``)."""
    if tuple(t.shape[-2:]) == (size, size):
        return t.long()
    return F.interpolate(t[:, None].float(), size=(size, size), mode="nearest")[:, 0].long()


def score_clusters(maps: torch.Tensor, masks: torch.Tensor, k: int, num_classes: int,
                   ignore_index: int = 255) -> dict:
    """mIoU of (N, S, S) cluster ids against (N, S, S) masks: Hungarian at K = classes, else many-to-one."""
    cm = confusion(masks, maps, num_classes, int(k), ignore_index)
    one_to_one = int(k) == num_classes
    return {**matched_miou(cm, hungarian(cm) if one_to_one else majority(cm)),
            "matching": "hungarian" if one_to_one else "many-to-one"}


@torch.no_grad()
def overcluster(feats: torch.Tensor, masks: torch.Tensor, num_classes: int, ks: Sequence[int],
                settings: ClusterSettings = ClusterSettings(), ignore_index: int = 255) -> dict[int, dict]:
    """Per K: mIoU (mean and std over the seeds, each seed's value, per-class IoU averaged over the seeds) of the
    clusters of (N, D, h, w) patch features against (N, H, W) masks."""
    n, d, h, w = feats.shape
    x = standardize_pca(feats.permute(0, 2, 3, 1).reshape(-1, d).float().cpu().numpy(), min(settings.pca_dim, d),
                        settings.scaler_chunk)
    gt = _nearest(masks.cpu(), settings.eval_size)
    out = {}
    for k in ks:
        runs = []
        for seed in range(settings.seeds):
            labels = torch.from_numpy(kmeans_labels(x, int(k), seed, settings.niter, settings.nredo).astype(np.int64))
            runs.append(score_clusters(_nearest(labels.reshape(n, h, w), settings.eval_size), gt, int(k),
                                       num_classes, ignore_index))
        per_seed = np.array([r["mIoU"] for r in runs])
        out[int(k)] = {"mIoU": float(per_seed.mean()), "std": float(per_seed.std()), "seeds": per_seed.tolist(),
                       "IoU": np.mean([r["IoU"] for r in runs], axis=0).tolist(), "matching": runs[0]["matching"],
                       "pca_dim": int(x.shape[1])}
    return out
