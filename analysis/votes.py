"""``make analyze TASK=votes``: where LaSt-ViT's channels vote.

Each of the D channels of a ``lastvit`` backbone picks its top-K most frequency-stable patches
(``FrequencyTopKPooling``); a patch's vote count is how many picks it got. On images with boxes, on the eval
view: ``share_of_votes_in_box`` (%, against ``chance_share``, the box area share), ``most_voted_patch_in_box``
(LaSt-ViT's Point-in-Box with the vote map as the score), ``top1_vote_share`` / ``patches_with_votes``
(concentration); figures: vote-count maps with the boxes and the most-voted patch.
"""
from __future__ import annotations

from typing import Iterable, Iterator

import torch

from . import figures
from .boxes import boxes_to_patch_mask
from .data import Sample, crop_boxes
from .shards import Options, batches, vis_lists

STATS = ("share_in_box", "top_in_box", "chance", "top1_share", "patches_with_votes")


def vote_box_stats(votes: torch.Tensor, masks: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per image: votes (B, N) counts, masks (B, N) bool -> share in box, top patch in box, chance, concentration.

    >>> s = vote_box_stats(torch.tensor([[3, 1, 0, 0]]), torch.tensor([[True, False, False, True]]))
    >>> [round(float(s[k][0]), 3) for k in ("share_in_box", "top_in_box", "chance", "top1_share")]
    [0.75, 1.0, 0.5, 0.75]
    """
    v = votes.double()
    m = masks.to(v.device)
    total = v.sum(1).clamp_min(1)
    return {"share_in_box": (v * m).sum(1) / total,
            "top_in_box": m.gather(1, v.argmax(1, keepdim=True))[:, 0].double(),
            "chance": m.double().mean(1),
            "top1_share": v.amax(1) / total,
            "patches_with_votes": (v > 0).sum(1).double()}


def check_votes(model) -> None:
    """TASK=votes needs LaSt-ViT's aggregator (checked before any process is started)."""
    if getattr(model, "aggregator", None) is None:
        raise ValueError(f"TASK=votes needs a lastvit backbone (variant lastvit or <normaliser>+lastvit); this "
                         f"checkpoint is variant '{getattr(model, 'variant', '?')}'")


@torch.no_grad()
def extract_votes(model, samples: Iterable[Sample], opts: Options) -> Iterator[dict]:
    """Per image with a box: :func:`vote_box_stats` of its vote counts, and the vote map to show."""
    check_votes(model)
    ps = model.patch_size
    for buf, x, rcs in batches(samples, opts, need_boxes=True):
        grid = model.grid_size(x)
        boxes = [crop_boxes(s, rc) for s, rc in zip(buf, rcs)]
        masks = torch.stack([boxes_to_patch_mask(b, grid, ps) for b in boxes])
        votes = model.extract(x, votes=True)[-1]["votes"].cpu()
        st = vote_box_stats(votes, masks)
        for j, s in enumerate(buf):
            yield {"index": s.index, **{k: v[j].clone() for k, v in st.items()},
                   "vis": {"img": x[j].cpu().clone(), "votes": votes[j].reshape(grid).float(),
                           "boxes": boxes[j].tolist()}}


def finish_votes(model, records: list[dict], run, opts: Options) -> dict:
    if not records:
        raise RuntimeError("no image with a ground-truth box: TASK=votes needs a dataset with boxes "
                           "(DATA=demo, voc, or imagenet with its val boxes)")
    st = {k: torch.stack([r[k] for r in records]) for k in STATS}
    pct = lambda t: round(100.0 * t.mean().item(), 3)  # noqa: E731
    res = {"share_of_votes_in_box": pct(st["share_in_box"]), "chance_share": pct(st["chance"]),
           "most_voted_patch_in_box": pct(st["top_in_box"]), "top1_vote_share": pct(st["top1_share"]),
           "patches_with_votes": round(st["patches_with_votes"].mean().item(), 3),
           "n_images": len(records), "k": model.aggregator.k, "channels": model.embed_dim,
           "units": "percent (patches_with_votes: count per image)"}
    run.log_scalar("votes/share_in_box", res["share_of_votes_in_box"])
    run.log_scalar("votes/most_voted_patch_in_box", res["most_voted_patch_in_box"])
    vis = vis_lists(records, opts.num_vis)
    if vis:
        run.save_figure("vote_count_maps", figures.heatmap_overlays(
            vis["img"], vis["votes"], "LaSt-ViT vote counts (channels choosing each patch); green = GT box, "
            "cyan = most voted", boxes=vis["boxes"], markers=[int(v.argmax()) for v in vis["votes"]],
            cmap="viridis"))
    return res
