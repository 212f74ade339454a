"""The dense measures of the calibration (``analysis/calibration.py``), each kept per image (or per probe seed) so
that one evaluation gives both the value and its noise band (``tokenmix.noise``: probe seeds, bootstrap over
images).

One evaluation of a backbone (with the diffusion dial set by the caller) is three passes of the frozen model:

- the segmentation task's training images (the probe protocol's views, ``probes.core.data``): the ridge probe's sums
  (``probes.dense.ridge``) and the dense-retrieval memory (``probes.headfree.retrieval``, the Hummingbird core on plain views, as
  ``DenseProbeCheck``) for every probe seed;
- its validation images, one forward each: per image the ridge and retrieval confusion matrices, cos(patch, [CLS])
  (``tokenmix.diffusion``), its Gram matrix (effective rank), Point-in-Box of the [CLS] token and the spread (std
  over the patches) of its Patch Score map (``analysis.patch_score``: boxes = each class's extent in the mask, as
  ``DenseProbeCheck``), and for the
  first ``attn_images`` the attention-row entropy and share of exact zeros of the dialed blocks
  (``tokenmix.attention_stats``); the patch features are kept for overclustering (``probes.headfree.overcluster``, K = the
  number of classes, Hungarian matching, one faiss k-means per probe seed);
- the classification set: the [CLS] k-NN (k = 20, T = 0.07, ``tokenmix.knn``), per test image.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from datamodules.datamodule_base import dense_collate
from probes.headfree import retrieval as hb
from probes.core.features import normalize_images
from probes.headfree.matching import confusion, hungarian, matched_miou
from probes.headfree.overcluster import ClusterSettings, overcluster
from probes.dense.ridge import RidgeSegProbe
from probes.dense.seg_metric import confmat_scores
from tokenmix.attention_stats import attention_stats
from tokenmix.diffusion import boxes_patch_mask, cls_patch_cosine, effective_rank_from_gram, mask_boxes
from tokenmix.knn import knn_classify

from .patch_score import patch_scores, pib_hits

KNN_K, KNN_T = 20, 0.07  # DINO eval_knn's headline


@dataclass(frozen=True)
class EvalSettings:
    num_classes: int
    seeds: int = 5                 # probe seeds (retrieval memory sampling, k-means init)
    ridge_lambda: float = 1e-2
    retrieval_memory: int = hb.PAPER_MEMORY[0]
    attn_images: int = 32
    batch_size: int = 16
    device: str = "cpu"


@dataclass
class Evaluation:
    """What one evaluation keeps, per validation image (first axis) unless said otherwise."""
    ridge_cm: torch.Tensor                 # (n, K, K) long
    retrieval_cm: torch.Tensor             # (S, n, K, K) long, per probe seed (S = 1: the memory holds every patch)
    overcluster_miou: list[float]          # per probe seed, %
    cosine: torch.Tensor                   # (n,) mean cos(patch, [CLS])
    grams: torch.Tensor                    # (n, D, D) float32 per-image Gram of the patch features
    gram: torch.Tensor                     # (D, D) float64, their exact sum
    pib_hit: torch.Tensor                  # (n,) bool
    has_box: torch.Tensor                  # (n,) bool
    spread: torch.Tensor                   # (n,) std over the patches of the Patch Score cos([CLS], patch)
    entropy: torch.Tensor                  # (m,) attention images: mean row entropy (nats) of the dialed blocks
    zero_share: torch.Tensor               # (m,)
    knn_correct: Optional[torch.Tensor] = None  # (t,) bool, [CLS] k-NN on the classification set


def forward(model, images: torch.Tensor, device: str, record: Sequence[int] = ()):
    """Last block's [CLS] (B, D), patches (B, N, D), patch grid (B, D, h, w) and the attention weights of blocks
    ``record`` (one forward; recording takes the attention layer's explicit lines, equal to rounding)."""
    x = normalize_images(images.to(device))
    layers = [model.blocks[i].attn for i in record]
    for a in layers:
        a.record = True
    try:
        o = model.extract(x, n_last_blocks=1)[-1]
        attns = [a.last_attn.float().cpu() for a in layers]
    finally:
        for a in layers:
            a.record, a.last_attn = False, None
    h, w = model.grid_size(x)
    B, N, D = o["patch"].shape
    return o["cls"].float().cpu(), o["patch"].float().cpu(), o["patch"].transpose(1, 2).reshape(B, D, h, w), attns


def _loader(ds, bs: int) -> DataLoader:
    return DataLoader(ds, batch_size=bs, shuffle=False, collate_fn=dense_collate)


def _train_pass(model, dm, s: EvalSettings):
    """Ridge solution and one retrieval memory per probe seed (one for all when every patch fits the memory),
    from the training images."""
    probe, C = RidgeSegProbe(s.num_classes, s.ridge_lambda), s.num_classes
    probe.empty_stats(model.embed_dim)
    h, w = (n // model.patch_size for n in dm.img_size)
    n_keep = hb.per_image(s.retrieval_memory, len(dm.train_set), 1, h * w)
    # every patch kept: the seed only orders the memory, so one memory serves every seed
    seeds = 1 if n_keep == h * w else s.seeds
    rows: list[list] = [[] for _ in range(seeds)]
    start = 0
    for batch in _loader(dm.train_set, s.batch_size):
        grid = forward(model, batch["image"], s.device)[2]
        probe.add_train(grid, batch["mask"])
        idx = range(start, start + len(grid))
        for seed in range(seeds):
            gens = [hb.image_generator(seed, 0, i) for i in idx]
            rows[seed].append(hb.memory_rows(grid.float().cpu(), batch["mask"], gens, n_keep, model.patch_size, C))
        start += len(grid)
    probe.solve()
    memories = [hb.memory_bank(torch.cat([r[0] for r in rs])[:, None], torch.cat([r[1] for r in rs])[:, None], n_keep)
                for rs in rows]
    return probe, memories


def _image_diffusion(cls, patch, masks, grid) -> tuple[list, list, list, list]:
    """Per image: cos(patch, [CLS]), PiB hit, has a box, Patch Score spread (std over its patches)."""
    boxes = [boxes_patch_mask(mask_boxes(m), tuple(grid), (m.shape[-2] / grid[0], m.shape[-1] / grid[1]))
             for m in masks]
    box = torch.stack(boxes)
    scores = patch_scores(cls, patch)
    hits = pib_hits(scores, box)
    return cls_patch_cosine(cls, patch).tolist(), hits.tolist(), box.any(1).tolist(), scores.std(1).tolist()


def _attention_means(attns: list[torch.Tensor], j: int) -> tuple[float, float]:
    per = [attention_stats(a[j:j + 1]) for a in attns]
    ent = torch.stack([p["entropy"].double().mean() for p in per]).mean().item()
    zero = torch.stack([p["zero_share"].double().mean() for p in per]).mean().item()
    return ent, zero


def seg_evaluation(model, dm, s: EvalSettings, attn_blocks: Sequence[int]) -> Evaluation:
    """Both segmentation passes (module docstring); ``attn_blocks``: the blocks whose attention is measured."""
    probe, memories = _train_pass(model, dm, s)
    C, out = s.num_classes, {k: [] for k in ("ridge", "ret", "cos", "gram", "hit", "box", "spread", "ent", "zero",
                                             "feats", "masks")}
    seen = 0
    for batch in _loader(dm.val_set, s.batch_size):
        record = attn_blocks if seen < s.attn_images else ()
        cls, patch, grid, attns = forward(model, batch["image"], s.device, record)
        masks = batch["mask"] if isinstance(batch["mask"], list) else list(batch["mask"])
        logits = probe.logits(grid)
        for j, gt in enumerate(masks):
            up = F.interpolate(logits[j:j + 1], size=gt.shape[-2:], mode="bilinear", align_corners=False)
            out["ridge"].append(confusion(gt, up.argmax(1)[0], C, C))
            out["ret"].append(torch.stack([hb.confusion_of(grid[j:j + 1].float(), [gt], mf, my, C)
                                           for mf, my in memories]))
            pd = patch[j].double()
            out["gram"].append(pd.T @ pd)
            if seen + j < s.attn_images and attns:
                ent, zero = _attention_means(attns, j)
                out["ent"].append(ent), out["zero"].append(zero)
        for k, v in zip(("cos", "hit", "box", "spread"), _image_diffusion(cls, patch, masks, grid.shape[-2:])):
            out[k] += v
        out["feats"].append(grid.float().cpu())
        out["masks"] += [torch.as_tensor(m) for m in masks]
        seen += len(masks)
    oc = _overcluster(torch.cat(out["feats"]), out["masks"], C, s.seeds)
    grams = torch.stack(out["gram"])
    return Evaluation(torch.stack(out["ridge"]), torch.stack(out["ret"], 1), oc, torch.tensor(out["cos"]),
                      grams.float(), grams.sum(0), torch.tensor(out["hit"]), torch.tensor(out["box"]),
                      torch.tensor(out["spread"]), torch.tensor(out["ent"]), torch.tensor(out["zero"]))


def _overcluster(feats: torch.Tensor, masks: list[torch.Tensor], C: int, seeds: int) -> list[float]:
    """mIoU (%) of the probe's k-means (faiss, after its standardisation and PCA) with K = C, one per probe seed
    (k-means seed); masks resized (nearest) to a common size if needed."""
    size = masks[0].shape[-2:]
    m = torch.stack([mk if mk.shape[-2:] == size else
                     F.interpolate(mk[None, None].float(), size=tuple(size), mode="nearest")[0, 0].long()
                     for mk in masks])
    return [100 * v for v in overcluster(feats, m, C, [C], ClusterSettings(seeds=seeds))[C]["seeds"]]


def knn_evaluation(model, dm, s: EvalSettings) -> torch.Tensor:
    """(t,) bool: is each test image's weighted k-NN label (over the training [CLS] tokens) right?"""
    def feats(ds):
        f, y = [], []
        for batch in _loader(ds, 4 * s.batch_size):
            f.append(forward(model, batch["image"], s.device)[0])
            y.append(torch.as_tensor(batch["label"]))
        return torch.cat(f), torch.cat(y).long()

    (tf, tl), (vf, vl) = feats(dm.train_set), feats(dm.val_set)
    C = int(max(tl.max(), vl.max())) + 1
    return knn_classify(tf, tl, vf, C, k=KNN_K, T=KNN_T) == vl


# --------------------------------------------------------------------------- the measures of an evaluation

def _ridge_miou(cm: torch.Tensor) -> float:
    """The ridge probe's mIoU (mmseg's, classes with an empty union left out) of the counts ``cm``."""
    return 100 * confmat_scores(cm.long())["mIoU"].item()


def _matched(cm: torch.Tensor) -> float:
    return 100 * matched_miou(cm, hungarian(cm))["mIoU"]


def _pib(ev: Evaluation, idx, seed: int = 0) -> float:
    hit, box = _sel(ev.pib_hit, idx), _sel(ev.has_box, idx)
    return 100 * (hit & box).sum().item() / max(1, box.sum().item())


def _sel(t: torch.Tensor, idx: Optional[torch.Tensor]) -> torch.Tensor:
    return t if idx is None else t[idx]


# measure -> (evaluation, image resample or None, probe seed) -> value; which resample a measure takes: RESAMPLED_BY
MEASURE_FNS = {
    "ridge_mIoU": lambda ev, i, s: _ridge_miou(_sel(ev.ridge_cm, i).sum(0)),
    "retrieval_mIoU": lambda ev, i, s: _matched(_sel(ev.retrieval_cm[min(s, len(ev.retrieval_cm) - 1)], i).sum(0)),
    "overcluster_mIoU": lambda ev, i, s: ev.overcluster_miou[s],
    "pib": _pib,
    "patch_score_spread": lambda ev, i, s: _sel(ev.spread, i).mean().item(),
    "cls_patch_cosine": lambda ev, i, s: _sel(ev.cosine, i).mean().item(),
    "effective_rank": lambda ev, i, s: effective_rank_from_gram(ev.gram if i is None else ev.grams[i].double().sum(0)),
    "attn_entropy": lambda ev, i, s: _sel(ev.entropy, i).mean().item(),
    "attn_zero_share": lambda ev, i, s: _sel(ev.zero_share, i).mean().item(),
    "knn_top1": lambda ev, i, s: 100 * _sel(ev.knn_correct, i).float().mean().item(),
}
# the images a measure's bootstrap resamples: "val" segmentation images, "attn" (the first attn_images), "knn"
RESAMPLED_BY = {"attn_entropy": "attn", "attn_zero_share": "attn", "knn_top1": "knn"}


def n_resampled(ev: Evaluation, key: str) -> int:
    by = RESAMPLED_BY.get(key, "val")
    if by == "attn":
        return len(ev.entropy)
    if by == "knn":
        return 0 if ev.knn_correct is None else len(ev.knn_correct)
    return len(ev.cosine)


def measures(ev: Evaluation, keys=None, idx: Optional[torch.Tensor] = None, seed: int = 0) -> dict[str, float]:
    """The measures ``keys`` (default: every one ``ev`` has) of ``ev``, on a resample ``idx`` of the images each
    one reads (``RESAMPLED_BY``; None: as measured) with probe seed ``seed``."""
    keys = [k for k in MEASURE_FNS if k != "knn_top1" or ev.knn_correct is not None] if keys is None else keys
    return {k: float(MEASURE_FNS[k](ev, idx, seed)) for k in keys}
