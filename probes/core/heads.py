"""Probe heads: linear classifier (DINO eval_linear), linear segmentation (DINOv2 BNHead), linear depth
(DINOv2 depth BNHead with 256 uniform bins or plain regression) and the SigLoss used to train it."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class LinearClassifier(nn.Module):
    """DINO eval_linear: one linear layer, weights N(0, 0.01), bias 0."""

    def __init__(self, dim: int, num_classes: int):
        super().__init__()
        self.linear = nn.Linear(dim, num_classes)
        nn.init.normal_(self.linear.weight, mean=0.0, std=0.01)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))


class LinearSegHead(nn.Module):
    """DINOv2 linear segmentation head: BatchNorm over the (concatenated) features, then a 1x1 conv.
    Input (B, C, h, w) patch-grid features; output logits (B, num_classes, h, w)."""

    def __init__(self, in_channels: int, num_classes: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(in_channels)  # SyncBatchNorm in DINOv2; plain BN on one device is the same
        self.conv = nn.Conv2d(in_channels, num_classes, kernel_size=1)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        return self.conv(self.bn(feats))


class LinearDepthHead(nn.Module):
    """DINOv2 depth BNHead (its BN is commented out upstream; ``bn=True`` adds one).

    classify=True: 1x1 conv to ``n_bins`` logits over uniform bins ``linspace(min_depth, max_depth, n_bins)``;
    ``norm="linear"`` (DINOv2/AdaBins default): p = (relu(l) + 0.1) / sum, ``norm="softmax"``: p = softmax(l);
    depth = sum_k p_k * bin_k. classify=False: depth = relu(conv) + min_depth (DINOv2 regression)."""

    def __init__(self, in_channels: int, min_depth: float = 1e-3, max_depth: float = 10.0,
                 classify: bool = True, n_bins: int = 256, norm: str = "linear", bn: bool = False):
        super().__init__()
        if norm not in ("linear", "softmax"):
            raise ValueError(f"depth bin norm must be 'linear' or 'softmax', got {norm!r}")
        self.min_depth, self.max_depth, self.classify, self.norm = min_depth, max_depth, classify, norm
        self.bn = nn.BatchNorm2d(in_channels) if bn else nn.Identity()
        self.conv = nn.Conv2d(in_channels, n_bins if classify else 1, kernel_size=1)
        self.register_buffer("bins", torch.linspace(min_depth, max_depth, n_bins), persistent=False)

    def forward(self, feats: torch.Tensor, upsample: int = 1) -> torch.Tensor:
        """(B, C, h, w) -> depth (B, 1, h*upsample, w*upsample) in metres.

        DINOv2 upsamples the features bilinearly before the 1x1 conv; a 1x1 conv (and an eval-mode BN) is a
        per-pixel affine map and bilinear weights sum to 1, so upsampling the logits instead is the same
        result at 1/upsample^2 of the conv cost."""
        logit = self.conv(self.bn(feats))
        if upsample > 1:
            logit = F.interpolate(logit, scale_factor=upsample, mode="bilinear", align_corners=False)
        if not self.classify:
            return F.relu(logit) + self.min_depth
        if self.norm == "linear":
            p = F.relu(logit) + 0.1
            p = p / p.sum(dim=1, keepdim=True)
        else:
            p = logit.softmax(dim=1)
        return torch.einsum("bkhw,k->bhw", p, self.bins.to(p.dtype)).unsqueeze(1)


class SigLoss(nn.Module):
    """Scale-invariant log loss as in DINOv2's SigLoss (from AdaBins): sqrt(Var(g) + 0.15 * mean(g)^2),
    g = log(pred + eps) - log(gt + eps), eps = 1e-3, Var with Bessel's correction (torch.var default),
    over pixels with min_depth < gt <= max_depth (DINOv2: gt > 0 and gt <= max_depth)."""

    def __init__(self, lam: float = 0.15, eps: float = 1e-3, min_depth: float = 0.0, max_depth: float | None = None):
        super().__init__()
        self.lam, self.eps, self.min_depth, self.max_depth = lam, eps, min_depth, max_depth

    def forward(self, pred: torch.Tensor, gt: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        pred, gt = pred.reshape(gt.shape).float(), gt.float()
        mask = gt > self.min_depth
        if self.max_depth is not None:
            mask &= gt <= self.max_depth
        if valid is not None:
            mask &= valid.reshape(gt.shape).bool()
        if mask.sum() < 2:  # Var of fewer than 2 values is undefined; no signal in this batch
            return pred.sum() * 0.0
        g = torch.log(pred[mask] + self.eps) - torch.log(gt[mask] + self.eps)
        return torch.sqrt(torch.var(g) + self.lam * g.mean() ** 2)
