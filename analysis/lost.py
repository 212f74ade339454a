"""LOST unsupervised object discovery (Siméoni et al. 2021, valeoai/LOST ``object_discovery.py``) and CorLoc.

For one image with patch features F (N, D) on an (h, w) grid:
  A = F F^T (raw dot products, no normalisation, as LOST);
  degree of a patch = number of OTHER patches with A > 0;
  seed = lowest-degree patch; the k lowest-degree patches (k=100 in LOST) that correlate positively with the seed
  form the seed set S; mask = patches whose summed correlation to S is > 0;
  box = bounding box of the 4-connected component of the mask containing the seed, in patch units, times the
  patch size, clipped to the image.
Features: last-block keys of all heads concatenated (LOST's default ``--which_features k``); patch outputs of the
last block are the fallback when keys are unavailable (the report says which was used).
Ties in degree are broken at random from a seeded Generator (``tokenmix.diffusion.TIE_SEED``): LOST's
``torch.argsort`` leaves them unspecified, and the first index would make a featureless model's seed the corner
patch. ``seed_tied`` records where the lowest degree was shared. Baseline beside CorLoc: LOST grown from the most
average patch (highest cosine to the image's mean feature) instead of the lowest-degree one.
CorLoc = share of images whose box has IoU >= 0.5 with ANY GT box.
"""
from __future__ import annotations

from dataclasses import dataclass

from typing import Iterable, Iterator

import numpy as np
import scipy.ndimage
import torch

from tokenmix.diffusion import TIE_SEED, average_patch_scores, top_patch

from .boxes import box_iou
from .data import Sample, full_res
from .shards import Options, pct, vis_lists

__all__ = ["LostResult", "lost", "corloc_hit", "last_block_keys", "extract_corloc", "finish_corloc", "CORLOC_IOU"]

CORLOC_IOU = 0.5


@dataclass
class LostResult:
    box: tuple[float, float, float, float]  # xyxy pixels
    box_patches: tuple[int, int, int, int]  # xyxy in patch units (exclusive max)
    seed: int  # row-major patch index
    seed_tied: bool  # another patch had the same lowest degree (the seed was drawn among them)
    seed_set: list[int]
    mask: np.ndarray  # (h, w) bool: the connected component the box encloses
    degree: np.ndarray  # (N,) positive-correlation degree


def lost(feats: torch.Tensor, grid: tuple[int, int], patch_size: int, image_size: tuple[int, int] | None = None,
         k_patches: int = 100, generator: torch.Generator | None = None, seed: int | None = None) -> LostResult:
    """LOST box for one image. feats (N, D) row-major over ``grid`` (h, w); image_size (H, W) clips the box.
    ``generator``: breaks degree ties (default seeded ``TIE_SEED``); ``seed``: grow from this patch instead."""
    h, w = int(grid[0]), int(grid[1])
    if feats.ndim != 2 or feats.shape[0] != h * w:
        raise ValueError(f"expected features (N={h * w}, D) for grid {h}x{w}, got {tuple(feats.shape)}")
    f = feats.detach().to(torch.float64)
    A = f @ f.T
    pos = A.clone()
    pos.fill_diagonal_(0)
    degree = (pos > 0).sum(1)
    perm = torch.randperm(h * w, generator=generator or torch.Generator().manual_seed(TIE_SEED))
    order = perm[torch.sort(degree[perm], stable=True).indices]  # ascending degree, ties in random order
    tied = bool((degree == degree[order[0]]).sum() > 1)
    seed = int(order[0]) if seed is None else int(seed)
    potentials = order[:k_patches]
    similars = potentials[A[seed, potentials] > 0]
    if similars.numel() == 0:  # only if the seed feature is all zeros: fall back to the seed patch itself
        similars = order[:1]
    M = A[similars].sum(0)
    labels, _ = scipy.ndimage.label((M > 0).reshape(h, w).cpu().numpy())
    sy, sx = divmod(seed, w)
    cc = labels[sy, sx]
    comp = labels == cc if cc != 0 else np.zeros((h, w), dtype=bool)
    if cc == 0:
        comp[sy, sx] = True
    ys, xs = np.nonzero(comp)
    bp = (int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1)
    box = [bp[0] * patch_size, bp[1] * patch_size, bp[2] * patch_size, bp[3] * patch_size]
    if image_size is not None:  # the padded border is not part of the image
        box[2] = min(box[2], image_size[1])
        box[3] = min(box[3], image_size[0])
    return LostResult(box=tuple(float(v) for v in box), box_patches=bp, seed=seed, seed_tied=tied,
                      seed_set=[int(i) for i in similars], mask=comp, degree=degree.cpu().numpy())


def corloc_hit(pred_box, gt_boxes, iou: float = CORLOC_IOU) -> bool:
    gt = torch.as_tensor(gt_boxes, dtype=torch.float64).reshape(-1, 4)
    if gt.shape[0] == 0:
        return False
    return bool((box_iou(torch.as_tensor(pred_box, dtype=torch.float64), gt) >= iou).any())


@torch.no_grad()
def last_block_keys(model, images: torch.Tensor) -> torch.Tensor:
    """Keys of the last attention block for the patch tokens: (B, N, D), heads concatenated, prefix removed.

    Captures the block's normalised attention input with a pre-hook and reapplies the block's own q/k/v projection
    (``_qkv`` handles the specialised [CLS] projection), so every variant gives its real keys.
    """
    attn = model.blocks[-1].attn
    seen = {}
    handle = attn.register_forward_pre_hook(lambda m, args, kwargs=None: seen.__setitem__("x", args[0]))
    try:
        model.forward_features(images)
    finally:
        handle.remove()
    x = seen["x"]
    B, T, _ = x.shape
    qkv = attn._qkv(x) if hasattr(attn, "_qkv") else attn.qkv(x)
    k = qkv.reshape(B, T, 3, attn.num_heads, -1)[:, :, 1].transpose(1, 2)  # (B, H, T, hd)
    k = attn.k_norm(k) if hasattr(attn, "k_norm") else k
    k = k.transpose(1, 2).reshape(B, T, -1)
    return k[:, model.num_prefix_tokens:]


@torch.no_grad()
def extract_corloc(model, samples: Iterable[Sample], opts: Options) -> Iterator[dict]:
    """Per image with a GT box: LOST's box on the whole image (zero-padded to the patch grid) and the CorLoc hit;
    the seed's tie flag; the hit of LOST grown from the most average patch."""
    ps, gen = model.patch_size, torch.Generator().manual_seed(TIE_SEED)
    for s in samples:
        if s.boxes is None or s.boxes.shape[0] == 0:
            continue  # LOST evaluates images with at least one GT box
        x = full_res(s.image, ps)[None].to(opts.device)
        f = (last_block_keys(model, x)[0] if opts.lost_features == "k" else model.extract(x)[-1]["patch"][0]).float()
        H, W = s.image.shape[-2:]
        r = lost(f, model.grid_size(x), ps, image_size=(H, W), k_patches=opts.k_patches, generator=gen)
        hit = corloc_hit(r.box, s.boxes)
        avg = lost(f, model.grid_size(x), ps, image_size=(H, W), k_patches=opts.k_patches, generator=gen,
                   seed=int(top_patch(average_patch_scores(f[None]), gen)[0]))
        yield {"index": s.index, "path": s.path, "box": list(r.box), "hit": hit, "seed_tied": r.seed_tied,
               "avg_hit": corloc_hit(avg.box, s.boxes),
               "vis": {"img": x[0].cpu(),  # the padded input, so the patch grid lines up with the map
                       "map": torch.from_numpy(r.mask.astype("float32")), "boxes": s.boxes.tolist(),
                       "pred": [r.box], "cap": "IoU>=0.5" if hit else "miss"}}


BOXES_FILE = "lost_boxes.json"


def finish_corloc(model, records: list[dict], run, opts: Options) -> dict:
    """CorLoc over the records; the predicted boxes go to ``lost_boxes.json`` beside results.json."""
    from . import figures

    if not records:
        raise RuntimeError("no image with a ground-truth box: CorLoc needs a dataset with boxes (VOC, DATA=demo)")
    corloc = pct(torch.tensor([r["hit"] for r in records]))
    run.log_scalar("corloc", corloc)
    vis = vis_lists(records, opts.num_vis)
    if vis:
        run.save_figure("lost_boxes", figures.heatmap_overlays(
            vis["img"], vis["map"], "LOST: seed component (map), predicted box (red), GT boxes (green)",
            boxes=vis["boxes"], pred_boxes=vis["pred"], captions=vis["cap"], cmap="Reds"))
    res = {"corloc": corloc, "n_images": len(records), "features": "last-block keys" if opts.lost_features == "k"
           else "last-block patch outputs", "k_patches": opts.k_patches, "iou_threshold": CORLOC_IOU,
           "seed_tied_share": pct(torch.tensor([r["seed_tied"] for r in records])), "tie_seed": TIE_SEED,
           "corloc_average_patch": pct(torch.tensor([r["avg_hit"] for r in records])),
           "units": "percent of images"}
    if getattr(run, "dir", None) is not None:  # a run folder (AnalysisRun): the boxes, to check or reuse
        from tokenmix.io import atomic_json_dump
        atomic_json_dump([{k: r[k] for k in ("index", "path", "box", "hit")} for r in records], run.dir / BOXES_FILE)
        res["boxes_file"] = BOXES_FILE
    return res
