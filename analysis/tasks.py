"""The analyses behind ``make analyze TASK=...``, each as two stages (``analysis/shards.py``): ``extract_<task>``
yields one record per image (the backbone forward), ``finish_<task>`` turns all records into the numbers of
results.json and the figures. ``analysis.registry`` names each task's two stages; ``run_<task>`` runs both in
one process (tests, notebooks). LOST/CorLoc live in ``lost.py``, votes in ``votes.py``."""
from __future__ import annotations

from typing import Iterable, Iterator

import torch

from . import figures
from tokenmix.attention_stats import attention_stats, cls_attention_maps
from .boxes import boxes_to_patch_mask, reference_patch_mask
from .data import Sample, crop_boxes
from .lost import extract_corloc, finish_corloc
from .norms import norm_distribution, patch_norms
from tokenmix.pca import pca_fit, pca_rgb
from .patch_score import patch_scores, pib_hits, score_contrast, single_small_object
from tokenmix.diffusion import TIE_SEED, average_patch_scores, pick_distribution, position_chance, tied
from .shards import Options, batches, pct, run_local, vis_lists

__all__ = ["Options", "run_pib", "run_corloc"]


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
            m = boxes_to_patch_mask(crop_boxes(s, rc), grid, ps) if opts.pib_rule != "reference" else \
                reference_patch_mask(s.boxes, W, H, opts.resize, opts.crop, ps)
            masks.append(m)
            small.append(is_small)
            chance.append(m.float().mean())  # PiB of a top patch drawn uniformly at random
            outside += int(not m.any())
    return keep, masks, small, chance, outside


@torch.no_grad()
def extract_pib(model, samples: Iterable[Sample], opts: Options) -> Iterator[dict]:
    """Per image with a box (in ``opts.pib_subset``): the PiB hit of every block's [CLS] ("hits", (L,) bool; exact
    ties at random, one Generator seeded ``TIE_SEED``), the single-small flag, the chance share, the last block's
    pick distribution and box mask (position-aware chance), the most-average-patch baseline's hit and contrast, and
    for ``lastvit`` the aggregated token's hit and the votes."""
    is_lastvit = getattr(model, "aggregator", None) is not None
    gen = torch.Generator().manual_seed(TIE_SEED)
    for buf, x, rcs in batches(samples, opts, need_boxes=True):
        grid = model.grid_size(x)
        keep, masks, small, chance, _ = _pib_masks(buf, rcs, grid, model.patch_size, opts)
        if not any(keep):
            continue
        x = x[torch.tensor(keep)]
        buf, rcs = [s for s, k in zip(buf, keep) if k], [r for r, k in zip(rcs, keep) if k]
        masks = torch.stack(masks).to(x.device)
        outs = _extract_all(model, x, votes=is_lastvit)
        scores = [patch_scores(o["cls_token"], o["patch"]) for o in outs]
        hits = torch.stack([pib_hits(sc, masks, gen) for sc in scores]).cpu()  # (L, b)
        contrast, cos = score_contrast(scores[-1], masks).cpu(), scores[-1].mean(1).cpu()
        avg = average_patch_scores(outs[-1]["patch"])
        avg_hit, avg_contrast = pib_hits(avg, masks, gen).cpu(), score_contrast(avg, masks).cpu()
        picks, ties = pick_distribution(scores[-1]).float().cpu(), tied(scores[-1]).cpu()
        agg = patch_scores(outs[-1]["cls"], outs[-1]["patch"]) if is_lastvit else None
        for j, s in enumerate(buf):
            rec = {"index": s.index, "hits": hits[:, j].clone(), "small": small[j], "chance": chance[j],
                   "outside": not bool(masks[j].any()), "contrast": float(contrast[j]), "cos": float(cos[j]),
                   "picks": picks[j].clone(), "mask": masks[j].cpu().clone(), "tied": bool(ties[j]),
                   "avg_hit": bool(avg_hit[j]), "avg_contrast": float(avg_contrast[j])}
            vis = {"img": x[j].cpu().clone(), "map": scores[-1][j].reshape(grid).cpu().clone(),
                   "boxes": crop_boxes(s, rcs[j]).tolist(), "top": int(scores[-1][j].argmax()),
                   "cap": "hit" if bool(hits[-1, j]) else "miss"}
            if is_lastvit:
                v, m = outs[-1]["votes"][j].float(), masks[j]
                rec.update(agg_hit=bool(pib_hits(agg[j:j + 1], m[None])[0]),
                           agg_contrast=float(score_contrast(agg[j:j + 1], m[None])[0]),
                           votes_in_box=((v * m).sum() / v.sum()).cpu().clone(), vote_top_in_box=bool(m[v.argmax()]))
                vis.update(agg_map=agg[j].reshape(grid).cpu().clone(), agg_top=int(agg[j].argmax()),
                           votes=v.reshape(grid).cpu().clone())
            yield {**rec, "vis": vis}


def finish_pib(model, records: list[dict], run, opts: Options) -> dict:
    """PiB of the encoder's [CLS] output (``pib_cls``, LAST-ViT's ``evaluate_patch_hit.py``; = ``pib``) per block,
    and for ``lastvit`` also of the aggregated token (``pib_aggregated``, last block only: it exists there)."""
    if not records:
        raise RuntimeError("no image with a ground-truth box to evaluate (check the dataset has boxes, and "
                           "--pib-subset: 'single_small' keeps only one-object images whose box is < 25% of the image)")
    is_lastvit = getattr(model, "aggregator", None) is not None
    agg = torch.tensor([r["agg_hit"] for r in records]) if is_lastvit else None
    res = _pib_results(torch.stack([r["hits"] for r in records], 1), agg, torch.tensor([r["small"] for r in records]),
                       [r["chance"] for r in records], sum(r["outside"] for r in records), opts)
    res.update(_score_summary(records, is_lastvit))
    res.update(_pib_baselines(records))
    if is_lastvit:
        res["votes"] = {"share_of_votes_in_box": round(100 * torch.stack([r["votes_in_box"] for r in records])
                                                       .mean().item(), 3),
                        "most_voted_patch_in_box": pct(torch.tensor([r["vote_top_in_box"] for r in records]))}
    _pib_figures(run, res, vis_lists(records, opts.num_vis), is_lastvit)
    return res


def _score_summary(records: list[dict], is_lastvit: bool) -> dict:
    """Continuous companions of PiB over the same images: the Patch Score contrast (box patches minus the rest;
    images whose box covers every patch or none are left out) and the mean cos(patch, [CLS]), last block."""
    def mean(key):
        v = torch.tensor([r[key] for r in records], dtype=torch.float64)
        return round(v.nanmean().item(), 6) if not v.isnan().all() else None
    return {"patch_score_contrast": mean("contrast"), "cls_patch_cos": mean("cos"),
            "patch_score_contrast_aggregated": mean("agg_contrast") if is_lastvit else None}


def _pib_baselines(records: list[dict]) -> dict:
    """What the [CLS] PiB is read against: the share of images whose top score is tied (broken at random), the
    position-aware chance (``tokenmix.diffusion.position_chance``: the box coverage at each position, weighted by
    how often the scorer picks it), and the most-average-patch scorer's PiB and contrast."""
    picks, masks = torch.stack([r["picks"] for r in records]), torch.stack([r["mask"] for r in records])
    contrast = torch.tensor([r["avg_contrast"] for r in records], dtype=torch.float64)
    return {"tied_share": pct(torch.tensor([r["tied"] for r in records])), "tie_seed": TIE_SEED,
            "pib_chance_position": round(100 * position_chance(picks, masks), 3),
            "pib_average_patch": pct(torch.tensor([r["avg_hit"] for r in records])),
            "patch_score_contrast_average_patch": round(contrast.nanmean().item(), 6)}


def _pib_results(H: torch.Tensor, agg: torch.Tensor | None, small: torch.Tensor, chance, outside: int,
                 opts: Options) -> dict:
    depth = H.shape[0]
    per_layer = [pct(H[l]) for l in range(depth)]
    any_small = bool(small.any())
    return {
        "pib": per_layer[-1], "pib_cls": per_layer[-1], "pib_cls_per_layer": per_layer, "pib_per_layer": per_layer,
        "pib_aggregated": None if agg is None else pct(agg),
        "per_layer_through_final_norm": True,  # each block's [CLS]/patch outputs pass the final norm first
        "n_images": int(H.shape[1]), "subset": opts.pib_subset, "n_single_small": int(small.sum()),
        "pib_single_small": pct(H[-1][small]) if any_small else None,
        "pib_single_small_per_layer": [pct(H[l][small]) for l in range(depth)] if any_small else None,
        "pib_aggregated_single_small": pct(agg[small]) if agg is not None and any_small else None,
        "n_box_outside_crop": outside, "pib_chance": round(100 * torch.stack(chance).mean().item(), 3),
        "pib_chance_definition": "pib_chance: mean box share (a uniform pick); pib_chance_position: the box coverage "
                                 "of each position weighted by the [CLS] scorer's picks (ties split evenly)",
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
    if not vis.get("img"):
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
def extract_pca(model, samples: Iterable[Sample], opts: Options) -> Iterator[dict]:
    """Per image: its last-block patch tokens (N, D)."""
    for buf, x, _ in batches(samples, opts):
        patch = model.extract(x)[-1]["patch"].cpu()
        for j, s in enumerate(buf):
            yield {"index": s.index, "patch": patch[j].clone(), "vis": {"img": x[j].cpu().clone()}}


def finish_pca(model, records: list[dict], run, opts: Options) -> dict:
    if not records:
        raise RuntimeError("no images to analyse")
    patch = torch.stack([r["patch"] for r in records])
    grid = (opts.crop // model.patch_size, opts.crop // model.patch_size)
    joint = pca_rgb(patch, grid, joint=True)
    single = pca_rgb(patch, grid, joint=False)
    fg = pca_rgb(patch, grid, joint=True, fg_threshold=opts.fg_threshold)
    fg_share = (fg.amax(1) > 0).float().mean().item()  # background is exactly black
    _, _, var = pca_fit(patch.reshape(-1, patch.shape[-1]), 3)
    total = patch.reshape(-1, patch.shape[-1]).double().var(0, unbiased=True).sum()
    imgs = vis_lists(records, opts.num_vis).get("img", [])
    n = len(imgs)
    if n:
        run.save_figure("pca_maps", figures.rgb_maps(
            imgs, {"joint PCA": joint[:n], "per-image PCA": single[:n],
                   f"foreground > {opts.fg_threshold}": fg[:n]}, "First 3 principal components as RGB"))
    ratio = (var / total).tolist()
    run.log_scalar("pca/explained_variance_top3", sum(ratio))
    return {"n_images": len(records), "explained_variance_ratio": [round(r, 5) for r in ratio],
            "foreground_share": round(fg_share, 5), "fg_threshold": opts.fg_threshold}


# --------------------------------------------------------------------------- high-norm tokens

@torch.no_grad()
def extract_norms(model, samples: Iterable[Sample], opts: Options) -> Iterator[dict]:
    """Per image: patch-token norms (L, N) of every block, after the final norm and in the residual stream."""
    depth, P = model.depth, model.num_prefix_tokens
    for buf, x, _ in batches(samples, opts):
        raw = [None] * depth
        hooks = [blk.register_forward_hook(lambda m, i, o, l=l: raw.__setitem__(l, patch_norms(o[:, P:]).cpu()))
                 for l, blk in enumerate(model.blocks)]
        try:
            normed = [patch_norms(o["patch"]).cpu() for o in model.extract(x, blocks=list(range(depth)))]
        finally:
            for h in hooks:
                h.remove()
        normed, raw = torch.stack(normed, 1), torch.stack(raw, 1)  # (B, L, N)
        for j, s in enumerate(buf):
            yield {"index": s.index, "normed": normed[j].clone(), "raw": raw[j].clone()}


def finish_norms(model, records: list[dict], run, opts: Options) -> dict:
    if not records:
        raise RuntimeError("no images to analyse")
    per = lambda key: [{"layer": l, **norm_distribution(torch.stack([r[key][l] for r in records]))}  # noqa: E731
                       for l in range(model.depth)]
    st_norm, st_raw = per("normed"), per("raw")
    share = {"after final norm": [s["high_norm_share"] for s in st_norm],
             "residual stream": [s["high_norm_share"] for s in st_raw]}
    for name, st, where in (("normed", st_norm, "after final norm"), ("residual", st_raw, "residual stream")):
        run.save_figure(f"norms_hist_{name}", figures.norm_histograms(st, f"Patch-token norms per block ({where})"))
    run.save_figure("high_norm_share", figures.layer_curves(share, "Share of patch tokens in the high-norm mode",
                                                            "share (%)", percent=True))
    for l, v in enumerate(share["after final norm"]):
        run.log_scalar("norms/high_norm_share", v, l)
    slim = lambda ss: [{k: v for k, v in s.items() if k not in ("hist_edges", "hist_counts")} for s in ss]  # noqa: E731
    return {"n_images": len(records),
            "high_norm_share": st_norm[-1]["high_norm_share"],
            "high_norm_share_per_layer": share["after final norm"],
            "high_norm_share_residual_per_layer": share["residual stream"],
            "per_layer": slim(st_norm), "per_layer_residual": slim(st_raw),
            "definition": "2-component GMM on log norms; bimodal if Ashman D > 2, high weight < 0.5 and a valley "
                          "(docs/analysis.md)"}


# --------------------------------------------------------------------------- attention statistics

ATTN_QUERIES, ATTN_KEYS = ("all", "cls", "patch"), ("zero_share", "support_size", "entropy")


@torch.no_grad()
def extract_attention(model, samples: Iterable[Sample], opts: Options) -> Iterator[dict]:
    """Per image: per block and head statistics {queries: {stat: (L, H)}}; the last block's [CLS] maps to show."""
    P = model.num_prefix_tokens
    for buf, x, _ in batches(samples, opts):
        attns = model.attention_maps(x)
        maps = cls_attention_maps(attns[-1], P, model.grid_size(x)).cpu()
        for j, s in enumerate(buf):
            stats = {}
            for q in ATTN_QUERIES:
                per = [attention_stats(a[j:j + 1], queries=q, num_prefix=P) for a in attns]
                stats[q] = {k: torch.stack([p[k] for p in per]).cpu() for k in ATTN_KEYS}
            yield {"index": s.index, "stats": stats, "vis": {"img": x[j].cpu().clone(), "map": maps[j].clone()}}


def finish_attention(model, records: list[dict], run, opts: Options) -> dict:
    if not records:
        raise RuntimeError("no images to analyse")
    # mean over images of the per-image means (= attention_stats over the whole set: every image has T rows)
    stats = {q: {k: torch.stack([r["stats"][q][k] for r in records]).double().mean(0) for k in ATTN_KEYS}
             for q in ATTN_QUERIES}
    T = model.num_prefix_tokens + (opts.crop // model.patch_size) ** 2
    run.save_figure("attention_stats", figures.layer_head_heatmaps(
        stats["all"], f"Attention per block and head (all queries, T={T} keys)"))
    vis = vis_lists(records, opts.num_vis)
    if vis:
        run.save_figure("cls_attention_maps", figures.head_maps(vis["img"], torch.stack(vis["map"]),
                                                                "[CLS] -> patch attention, last block"))
    for k, v in stats["all"].items():
        for l in range(model.depth):
            run.log_scalar(f"attention/{k}", v[l].mean().item(), l)
    tolist = lambda d: {k: [[round(float(a), 6) for a in row] for row in v] for k, v in d.items()}  # noqa: E731
    return {"n_images": len(records), "num_keys": T,
            "zero_share": round(stats["all"]["zero_share"].mean().item(), 6),
            "zero_share_per_layer": [round(v, 6) for v in stats["all"]["zero_share"].mean(1).tolist()],
            "support_size_per_layer": [round(v, 4) for v in stats["all"]["support_size"].mean(1).tolist()],
            "entropy_per_layer": [round(v, 5) for v in stats["all"]["entropy"].mean(1).tolist()],
            "per_head": {q: tolist(d) for q, d in stats.items()},
            "units": {"zero_share": "fraction of attention entries exactly 0", "support_size": "keys per query",
                      "entropy": "nats"}}


# --------------------------------------------------------------------------- one process

def _in_one_process(extract, finish):
    def run_task(model, samples: Iterable[Sample], run, opts: Options) -> dict:
        return run_local(extract, finish, model, samples, run, opts)
    run_task.__doc__ = "Both stages in this process: extract over ``samples``, then finish (metrics, figures)."
    return run_task


run_pib = _in_one_process(extract_pib, finish_pib)
run_corloc = _in_one_process(extract_corloc, finish_corloc)
