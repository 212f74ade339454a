"""The marker positive control (``make analyze TASK=marker``): how much a model reads the demo's class-coded marker
(``DemoSpec.lazy_p``, docs/demo-data.md), on cue-conflict scenes (``datamodules.demo.scenes.cue_conflict``: an object
of class c with the marker of class c' != c). Scene i is drawn for each index i the opened split gives (its images are
not read: any dataset sets the count; the default, demo VOC trainval, gives 400, each class pair 7-8 times), at 64 px,
so that the marker is exactly one patch of the demo ViT; normalised as the supervised eval view (no resize).

Readouts, each a mean over scenes:
  (a) ``follows_marker`` / ``follows_object``: the classifier's prediction is c' / c (supervised checkpoints: the
      head is loaded, ``Analysis.classifier``); chance 1/8 each.
  (b) ``pib_marker``: the top patch of cos(token, patch) is the marker's patch (ties at random, ``TIE_SEED``);
      chance 1/N. Token: the encoder's [CLS] output; ``pib_marker_aggregated`` for LaSt-ViT's aggregated token.
  (c) ``cls_attention_marker``: the last block's [CLS] attention on the marker's patch, mean over heads; uniform
      attention gives 1/T.
  (d) ``patch_score_contrast``: mean cos([CLS], patch) over the object's patches minus the rest's.
Known positive (``restricted``): the same model with the last block's [CLS] attending to no object patch (prefix
tokens and background patches only), so that [CLS] carries less of the object: ``pib_object`` (top patch on the
object) and the contrast should fall, which checks the instrument without training. ``restricted_all``: the same in
every block (the last block alone can leave [CLS] much as it was: it gathered the object in earlier blocks).
"""
from __future__ import annotations

import contextlib
from typing import Iterable, Iterator

import torch

from datamodules.demo.cache import DEFAULT_SPEC
from datamodules.demo.scenes import MARKER_GRID, cue_conflict
from datamodules.transforms.views import normalize
from tokenmix.diffusion import TIE_SEED, patch_scores, pib_hits, score_contrast

from .data import Sample
from .shards import Options, pct

__all__ = ["conflict_batch", "cls_keys_only", "extract_marker", "finish_marker", "with_head"]

SIZE = 64  # the demo scenes' size: MARKER_GRID x MARKER_GRID cells, one patch of vit_demo_patch8 each


def conflict_batch(indices: list[int], seed: int = 0, contrast: float | None = None):
    """Scenes ``indices`` (objects at ``contrast``; default the environment's demo data, TOKENMIX_DEMO_OBJECT) ->
    (normalised images (B, 3, 64, 64), object class (B,), marker class (B,), object patch masks (B, N) bool, marker
    patch index (B,)) on the MARKER_GRID x MARKER_GRID grid."""
    g, cell = MARKER_GRID, SIZE // MARKER_GRID
    contrast = DEFAULT_SPEC.object_contrast if contrast is None else contrast
    imgs, cls, mcls, obj, mk = [], [], [], [], []
    for i in indices:
        img, c, c2, mask, box = cue_conflict(seed, i, SIZE, contrast)
        imgs.append(normalize(torch.from_numpy(img).permute(2, 0, 1).float() / 255))
        cls.append(c), mcls.append(c2)
        obj.append(torch.from_numpy(mask.reshape(g, cell, g, cell).any(axis=(1, 3)).reshape(-1)))
        mk.append(box[1] // cell * g + box[0] // cell)
    return torch.stack(imgs), torch.tensor(cls), torch.tensor(mcls), torch.stack(obj), torch.tensor(mk)


class _ClsKeys:
    """A normaliser (logits -> weights) whose [CLS] row (query 0) sees only the ``allowed`` keys (B, T)."""

    def __init__(self, inner, allowed: torch.Tensor):
        self.inner, self.allowed = inner, allowed

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        row = logits[:, :, :1].masked_fill(~self.allowed[:, None, None, :], float("-inf"))
        logits = torch.cat([row, logits[:, :, 1:]], dim=2)
        return logits.softmax(dim=-1) if self.inner is None else self.inner(logits)


@contextlib.contextmanager
def cls_keys_only(model, allowed: torch.Tensor, blocks=(-1,)):
    """Inside the ``with``, [CLS] attends only to ``allowed`` keys ((B, T) bool over [CLS], registers and patches)
    in ``blocks`` (default the last); restored on exit."""
    layers = [model.blocks[i].attn for i in blocks]
    saved = [a.normalizer for a in layers]
    for a, inner in zip(layers, saved):
        a.normalizer = _ClsKeys(inner, allowed)
    try:
        yield
    finally:
        for a, inner in zip(layers, saved):
            a.normalizer = inner


def _readouts(model, x: torch.Tensor, gen: torch.Generator, obj: torch.Tensor, mk: torch.Tensor) -> dict:
    """One forward: logits, the last block's [CLS] attention, the scores of the encoder's [CLS] (and LaSt-ViT's
    aggregated token), and the per-scene readouts."""
    with model.recording([-1]) as (attn,):
        y = model.forward_features(x)  # blocks, then the final norm
        maps = attn.last_attn
    P = model.num_prefix_tokens
    cls, patch = y[:, 0], y[:, P:]
    agg = model.aggregator(patch)[0] if getattr(model, "aggregator", None) is not None else None
    head = model.head if isinstance(model.head, torch.nn.Linear) else None
    pred = head(cls if agg is None else agg).argmax(1) if head is not None else None
    marker = torch.nn.functional.one_hot(mk, patch.shape[1]).bool()
    scores = patch_scores(cls, patch)
    out = {"pib_marker": pib_hits(scores, marker, gen), "pib_object": pib_hits(scores, obj, gen),
           "contrast": score_contrast(scores, obj),
           "attn_marker": maps[:, :, 0].mean(1).gather(1, (P + mk)[:, None])[:, 0],
           "attn_object": (maps[:, :, 0, P:].mean(1) * obj).sum(1), "pred": pred}
    if agg is not None:
        out["pib_marker_aggregated"] = pib_hits(patch_scores(agg, patch), marker, gen)
    return out


@torch.no_grad()
def extract_marker(model, samples: Iterable[Sample], opts: Options) -> Iterator[dict]:
    """Per scene: the readouts as they are, and with the last block's [CLS] kept off the object (``restricted``)."""
    gen = torch.Generator().manual_seed(TIE_SEED)
    batch: list[int] = []
    for s in samples:
        batch.append(s.index)
        if len(batch) == opts.batch_size:
            yield from _extract(model, batch, gen, opts)
            batch = []
    if batch:
        yield from _extract(model, batch, gen, opts)


def _extract(model, indices: list[int], gen: torch.Generator, opts: Options) -> Iterator[dict]:
    x, c, c2, obj, mk = conflict_batch(indices)
    x, obj, mk = x.to(opts.device), obj.to(opts.device), mk.to(opts.device)
    free = model.grid_size(x)[0] * model.grid_size(x)[1] == obj.shape[1]
    if not free:
        raise ValueError(f"the marker analysis needs a {MARKER_GRID} x {MARKER_GRID} patch grid at {SIZE} px "
                         f"(patch {SIZE // MARKER_GRID}, e.g. vit_demo_patch8); got {model.grid_size(x)}")
    plain = _readouts(model, x, gen, obj, mk)
    P = model.num_prefix_tokens
    allowed = torch.cat([torch.ones(len(indices), P, dtype=torch.bool, device=x.device), ~obj], 1)
    with cls_keys_only(model, allowed):
        restricted = _readouts(model, x, gen, obj, mk)
    with cls_keys_only(model, allowed, range(len(model.blocks))):
        every = _readouts(model, x, gen, obj, mk)
    for j, i in enumerate(indices):
        rec = {"index": i, "cls": int(c[j]), "marker_cls": int(c2[j])}
        for tag, r in (("", plain), ("restricted_", restricted), ("restricted_all_", every)):
            rec.update({tag + k: (None if v is None else float(v[j])) for k, v in r.items() if k != "pred"})
            p = r["pred"]
            rec[tag + "follows_marker"] = None if p is None else bool(p[j] == c2[j])
            rec[tag + "follows_object"] = None if p is None else bool(p[j] == c[j])
        yield rec


def _summary(records: list[dict], tag: str) -> dict:
    def mean(key, scale=1.0, digits=6):
        v = [r[tag + key] for r in records if r.get(tag + key) is not None]
        v = torch.tensor(v, dtype=torch.float64)
        return round(scale * v.nanmean().item(), digits) if len(v) else None
    return {"follows_marker": mean("follows_marker", 100, 3), "follows_object": mean("follows_object", 100, 3),
            "pib_marker": mean("pib_marker", 100, 3), "pib_marker_aggregated": mean("pib_marker_aggregated", 100, 3),
            "pib_object": mean("pib_object", 100, 3), "cls_attention_marker": mean("attn_marker"),
            "cls_attention_object": mean("attn_object"), "patch_score_contrast": mean("contrast")}


def finish_marker(model, records: list[dict], run, opts: Options) -> dict:
    if not records:
        raise RuntimeError("no scenes to analyse")
    n_patches = MARKER_GRID ** 2
    res = {"n_images": len(records), **_summary(records, ""),
           "chance": {"follows_marker": 12.5, "pib_marker": round(100 / n_patches, 3),
                      "cls_attention_marker": round(1 / (n_patches + model.num_prefix_tokens), 6)},
           "restricted": _summary(records, "restricted_"), "restricted_all": _summary(records, "restricted_all_"),
           "tie_seed": TIE_SEED,
           "units": "percent of scenes (follows_*, pib_*), attention weight, cosine difference (contrast)",
           "definition": "cue-conflict scenes (object class c, marker class c' != c); restricted: the last block's "
                         "[CLS] attends to no object patch (the known positive)"}
    for key in ("follows_marker", "pib_marker", "cls_attention_marker", "patch_score_contrast"):
        if res[key] is not None:
            run.log_scalar(f"marker/{key}", res[key])
    return res


def with_head(info, which: str):
    """The backbone of ``info`` (``backbones.load.BackboneInfo``) rebuilt with its checkpoint's classifier head,
    where the checkpoint has one (supervised runs); else the backbone as it is."""
    if not info.checkpoint:
        return info.model
    from backbones.checkpoint import read_checkpoint
    ck = read_checkpoint(info.checkpoint, which=which)
    head = ck.state_dict.get("head.weight")
    return info.model if head is None else ck.build(num_classes=int(head.shape[0]))
