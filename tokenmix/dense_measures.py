"""Every dense measure, defined once: its key (the one name it has as TensorBoard tag, in summary.json, results.json
and CSV), label, unit, the direction it takes as semantic diffusion grows, the papers' effect where one exists, and
how it is computed from one forward pass (``TokenMixViT.forward_record``: the last block's [CLS] and patch tokens and
the attention weights, recorded together).

Two kinds:

- *per-image measures* (``image_record``): each image of a batch gives additive terms (PiB hits and boxes, the mean
  cos(patch, [CLS]), the Patch Score spread, the patch Gram matrix, attention entropy and exact-zero share); a
  measure is a function of their sums (``Measure.value``). ``DenseProbeCheck`` adds them up over its shards (one
  all-reduce); the calibration keeps them per image and sums any resample of the images, so both compute the same
  numbers from the same forwards;
- *probe measures* (``Measure.value`` None): a probe fitted on the forwards' features gives them from its confusion
  counts (ridge: ``probes.dense.ridge``, mmseg's mIoU; retrieval and overclustering: Hungarian-matched mIoU,
  ``probes.headfree.matching``); the [CLS] k-NN from ``tokenmix.knn``.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Callable, Optional, Sequence

import torch

from .attention_stats import attention_stats
from .diffusion import boxes_patch_mask, effective_rank_from_gram, mask_boxes, patch_scores, pib_hits



class Direction(str, Enum):
    """Which way a measure goes as semantic diffusion grows."""
    UP = "up"
    DOWN = "down"
    NONE = "none"  # reported beside the others, no expectation (the [CLS] k-NN)


Sums = dict  # field -> float or tensor: sums over images of ``image_record``'s terms


@dataclass(frozen=True)
class Measure:
    key: str
    label: str
    unit: str
    direction: Direction
    paper: Optional[str] = None  # its ``tokenmix.stats.PAPER_EFFECTS`` key (the papers' effect here or its analogue)
    value: Optional[Callable[[Sums], float]] = None  # per-image measures: the value from the sums
    images: str = "val"          # the images it reads: "val", "attn" (the first attn_images), "knn"
    terms: tuple[str, ...] = ()  # the image_record terms ``value`` reads


def _per(num: str, den: str, scale: float = 1.0) -> dict:
    return {"value": lambda s: scale * float(s[num]) / max(float(s[den]), 1.0), "terms": (num, den)}


MEASURES: tuple[Measure, ...] = (
    Measure("dense_mIoU", "ridge seg. mIoU", "%", Direction.DOWN, "voc_miou"),
    Measure("dense_aAcc", "ridge seg. pixel accuracy", "%", Direction.DOWN),
    Measure("dense_mAcc", "ridge seg. mean class accuracy", "%", Direction.DOWN),
    Measure("dense_retrieval_mIoU", "retrieval mIoU", "%", Direction.DOWN, "voc_miou"),
    Measure("dense_overcluster_mIoU", "overclustering mIoU", "%", Direction.DOWN, "voc_miou"),
    Measure("diffusion_pib_cls", "Point-in-Box [CLS]", "%", Direction.DOWN, "pib_voc",
            **_per("pib_hits", "box_images", 100)),
    Measure("diffusion_patch_score_spread", "Patch Score spread", "cos", Direction.DOWN, None,
            **_per("spread", "images")),
    Measure("diffusion_cls_patch_cosine", "cos(patch, [CLS])", "cos", Direction.UP, None, **_per("cosine", "images")),
    Measure("diffusion_effective_rank", "effective rank", "dims", Direction.DOWN, None,
            lambda s: effective_rank_from_gram(s["gram"]), terms=("gram",)),
    Measure("diffusion_attn_entropy", "attention entropy", "nats", Direction.UP, None,
            images="attn", **_per("entropy", "attn_images")),
    Measure("diffusion_attn_zero_share", "attention exact zeros", "share", Direction.DOWN, None,
            images="attn", **_per("zero_share", "attn_images")),
    Measure("knn_top1", "[CLS] k-NN top-1", "%", Direction.NONE, "imagenet_linear", images="knn"),
)
BY_KEY = {m.key: m for m in MEASURES}
ATTENTION_TERMS = ("attn_images", "entropy", "zero_share")
# image_record's terms that are one number per image (the rest: the patch Gram matrix, "gram")
SCALAR_TERMS = ("images", "box_images", "pib_hits", "cosine", "spread") + ATTENTION_TERMS


def image_record(cls: torch.Tensor, patch: torch.Tensor, masks: Sequence[torch.Tensor], grid,
                 attns: Optional[Sequence[torch.Tensor]] = None) -> dict[str, torch.Tensor]:
    """Per image (first axis, float64) the additive terms of the per-image measures, from one forward: ``cls``
    (B, D), ``patch`` (B, N, D), the validation ``masks`` (boxes: each class's extent), the patch ``grid`` (h, w)
    and, when given, each recorded block's (B, heads, T, T) attention weights (mean over blocks, heads, rows)."""
    cls, patch = cls.float().cpu(), patch.float().cpu()
    boxes = torch.stack([boxes_patch_mask(mask_boxes(m), tuple(grid), (m.shape[-2] / grid[0], m.shape[-1] / grid[1]))
                         for m in masks])
    scores, has = patch_scores(cls, patch), boxes.any(1)
    pd = patch.double()
    rec = {"images": torch.ones(len(masks), dtype=torch.float64), "box_images": has.double(),
           "pib_hits": (pib_hits(scores, boxes) & has).double(), "cosine": scores.mean(1).double(),
           "spread": scores.std(1).double(), "gram": pd.transpose(1, 2) @ pd}
    if attns:
        per = [[attention_stats(a[j:j + 1].float().cpu()) for a in attns] for j in range(len(masks))]
        rec["attn_images"] = torch.ones(len(masks), dtype=torch.float64)
        for k in ("entropy", "zero_share"):
            rec[k] = torch.tensor([torch.stack([p[k].double().mean() for p in img]).mean().item() for img in per],
                                  dtype=torch.float64)
    return rec


def sums_of(records: dict[str, torch.Tensor], idx: Optional[torch.Tensor] = None, terms=None) -> Sums:
    """The sums of per-image ``records`` (concatenated ``image_record`` terms; only ``terms`` if given) over images
    ``idx`` (None: all)."""
    return {k: (v if idx is None else v[idx]).sum(0) for k, v in records.items() if terms is None or k in terms}
