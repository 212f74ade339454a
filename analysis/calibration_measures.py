"""The dense measures of the calibration (``analysis/calibration.py``), each kept per image (or per probe seed) so
that any resample of the images gives its value (``tokenmix.noise``: paired bootstrap). Keys, labels, directions
and the per-image terms: ``tokenmix.dense_measures`` (the registry ``DenseProbeCheck`` uses too).

One evaluation of a backbone (with the diffusion dial set by the caller) is three passes of the frozen model, each
image one ``TokenMixViT.forward_record``:

- the segmentation task's training images (the probe protocol's views, ``probes.core.data``): the ridge probe's sums
  (``probes.dense.ridge``) and the dense-retrieval memory (``probes.headfree.retrieval``, the Hummingbird core on plain views, as
  ``DenseProbeCheck``), one memory per probe seed, or one for all when the memory holds every patch (the seed then
  only orders it: no replicates to count);
- its validation images: per image the ridge and retrieval confusion matrices and ``image_record``'s terms (for the
  first ``attn_images`` with every block's attention); the patch features are kept for overclustering
  (``probes.headfree.overcluster``, K = the number of classes, Hungarian matching, one faiss k-means per probe seed);
- the classification set: the [CLS] k-NN (k = 20, T = 0.07, ``tokenmix.knn``), per test image.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from datamodules.datamodule_base import dense_collate
from datamodules.transforms.views import normalize
from probes.headfree import retrieval as hb
from probes.headfree.matching import confusion, hungarian, matched_miou
from probes.headfree.overcluster import ClusterSettings, overcluster
from probes.dense.ridge import RidgeSegProbe
from probes.dense.seg_metric import confmat_scores
from tokenmix.dense_measures import ATTENTION_TERMS, BY_KEY, image_record, sums_of
from tokenmix.knn import knn_classify

KNN_K, KNN_T = 20, 0.07  # DINO eval_knn's headline


@dataclass(frozen=True)
class ProbeSettings:
    """The probes of one calibration evaluation."""
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
    val: dict[str, torch.Tensor]           # image_record's terms of the n validation images
    attn: dict[str, torch.Tensor]          # its attention terms of the first attn_images
    knn_correct: Optional[torch.Tensor] = None  # (t,) bool, [CLS] k-NN on the classification set


def forward(model, images: torch.Tensor, device: str, record=()):
    """``TokenMixViT.forward_record`` of the normalised ``images``."""
    return model.forward_record(normalize(images.to(device)), record)


def _loader(ds, bs: int) -> DataLoader:
    return DataLoader(ds, batch_size=bs, shuffle=False, collate_fn=dense_collate)


def _train_pass(model, dm, s: ProbeSettings):
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


def seg_evaluation(model, dm, s: ProbeSettings) -> Evaluation:
    """Both segmentation passes (module docstring)."""
    probe, memories = _train_pass(model, dm, s)
    C, out = s.num_classes, {k: [] for k in ("ridge", "ret", "val", "attn", "feats", "masks")}
    seen = 0
    for batch in _loader(dm.val_set, s.batch_size):
        n_attn = max(0, min(len(batch["image"]), s.attn_images - seen))
        cls, patch, grid, attns = forward(model, batch["image"], s.device, range(model.depth) if n_attn else ())
        masks = batch["mask"] if isinstance(batch["mask"], list) else list(batch["mask"])
        logits = probe.logits(grid)
        for j, gt in enumerate(masks):
            up = F.interpolate(logits[j:j + 1], size=gt.shape[-2:], mode="bilinear", align_corners=False)
            out["ridge"].append(confusion(gt, up.argmax(1)[0], C, C))
            out["ret"].append(torch.stack([hb.confusion_of(grid[j:j + 1].float(), [gt], mf, my, C)
                                           for mf, my in memories]))
        out["val"].append(image_record(cls, patch, masks, grid.shape[-2:]))
        if n_attn:
            rec = image_record(cls[:n_attn], patch[:n_attn], masks[:n_attn], grid.shape[-2:],
                               [a[:n_attn] for a in attns])
            out["attn"].append({k: rec[k] for k in ATTENTION_TERMS})
        out["feats"].append(grid.float().cpu())
        out["masks"] += [torch.as_tensor(m) for m in masks]
        seen += len(masks)
    oc = _overcluster(torch.cat(out["feats"]), out["masks"], C, s.seeds)
    cat = lambda recs: {k: torch.cat([r[k] for r in recs]) for k in (recs[0] if recs else {})}  # noqa: E731
    return Evaluation(torch.stack(out["ridge"]), torch.stack(out["ret"], 1), oc, cat(out["val"]), cat(out["attn"]))


def _overcluster(feats: torch.Tensor, masks: list[torch.Tensor], C: int, seeds: int) -> list[float]:
    """mIoU (%) of the probe's k-means (faiss, after its standardisation and PCA) with K = C, one per probe seed
    (k-means seed); masks resized (nearest) to a common size if needed."""
    size = masks[0].shape[-2:]
    m = torch.stack([mk if mk.shape[-2:] == size else
                     F.interpolate(mk[None, None].float(), size=tuple(size), mode="nearest")[0, 0].long()
                     for mk in masks])
    return [100 * v for v in overcluster(feats, m, C, [C], ClusterSettings(seeds=seeds))[C]["seeds"]]


def knn_evaluation(model, dm, s: ProbeSettings) -> torch.Tensor:
    """(t,) bool: is each test image's weighted k-NN label (over the training [CLS] tokens) right?"""
    def feats(ds):
        f, y = [], []
        for batch in _loader(ds, 4 * s.batch_size):
            f.append(forward(model, batch["image"], s.device)[0].float().cpu())
            y.append(torch.as_tensor(batch["label"]))
        return torch.cat(f), torch.cat(y).long()

    (tf, tl), (vf, vl) = feats(dm.train_set), feats(dm.val_set)
    C = int(max(tl.max(), vl.max())) + 1
    return knn_classify(tf, tl, vf, C, k=KNN_K, T=KNN_T) == vl


# --------------------------------------------------------------------------- the measures of an evaluation

def _sel(t: torch.Tensor, idx: Optional[torch.Tensor]) -> torch.Tensor:
    return t if idx is None else t[idx]


def _ridge(stat: str):
    return lambda ev, i, s: 100 * confmat_scores(_sel(ev.ridge_cm, i).sum(0).long())[stat].item()


def _retrieval(ev: Evaluation, i, s: int) -> float:
    cm = _sel(ev.retrieval_cm[s], i).sum(0)
    return 100 * matched_miou(cm, hungarian(cm))["mIoU"]


# the probe measures: (evaluation, image resample or None, probe seed) -> value; the others: their registry value
PROBE_VALUES = {
    "dense_mIoU": _ridge("mIoU"), "dense_aAcc": _ridge("aAcc"), "dense_mAcc": _ridge("mAcc"),
    "dense_retrieval_mIoU": _retrieval,
    "dense_overcluster_mIoU": lambda ev, i, s: ev.overcluster_miou[s],
    "knn_top1": lambda ev, i, s: 100 * _sel(ev.knn_correct, i).float().mean().item(),
}


def value(ev: Evaluation, key: str, idx: Optional[torch.Tensor] = None, seed: int = 0) -> float:
    """Measure ``key`` of ``ev`` on a resample ``idx`` of the images it reads (None: as measured), probe seed
    ``seed``."""
    if key in PROBE_VALUES:
        return float(PROBE_VALUES[key](ev, idx, seed))
    m = BY_KEY[key]
    return float(m.value(sums_of(ev.attn if m.images == "attn" else ev.val, idx, m.terms)))


def images_of(ev: Evaluation, key: str) -> int:
    """How many images a resample of ``key`` draws (0: none, its only replicates are probe seeds)."""
    by = BY_KEY[key].images
    if key == "dense_overcluster_mIoU":
        return 0
    if by == "knn":
        return 0 if ev.knn_correct is None else len(ev.knn_correct)
    return len(next(iter((ev.attn if by == "attn" else ev.val).values()), []))


def seeds_of(ev: Evaluation, key: str) -> int:
    """Real probe seeds of ``key`` (1 where the probe draws nothing or one memory serves every seed)."""
    seeds = {"dense_retrieval_mIoU": len(ev.retrieval_cm), "dense_overcluster_mIoU": len(ev.overcluster_miou)}
    return seeds.get(key, 1)


def keys_of(ev: Evaluation) -> list[str]:
    """The measures ``ev`` has, in registry order."""
    return [k for k in BY_KEY if (k != "knn_top1" or ev.knn_correct is not None)
            and (BY_KEY[k].images != "attn" or ev.attn)]
