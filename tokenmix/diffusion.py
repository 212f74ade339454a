"""Semantic-diffusion measures of a ViT's patch tokens (the first paper's claim: patch features degrade over
training while [CLS] improves). Pure functions on tensors; ``lightning_modules.callbacks.dense_check`` logs them.

- Patch score and Point-in-Box (LaSt-ViT ``visualization/``): score of a patch = cosine([CLS], patch); an image is a
  hit when its top-scoring patch overlaps a ground-truth box; PiB = hits / images (``analysis.patch_score`` uses
  these too). Exact ties at the top are broken at random from a seeded Generator (``TIE_SEED``): the first index
  (``argmax``) would turn "all scores equal" into "patch 0", a corner, and PiB into that corner's box coverage.
- PiB's position-aware chance (``position_chance``): the box coverage of each patch position over the images,
  averaged with the scorer's pick distribution (``pick_distribution``: the share of picks at each position, ties
  split evenly). It is the PiB of a scorer that picks its positions as often as this one does, whatever the image
  shows; with every score tied, the mean box share. Beside it, ``average_patch_scores``: the scores of the most
  average patch (cosine to the image's mean patch token), a [CLS] that knows nothing but the patches' mean.
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

__all__ = ["patch_scores", "top_patch", "pib_hits", "tied", "pick_distribution", "position_chance",
           "average_patch_scores", "TIE_SEED", "score_contrast", "cls_patch_cosine", "effective_rank",
           "effective_rank_from_gram", "mask_boxes", "boxes_patch_mask"]


def patch_scores(cls: torch.Tensor, patch: torch.Tensor) -> torch.Tensor:
    """cosine(cls (B, D), patch (B, N, D)) -> (B, N)."""
    if cls.ndim != 2 or patch.ndim != 3 or cls.shape[0] != patch.shape[0] or cls.shape[1] != patch.shape[2]:
        raise ValueError(f"expected cls (B, D) and patch (B, N, D), got {tuple(cls.shape)} and {tuple(patch.shape)}")
    return F.cosine_similarity(patch.float(), cls.float()[:, None, :], dim=-1)


TIE_SEED = 0  # the tie-breaking Generator's seed when none is given (results.json records it)


def _at_max(scores: torch.Tensor) -> torch.Tensor:
    return scores == scores.max(dim=1, keepdim=True).values


def tied(scores: torch.Tensor) -> torch.Tensor:
    """(B,) bool: more than one patch holds the top score exactly."""
    return _at_max(scores).sum(1) > 1


def top_patch(scores: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Index of the highest-scoring patch per image; exact ties broken uniformly at random by ``generator``
    (default: a fresh one seeded with ``TIE_SEED``)."""
    if generator is None:
        generator = torch.Generator().manual_seed(TIE_SEED)
    u = torch.rand(scores.shape, generator=generator).to(scores.device)
    return torch.where(_at_max(scores), u, -1.0).argmax(dim=1)


def pick_distribution(scores: torch.Tensor) -> torch.Tensor:
    """(B, N): the probability that ``top_patch`` picks each patch (1 on a unique top, 1/k over k tied ones)."""
    m = _at_max(scores).to(torch.float64)
    return m / m.sum(1, keepdim=True)


def position_chance(picks: torch.Tensor, box_masks: torch.Tensor) -> float:
    """PiB expected of a scorer whose picks, (B, N) probabilities (``pick_distribution``), do not depend on where the
    boxes are: sum over positions of (share of picks there) x (share of images whose box covers it)."""
    if picks.shape != box_masks.shape:
        raise ValueError(f"picks {tuple(picks.shape)} and box masks {tuple(box_masks.shape)} must match")
    return float((picks.double().mean(0) * box_masks.double().mean(0)).sum())


def average_patch_scores(patch: torch.Tensor) -> torch.Tensor:
    """(B, N): cosine(patch, the image's mean patch token): picking the top one is the "most average patch"."""
    return patch_scores(patch.float().mean(1), patch)


def pib_hits(scores: torch.Tensor, box_masks: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """(B,) bool: is the top patch (``top_patch``, ties at random) inside the box patches? scores (B, N), box_masks
    (B, N) bool."""
    if scores.shape != box_masks.shape:
        raise ValueError(f"scores {tuple(scores.shape)} and box masks {tuple(box_masks.shape)} must match")
    top = top_patch(scores, generator)
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
