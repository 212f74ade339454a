"""Patch Score and Point-in-Box (LAST-ViT ``visualization/`` protocol).

Patch score of a patch = cosine(final [CLS] output, that patch's output), both after the final norm. LaSt-ViT's
``visualization/patch_score.py`` scores the encoder's own [CLS] output (``x[:, 0]``) for every model, its own
included; the aggregated token of ``lastvit`` is scored apart (``pib_aggregated`` in analysis/tasks.py). Point-in-Box: an image is a hit when its top-scoring patch
is one of the patches the GT box(es) overlap; PiB = hits / images. Layer-wise PiB uses each block's own [CLS] and
patch outputs (through the final norm, as ``model.extract`` returns them).
"""
from __future__ import annotations

from typing import Sequence

import torch

from tokenmix.diffusion import patch_scores, pib_hits, score_contrast, top_patch  # the pure scores live one layer down

from .boxes import box_area

__all__ = ["patch_scores", "top_patch", "pib_hits", "score_contrast", "layerwise_pib", "single_small_object", "SMALL_BOX_FRACTION"]

SMALL_BOX_FRACTION = 0.25  # LAST-ViT ImageNet subset: one object whose box covers < 25% of the image


def single_small_object(boxes: torch.Tensor, width: int, height: int,
                        max_fraction: float = SMALL_BOX_FRACTION) -> bool:
    """LAST-ViT's ImageNet filter: exactly one box, and its area < ``max_fraction`` of the original image."""
    b = torch.as_tensor(boxes).reshape(-1, 4)
    return b.shape[0] == 1 and float(box_area(b)[0]) < max_fraction * width * height


def layerwise_pib(outputs: Sequence[dict], box_masks: torch.Tensor) -> torch.Tensor:
    """(L, B) hits for each block's {"cls", "patch"} output (``model.extract`` list, oldest first)."""
    return torch.stack([pib_hits(patch_scores(o["cls"], o["patch"]), box_masks) for o in outputs])
