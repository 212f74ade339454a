"""The five analyses behind ``make analyze TASK=...``. Each takes a backbone, an iterable of ``data.Sample`` and an
``output.AnalysisRun``; it writes figures there and returns the numbers for results.json."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch

from . import figures
from tokenmix.attention_stats import attention_stats, cls_attention_maps
from .boxes import boxes_to_patch_mask
from .data import Sample, crop_boxes, eval_crop, full_res
from .lost import corloc_hit, last_block_keys, lost
from .norms import norm_stats
from tokenmix.pca import pca_fit, pca_rgb
from .patch_score import patch_scores, pib_hits, single_small_object

@dataclass
class Options:
    crop: int = 224
    resize: int = 256
    batch_size: int = 16
    num_vis: int = 8
    pib_subset: str = "all"  # "all" images with boxes | "single_small" (LAST-ViT ImageNet filter)
    fg_threshold: float = 0.5
    lost_features: str = "k"  # "k" (last-block keys, LOST default) | "patch" (last-block outputs)
    k_patches: int = 100
    device: str = "cpu"


def _batches(samples: Iterable[Sample], opts: Options, need_boxes: bool = False):
    """Yield (samples, normalised crops (B, 3, crop, crop), geometries) batches."""
    buf = []
    for s in samples:
        if need_boxes and (s.boxes is None or s.boxes.shape[0] == 0):
            continue
        buf.append(s)
        if len(buf) == opts.batch_size:
            yield _stack(buf, opts)
            buf = []
    if buf:
        yield _stack(buf, opts)


def _stack(buf, opts):
    xs, rcs = zip(*(eval_crop(s.image, opts.resize, opts.crop) for s in buf))
    return buf, torch.stack(xs).to(opts.device), list(rcs)


def _pct(hits: torch.Tensor) -> float | None:
    return None if hits.numel() == 0 else round(100.0 * hits.float().mean().item(), 3)


# --------------------------------------------------------------------------- Patch Score / Point-in-Box

def _extract_all(model, x, votes: bool) -> list[dict]:
    """``model.extract`` of every block, each with "cls_token": that block's own [CLS] output through the final
    norm. It differs from "cls" only in the last block of ``lastvit``, whose "cls" is the aggregated token."""
    if getattr(model, "aggregator", None) is None:
        outs = model.extract(x, blocks=list(range(model.depth)), votes=votes)
        return [{**o, "cls_token": o["cls"]} for o in outs]
    normed = []  # extract() runs model.norm once per block, in block order
    hook = model.norm.register_forward_hook(lambda m, i, o: normed.append(o[:, 0]))
    try:
        outs = model.extract(x, blocks=list(range(model.depth)), votes=votes)
    finally:
        hook.remove()
    return [{**o, "cls_token": c} for o, c in zip(outs, normed)]


def _pib_masks(buf, rcs, grid, ps, opts: Options):
    """Box-patch masks of the kept images: (keep flags, masks, single-small flags, chance shares, #outside)."""
    keep, masks, small, chance, outside = [], [], [], [], 0
    for s, rc in zip(buf, rcs):
        H, W = s.image.shape[-2:]
        is_small = single_small_object(s.boxes, W, H)
        keep.append(opts.pib_subset != "single_small" or is_small)
        if keep[-1]:
            m = boxes_to_patch_mask(crop_boxes(s, rc), grid, ps)
            masks.append(m)
            small.append(is_small)
            chance.append(m.float().mean())  # PiB of a top patch drawn uniformly at random
            outside += int(not m.any())
    return keep, masks, small, chance, outside


@torch.no_grad()
def run_pib(model, samples, run, opts: Options) -> dict:
    """PiB of the encoder's [CLS] output (``pib_cls``, LAST-ViT's ``evaluate_patch_hit.py``; = ``pib``) per block,
    and for ``lastvit`` also of the aggregated token (``pib_aggregated``, last block only: it exists there)."""
    is_lastvit = getattr(model, "aggregator", None) is not None
    hits, agg_hits, small, chance, outside = [], [], [], [], 0
    votes_in_box, vote_top_in_box = [], []
    vis = {"img": [], "map": [], "agg_map": [], "boxes": [], "top": [], "agg_top": [], "votes": [], "cap": []}
    for buf, x, rcs in _batches(samples, opts, need_boxes=True):
        grid = model.grid_size(x)
        keep, masks, sm, ch, out = _pib_masks(buf, rcs, grid, model.patch_size, opts)
        if not any(keep):
            continue
        small, chance, outside = small + sm, chance + ch, outside + out
        x = x[torch.tensor(keep)]
        buf, rcs = [s for s, k in zip(buf, keep) if k], [r for r, k in zip(rcs, keep) if k]
        masks = torch.stack(masks).to(x.device)
        outs = _extract_all(model, x, votes=is_lastvit)
        scores = [patch_scores(o["cls_token"], o["patch"]) for o in outs]
        layer_hits = torch.stack([pib_hits(sc, masks) for sc in scores])  # (L, b)
        hits.append(layer_hits.cpu())
        agg = patch_scores(outs[-1]["cls"], outs[-1]["patch"]) if is_lastvit else None
        if is_lastvit:
            agg_hits.append(pib_hits(agg, masks).cpu())
            v = outs[-1]["votes"].float()
            votes_in_box.append(((v * masks).sum(1) / v.sum(1)).cpu())
            vote_top_in_box.append(masks.gather(1, v.argmax(1, keepdim=True))[:, 0].cpu())
        for j, s in enumerate(buf[:max(0, opts.num_vis - len(vis["img"]))]):
            vis["img"].append(x[j].cpu())
            vis["map"].append(scores[-1][j].reshape(grid).cpu())
            vis["boxes"].append(crop_boxes(s, rcs[j]).tolist())
            vis["top"].append(int(scores[-1][j].argmax()))
            vis["cap"].append("hit" if bool(layer_hits[-1, j]) else "miss")
            if is_lastvit:
                vis["agg_map"].append(agg[j].reshape(grid).cpu())
                vis["agg_top"].append(int(agg[j].argmax()))
                vis["votes"].append(outs[-1]["votes"][j].reshape(grid).float().cpu())
    if not hits:
        raise RuntimeError("no image with a ground-truth box to evaluate (check the dataset has boxes, and "
                           "--pib-subset: 'single_small' keeps only one-object images whose box is < 25% of the image)")
    res = _pib_results(torch.cat(hits, 1), torch.cat(agg_hits) if agg_hits else None, torch.tensor(small),
                       chance, outside, opts)
    if is_lastvit:
        res["votes"] = {"share_of_votes_in_box": round(100 * torch.cat(votes_in_box).mean().item(), 3),
                        "most_voted_patch_in_box": _pct(torch.cat(vote_top_in_box))}
    _pib_figures(run, res, vis, is_lastvit)
    return res


def _pib_results(H: torch.Tensor, agg: torch.Tensor | None, small: torch.Tensor, chance, outside: int,
                 opts: Options) -> dict:
    depth = H.shape[0]
    per_layer = [_pct(H[l]) for l in range(depth)]
    any_small = bool(small.any())
    return {
        "pib": per_layer[-1], "pib_cls": per_layer[-1], "pib_cls_per_layer": per_layer, "pib_per_layer": per_layer,
        "pib_aggregated": None if agg is None else _pct(agg),
        "per_layer_through_final_norm": True,  # each block's [CLS]/patch outputs pass the final norm first
        "n_images": int(H.shape[1]), "subset": opts.pib_subset, "n_single_small": int(small.sum()),
        "pib_single_small": _pct(H[-1][small]) if any_small else None,
        "pib_single_small_per_layer": [_pct(H[l][small]) for l in range(depth)] if any_small else None,
        "pib_aggregated_single_small": _pct(agg[small]) if agg is not None and any_small else None,
        "n_box_outside_crop": outside, "pib_chance": round(100 * torch.stack(chance).mean().item(), 3),
        "units": "percent of images",
        "definition": "top patch by cos(token, patch) inside a GT box; pib = pib_cls (the encoder's [CLS], as "
                      "LAST-ViT's evaluate_patch_hit.py); pib_aggregated: LaSt-ViT's aggregated token",
    }


def _pib_figures(run, res: dict, vis: dict, is_lastvit: bool) -> None:
    run.log_scalar("pib/final", res["pib"])
    for l, v in enumerate(res["pib_per_layer"]):
        run.log_scalar("pib/per_layer", v, l)
    curves = {"[CLS]": res["pib_per_layer"]}
    if is_lastvit:
        run.log_scalar("pib/aggregated", res["pib_aggregated"])
        curves["aggregated token"] = [float("nan")] * (len(res["pib_per_layer"]) - 1) + [res["pib_aggregated"]]
    run.save_figure("pib_per_layer", figures.layer_curves(curves, "Point-in-Box per block", "PiB (%)"))
    if not vis["img"]:
        return
    run.save_figure("patch_score_maps", figures.heatmap_overlays(
        vis["img"], vis["map"], "Patch score = cos([CLS], patch); cyan = top patch, green = GT box",
        boxes=vis["boxes"], markers=vis["top"], captions=vis["cap"]))
    if is_lastvit:
        run.save_figure("patch_score_maps_aggregated", figures.heatmap_overlays(
            vis["img"], vis["agg_map"], "Patch score = cos(aggregated token, patch); cyan = top patch",
            boxes=vis["boxes"], markers=vis["agg_top"]))
        run.save_figure("vote_maps", figures.heatmap_overlays(
            vis["img"], vis["votes"], "LaSt-ViT votes: channels selecting each patch", boxes=vis["boxes"],
            markers=[int(v.argmax()) for v in vis["votes"]], cmap="viridis"))


# --------------------------------------------------------------------------- PCA maps

@torch.no_grad()
def run_pca(model, samples, run, opts: Options) -> dict:
    feats, imgs = [], []
    for buf, x, _ in _batches(samples, opts):
        feats.append(model.extract(x)[-1]["patch"].cpu())
        imgs.append(x.cpu())
    if not feats:
        raise RuntimeError("no images to analyse")
    patch, x = torch.cat(feats), torch.cat(imgs)
    grid = (x.shape[-2] // model.patch_size, x.shape[-1] // model.patch_size)
    joint = pca_rgb(patch, grid, joint=True)
    single = pca_rgb(patch, grid, joint=False)
    fg = pca_rgb(patch, grid, joint=True, fg_threshold=opts.fg_threshold)
    fg_share = (fg.amax(1) > 0).float().mean().item()  # background is exactly black
    _, _, var = pca_fit(patch.reshape(-1, patch.shape[-1]), 3)
    total = patch.reshape(-1, patch.shape[-1]).double().var(0, unbiased=True).sum()
    n = min(opts.num_vis, x.shape[0])
    if n:
        run.save_figure("pca_maps", figures.rgb_maps(
            list(x[:n]), {"joint PCA": joint[:n], "per-image PCA": single[:n],
                          f"foreground > {opts.fg_threshold}": fg[:n]}, "First 3 principal components as RGB"))
    ratio = (var / total).tolist()
    run.log_scalar("pca/explained_variance_top3", sum(ratio))
    return {"n_images": int(x.shape[0]), "explained_variance_ratio": [round(r, 5) for r in ratio],
            "foreground_share": round(fg_share, 5), "fg_threshold": opts.fg_threshold}


# --------------------------------------------------------------------------- high-norm tokens

@torch.no_grad()
def run_norms(model, samples, run, opts: Options) -> dict:
    depth = model.depth
    normed = [[] for _ in range(depth)]
    raw = [[] for _ in range(depth)]
    hooks = [blk.register_forward_hook(lambda m, i, o, l=l: raw[l].append(o[:, model.num_prefix_tokens:].cpu()))
             for l, blk in enumerate(model.blocks)]
    try:
        for _, x, _ in _batches(samples, opts):
            for l, o in enumerate(model.extract(x, blocks=list(range(depth)))):
                normed[l].append(o["patch"].cpu())
    finally:
        for h in hooks:
            h.remove()
    if not normed[0]:
        raise RuntimeError("no images to analyse")
    st_norm = [{"layer": l, **norm_stats(torch.cat(normed[l]))} for l in range(depth)]
    st_raw = [{"layer": l, **norm_stats(torch.cat(raw[l]))} for l in range(depth)]
    share = {"after final norm": [s["high_norm_share"] for s in st_norm],
             "residual stream": [s["high_norm_share"] for s in st_raw]}
    run.save_figure("norms_hist_normed", figures.norm_histograms(st_norm, "Patch-token norms per block (after final norm)"))
    run.save_figure("norms_hist_residual", figures.norm_histograms(st_raw, "Patch-token norms per block (residual stream)"))
    run.save_figure("high_norm_share", figures.layer_curves(share, "Share of patch tokens in the high-norm mode",
                                                            "share (%)", percent=True))
    for l, v in enumerate(share["after final norm"]):
        run.log_scalar("norms/high_norm_share", v, l)
    slim = lambda ss: [{k: v for k, v in s.items() if k not in ("hist_edges", "hist_counts")} for s in ss]  # noqa: E731
    return {"n_images": int(torch.cat(normed[0]).shape[0]),
            "high_norm_share": st_norm[-1]["high_norm_share"],
            "high_norm_share_per_layer": share["after final norm"],
            "high_norm_share_residual_per_layer": share["residual stream"],
            "per_layer": slim(st_norm), "per_layer_residual": slim(st_raw),
            "definition": "2-component GMM on log norms; bimodal if Ashman D > 2, high weight < 0.5 and a valley "
                          "(docs/analysis.md)"}


# --------------------------------------------------------------------------- attention statistics

@torch.no_grad()
def run_attention(model, samples, run, opts: Options) -> dict:
    depth, P = model.depth, model.num_prefix_tokens
    sums: dict[str, dict[str, torch.Tensor]] = {}
    n = 0
    vis_img, vis_maps = [], []
    for _, x, _ in _batches(samples, opts):
        attns = model.attention_maps(x)
        b = x.shape[0]
        for q in ("all", "cls", "patch"):
            st = {k: torch.stack([attention_stats(a, queries=q, num_prefix=P)[k] for a in attns]) * b
                  for k in ("zero_share", "support_size", "entropy")}
            acc = sums.setdefault(q, {k: torch.zeros_like(v) for k, v in st.items()})
            for k, v in st.items():
                acc[k] += v
        n += b
        if len(vis_img) < opts.num_vis:
            k = opts.num_vis - len(vis_img)
            vis_img += list(x[:k].cpu())
            vis_maps.append(cls_attention_maps(attns[-1][:k], P, model.grid_size(x)).cpu())
    if n == 0:
        raise RuntimeError("no images to analyse")
    stats = {q: {k: v / n for k, v in d.items()} for q, d in sums.items()}
    T = P + (opts.crop // model.patch_size) ** 2
    run.save_figure("attention_stats", figures.layer_head_heatmaps(
        stats["all"], f"Attention per block and head (all queries, T={T} keys)"))
    if vis_img:
        run.save_figure("cls_attention_maps", figures.head_maps(vis_img, torch.cat(vis_maps),
                                                                "[CLS] -> patch attention, last block"))
    for k, v in stats["all"].items():
        for l in range(depth):
            run.log_scalar(f"attention/{k}", v[l].mean().item(), l)
    tolist = lambda d: {k: [[round(float(a), 6) for a in row] for row in v] for k, v in d.items()}  # noqa: E731
    return {"n_images": n, "num_keys": T,
            "zero_share": round(stats["all"]["zero_share"].mean().item(), 6),
            "zero_share_per_layer": [round(v, 6) for v in stats["all"]["zero_share"].mean(1).tolist()],
            "support_size_per_layer": [round(v, 4) for v in stats["all"]["support_size"].mean(1).tolist()],
            "entropy_per_layer": [round(v, 5) for v in stats["all"]["entropy"].mean(1).tolist()],
            "per_head": {q: tolist(d) for q, d in stats.items()},
            "units": {"zero_share": "fraction of attention entries exactly 0", "support_size": "keys per query",
                      "entropy": "nats"}}


# --------------------------------------------------------------------------- LOST + CorLoc

@torch.no_grad()
def run_corloc(model, samples, run, opts: Options) -> dict:
    ps = model.patch_size
    hits = []
    vis = {"img": [], "map": [], "boxes": [], "pred": [], "cap": []}
    for s in samples:
        if s.boxes is None or s.boxes.shape[0] == 0:
            continue  # LOST evaluates images with at least one GT box
        x = full_res(s.image, ps)[None].to(opts.device)
        grid = model.grid_size(x)
        if opts.lost_features == "k":
            f = last_block_keys(model, x)[0]
        else:
            f = model.extract(x)[-1]["patch"][0]
        H, W = s.image.shape[-2:]
        r = lost(f, grid, ps, image_size=(H, W), k_patches=opts.k_patches)
        hit = corloc_hit(r.box, s.boxes)
        hits.append(hit)
        if len(vis["img"]) < opts.num_vis:
            vis["img"].append(x[0].cpu())  # the padded input, so the patch grid lines up with the map
            vis["map"].append(torch.from_numpy(r.mask.astype("float32")))
            vis["boxes"].append(s.boxes.tolist())
            vis["pred"].append([r.box])
            vis["cap"].append("IoU>=0.5" if hit else "miss")
    if not hits:
        raise RuntimeError("no image with a ground-truth box: CorLoc needs a dataset with boxes (VOC, DATA=demo)")
    corloc = _pct(torch.tensor(hits))
    run.log_scalar("corloc", corloc)
    if vis["img"]:
        run.save_figure("lost_boxes", figures.heatmap_overlays(
            vis["img"], vis["map"], "LOST: seed component (map), predicted box (red), GT boxes (green)",
            boxes=vis["boxes"], pred_boxes=vis["pred"], captions=vis["cap"], cmap="Reds"))
    return {"corloc": corloc, "n_images": len(hits), "features": "last-block keys" if opts.lost_features == "k"
            else "last-block patch outputs", "k_patches": opts.k_patches, "iou_threshold": 0.5,
            "units": "percent of images"}
