"""Semantic-diffusion measures of a ViT's patch tokens (the first paper's claim: patch features degrade over
training while [CLS] improves). Pure functions on tensors; ``lightning_modules.callbacks.dense_check`` logs them.

- Patch score and Point-in-Box (LaSt-ViT ``visualization/``): score of a patch = cosine([CLS], patch); an image is a
  hit when its top-scoring patch overlaps a ground-truth box; PiB = hits / images (``analysis.patch_score`` uses
  these too).
- Patch Score contrast: mean score of the patches a box overlaps minus the mean of the others (higher = [CLS] more
  alike the object than the background; a continuous companion of PiB, which counts the top patch only).
- Mean cosine between the patch tokens and [CLS] (higher = patches more alike the global token).
- Effective rank of patch features (Roy & Vetterli 2007): exp(H(p)), p = σ / Σσ over the singular values σ of the
  (patches x dim) matrix, uncentred as in the paper; computed from the Gram matrix XᵀX (σ² are its eigenvalues),
  which is a sum over patches and so adds up across data shards.
- Boxes from a segmentation mask (for PiB on a labelled set without box files): one box per class present, the
  extent of that class's pixels (two objects of one class merge into one box).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["patch_scores", "top_patch", "pib_hits", "score_contrast", "cls_patch_cosine", "effective_rank",
           "effective_rank_from_gram", "mask_boxes", "boxes_patch_mask"]


def patch_scores(cls: torch.Tensor, patch: torch.Tensor) -> torch.Tensor:
    """cosine(cls (B, D), patch (B, N, D)) -> (B, N)."""
    if cls.ndim != 2 or patch.ndim != 3 or cls.shape[0] != patch.shape[0] or cls.shape[1] != patch.shape[2]:
        raise ValueError(f"expected cls (B, D) and patch (B, N, D), got {tuple(cls.shape)} and {tuple(patch.shape)}")
    return F.cosine_similarity(patch.float(), cls.float()[:, None, :], dim=-1)


def top_patch(scores: torch.Tensor) -> torch.Tensor:
    """Index of the highest-scoring patch per image (first one on exact ties, like ``argmax``)."""
    return scores.argmax(dim=1)


def pib_hits(scores: torch.Tensor, box_masks: torch.Tensor) -> torch.Tensor:
    """(B,) bool: is the top patch inside the box patches? scores (B, N), box_masks (B, N) bool."""
    if scores.shape != box_masks.shape:
        raise ValueError(f"scores {tuple(scores.shape)} and box masks {tuple(box_masks.shape)} must match")
    top = top_patch(scores)
    return box_masks.gather(1, top[:, None])[:, 0]


def score_contrast(scores: torch.Tensor, box_masks: torch.Tensor) -> torch.Tensor:
    """(B,) mean score inside the box patches minus mean score outside; NaN where either side has no patch."""
    if scores.shape != box_masks.shape:
        raise ValueError(f"scores {tuple(scores.shape)} and box masks {tuple(box_masks.shape)} must match")
    m = box_masks.to(scores.dtype)
    inside = (scores * m).sum(1) / m.sum(1)  # 0/0 = NaN when no patch is inside
    outside = (scores * (1 - m)).sum(1) / (1 - m).sum(1)
    return inside - outside


def cls_patch_cosine(cls: torch.Tensor, patch: torch.Tensor) -> torch.Tensor:
    """(B,) mean over patches of cosine([CLS], patch)."""
    return patch_scores(cls, patch).mean(dim=1)


def effective_rank_from_gram(gram: torch.Tensor) -> float:
    """Roy & Vetterli's effective rank of X from G = XᵀX: σ = sqrt(eig(G)), p = σ/Σσ, exp(-Σ p log p)."""
    ev = torch.linalg.eigvalsh(gram.double()).clamp_min(0)
    s = ev.sqrt()
    if s.sum() <= 0:
        return 0.0
    p = s / s.sum()
    return float(torch.exp(-torch.special.xlogy(p, p).sum()))


def effective_rank(x: torch.Tensor) -> float:
    """Effective rank of a (samples, dim) matrix (its rows uncentred)."""
    x = x.double().reshape(-1, x.shape[-1])
    return effective_rank_from_gram(x.T @ x)


def mask_boxes(mask: torch.Tensor, ignore_index: int = 255, background: int = 0) -> torch.Tensor:
    """(K, 4) xyxy pixel-edge boxes, one per class present in ``mask`` (H, W) other than background / ignore."""
    boxes = []
    for c in torch.unique(mask).tolist():
        if c in (ignore_index, background):
            continue
        ys, xs = torch.nonzero(mask == c, as_tuple=True)
        boxes.append([xs.min().item(), ys.min().item(), xs.max().item() + 1, ys.max().item() + 1])
    return torch.tensor(boxes, dtype=torch.float64).reshape(-1, 4)


def boxes_patch_mask(boxes: torch.Tensor, grid: tuple[int, int], patch: tuple[float, float]) -> torch.Tensor:
    """(h*w,) bool: patches sharing positive area with any box. ``patch``: (height, width) of a patch in the
    boxes' pixel units."""
    h, w = grid
    ph, pw = patch
    rows = (torch.arange(h, dtype=torch.float64) * ph)[:, None]
    cols = (torch.arange(w, dtype=torch.float64) * pw)[None, :]
    out = torch.zeros(h, w, dtype=torch.bool)
    for x0, y0, x1, y1 in torch.as_tensor(boxes, dtype=torch.float64).reshape(-1, 4).tolist():
        out |= (rows < y1) & (rows + ph > y0) & (cols < x1) & (cols + pw > x0)
    return out.reshape(-1)
