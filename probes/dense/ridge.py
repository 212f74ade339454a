"""Closed-form linear segmentation probe: ridge regression of per-patch class fractions on standardised frozen
patch features. One solver for ``make probe TASK=voc ARGS="--solver ridge"`` and the pretraining's online
``DenseProbeCheck``, so the two give the same mIoU on the same weights.

Protocol (the linear probe's, reduced): the task's DataModule views (training images and masks resized to the probe
size; validation masks at label size), last-block patch tokens, a linear map per patch, logits bilinearly upsampled
to the label size, argmax, mIoU as ``SegmentationMetrics`` (mmseg's). Instead of BN + 1x1 conv trained by AdamW
with cross-entropy: the features are standardised with the training set's mean and std (what an eval-mode BN does)
and W = (ZᵀZ + λ·n·I)⁻¹ ZᵀY, Y = each patch's class fractions over its labelled pixels (patches with none
are left out), bias = mean of Y. Everything the solve needs is a sum over patches (n, Σx, XᵀX, XᵀY, ΣY) and the metric is a
confusion matrix, so data shards add up with one all-reduce (``reduce``): 2 processes give what 1 gives, up to
float64 summation order.

    >>> # run_ridge_probe(train, val, num_classes=21, lam=1e-2, dim=384)["mIoU"]
    >>> #   train: (feats (B, C, h, w), masks (B, H, W)) pairs; val: masks at label size (a list of (H_i, W_i))
    >>> # or step by step: probe = RidgeSegProbe(21, 1e-2); probe.add_train(...); probe.solve(reduce);
    >>> #   probe.add_val(...); probe.metrics(reduce)
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Iterable, Optional, Sequence

import torch
import torch.nn.functional as F

from probes.dense.seg_metric import SegmentationMetrics

Reduce = Optional[Callable[[torch.Tensor], torch.Tensor]]


def patch_targets(masks: torch.Tensor, grid: tuple[int, int], num_classes: int,
                  ignore_index: int = 255) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, H, W) labels -> per-patch class fractions (B*h*w, K) over labelled pixels, and (B*h*w,) bool: has any."""
    m = masks.long()
    valid = m != ignore_index
    onehot = F.one_hot(torch.where(valid, m, 0), num_classes).permute(0, 3, 1, 2).double()
    onehot = onehot * valid[:, None]
    frac = F.adaptive_avg_pool2d(onehot, grid)  # (B, K, h, w): share of the patch's pixels per class
    total = frac.sum(1)
    y = (frac / total.clamp_min(1e-12)[:, None]).permute(0, 2, 3, 1).reshape(-1, num_classes)
    return y, total.reshape(-1) > 0


class RidgeSegProbe:
    def __init__(self, num_classes: int, lam: float = 1e-2, ignore_index: int = 255):
        self.num_classes, self.lam, self.ignore_index = num_classes, float(lam), ignore_index
        self.stats: dict[str, torch.Tensor] = {}
        self.metric = SegmentationMetrics(num_classes, ignore_index=ignore_index)
        self.solution: Optional[tuple[torch.Tensor, ...]] = None

    def add_train(self, feats: torch.Tensor, masks: torch.Tensor) -> None:
        B, C, h, w = feats.shape
        y, keep = patch_targets(masks.cpu(), (h, w), self.num_classes, self.ignore_index)
        x = feats.detach().double().cpu().permute(0, 2, 3, 1).reshape(-1, C)[keep]
        y = y[keep]
        add = {"n": torch.tensor([float(x.shape[0])], dtype=torch.float64), "sx": x.sum(0), "xx": x.T @ x,
               "xy": x.T @ y, "sy": y.sum(0)}
        for k, v in add.items():
            self.stats[k] = self.stats[k] + v if k in self.stats else v

    def empty_stats(self, dim: int) -> None:
        """Zero statistics (a process whose shard is empty still takes part in the all-reduce)."""
        K = self.num_classes
        z = lambda *s: torch.zeros(*s, dtype=torch.float64)  # noqa: E731
        self.stats = {"n": z(1), "sx": z(dim), "xx": z(dim, dim), "xy": z(dim, K), "sy": z(K)}

    def solve(self, reduce: Reduce = None) -> None:
        s = {k: (reduce(v) if reduce else v) for k, v in self.stats.items()}
        n = float(s["n"][0])
        if n < 2:
            raise ValueError("the ridge probe needs at least 2 labelled patches")
        mu = s["sx"] / n
        cov = s["xx"] - n * torch.outer(mu, mu)  # centred Gram
        sd = (cov.diagonal() / n).clamp_min(1e-12).sqrt()
        zz = cov / torch.outer(sd, sd)
        zy = (s["xy"] - torch.outer(mu, s["sy"])) / sd[:, None]
        eye = torch.eye(zz.shape[0], dtype=torch.float64)
        w = torch.linalg.solve(zz + self.lam * n * eye, zy)
        self.solution = (mu, sd, w, s["sy"] / n)

    def logits(self, feats: torch.Tensor) -> torch.Tensor:
        """(B, C, h, w) -> (B, K, h, w) float64."""
        mu, sd, w, b = self.solution
        z = (feats.detach().double().cpu() - mu[None, :, None, None]) / sd[None, :, None, None]
        return torch.einsum("bchw,ck->bkhw", z, w) + b[None, :, None, None]

    def add_val(self, feats: torch.Tensor, masks: Sequence[torch.Tensor]) -> None:
        logits = self.logits(feats)
        for j, gt in enumerate(masks):
            up = F.interpolate(logits[j:j + 1], size=gt.shape[-2:], mode="bilinear", align_corners=False)
            self.metric.update(up.argmax(1), gt[None].cpu())

    def metrics(self, reduce: Reduce = None) -> dict[str, Any]:
        cm = self.metric.confmat
        if reduce:
            self.metric.confmat = reduce(cm.double()).to(cm.dtype)
        res = self.metric.compute()
        self.metric.reset()
        return {"mIoU": 100 * res["mIoU"].item(), "aAcc": 100 * res["aAcc"].item(), "mAcc": 100 * res["mAcc"].item(),
                "per_class_IoU": [None if math.isnan(v) else 100 * v for v in res["IoU"].tolist()]}


def run_ridge_probe(train_pairs: Iterable, val_pairs: Iterable, num_classes: int, lam: float, dim: int,
                    reduce: Reduce = None) -> dict[str, Any]:
    """Fit on ``train_pairs`` and score ``val_pairs``: iterables of (features (B, C=dim, h, w), masks) — the CLI's
    frozen features of each batch, or DenseProbeCheck's shard, whose generator also takes the diffusion
    measures from the same forward. Every process calls it (``reduce``: two all-reduces)."""
    t0 = time.perf_counter()
    probe = RidgeSegProbe(num_classes, lam)
    probe.empty_stats(dim)
    for feats, masks in train_pairs:
        probe.add_train(feats, masks)
    probe.solve(reduce)
    for feats, masks in val_pairs:
        probe.add_val(feats, masks if isinstance(masks, list) else list(masks))
    return {**probe.metrics(reduce), "solver": "ridge", "ridge_lambda": lam, "seconds": time.perf_counter() - t0}


def run_ridge_kind(ctx, spec) -> dict[str, Any]:
    """--solver ridge (segmentation, ``probes.core.kinds``): the closed-form probe that the pretraining's
    DenseProbeCheck runs, in one process (fast: one pass over each split), on the GPU when there is one."""
    from torch.utils.data import DataLoader

    from datamodules.datamodule_base import dense_collate
    from tokenmix.launch import on_gpu

    from probes.core.features import FrozenFeatures
    if ctx.launch.devices not in (None, 1, "1", "auto") or ctx.launch.num_nodes not in (None, 1):
        raise ValueError("--solver ridge runs in one process: drop --devices / --num-nodes")
    loaders = [DataLoader(ds, batch_size=ctx.dm.batch_size, shuffle=False, collate_fn=dense_collate)
               for ds in (ctx.dm.train_set, ctx.dm.val_set)]
    dev = torch.device("cuda" if on_gpu(ctx.launch.accelerator) else "cpu")
    features = FrozenFeatures(ctx.info.model, spec).to(dev)
    train, val = (((features(b["image"].to(dev)), b["mask"]) for b in loader) for loader in loaders)
    return run_ridge_probe(train, val, ctx.dm.num_classes, ctx.options.ridge_lambda, features.out_dim)
