"""Patch Score and Point-in-Box (LAST-ViT ``visualization/`` protocol).

Patch score of a patch = cosine(final [CLS] output, that patch's output), both after the final norm (for
``lastvit`` the [CLS] output is the aggregated token). Point-in-Box: an image is a hit when its top-scoring patch
is one of the patches the GT box(es) overlap; PiB = hits / images. Layer-wise PiB uses each block's own [CLS] and
patch outputs (through the final norm, as ``model.extract`` returns them).
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from .boxes import box_area

__all__ = ["patch_scores", "top_patch", "pib_hits", "layerwise_pib", "single_small_object", "SMALL_BOX_FRACTION"]

SMALL_BOX_FRACTION = 0.25  # LAST-ViT ImageNet subset: one object whose box covers < 25% of the image


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


def single_small_object(boxes: torch.Tensor, width: int, height: int,
                        max_fraction: float = SMALL_BOX_FRACTION) -> bool:
    """LAST-ViT's ImageNet filter: exactly one box, and its area < ``max_fraction`` of the original image."""
    b = torch.as_tensor(boxes).reshape(-1, 4)
    return b.shape[0] == 1 and float(box_area(b)[0]) < max_fraction * width * height


def layerwise_pib(outputs: Sequence[dict], box_masks: torch.Tensor) -> torch.Tensor:
    """(L, B) hits for each block's {"cls", "patch"} output (``model.extract`` list, oldest first)."""
    return torch.stack([pib_hits(patch_scores(o["cls"], o["patch"]), box_masks) for o in outputs])
