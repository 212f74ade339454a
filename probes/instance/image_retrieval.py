"""Image retrieval on revisited Oxford and Paris (``make probe TASK=roxford5k | rparis6k``), as DINO's
eval_image_retrieval.py runs it and filipradenovic/revisitop scores it.

- Descriptor: the last block's normalised [CLS] (``retrieval_descriptor``); ``multiscale``: the mean over the
  image at scales 1, 1/sqrt(2), 1/2 (bilinear on the normalised image), divided by its norm (DINO
  ``utils.multi_scale``). Images are shrunk to at most ``imsize`` on their longer side (the dataset's
  ``thumbnail``) and go through the backbone at that size, one at a time.
- Ranking: cosine of L2-normalised descriptors, database x queries, descending (``rank_database``).
- Score: revisitop's mAP (trapezoids of the precision-recall curve) and mP@k on the Easy / Medium / Hard protocols,
  junk images removed from the ranking (``revisitop_map``; vectorised over ranks and queries, equal to revisitop's
  ``compute_map``: tests/test_image_retrieval.py).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from datamodules.transforms.views import normalize
from tokenmix.precision import inference_autocast

from probes.instance.global_features import Extraction, extract_descriptors, patch_multiple

KAPPAS = (1, 5, 10)  # mP@k, as revisitop's example and DINO print them
SCALES = (1.0, 1 / math.sqrt(2), 0.5)  # DINO utils.multi_scale
CHUNK = 1 << 22  # ranked images x queries scored at once


class RevisitopProtocol(str, Enum):
    """revisitop's three setups (example_evaluate.py): which of a query's lists are positives, which are junk."""
    EASY = "E"    # positives: easy; junk: junk + hard
    MEDIUM = "M"  # positives: easy + hard; junk: junk
    HARD = "H"    # positives: hard; junk: junk + easy


_LISTS = {RevisitopProtocol.EASY: (("easy",), ("junk", "hard")),
          RevisitopProtocol.MEDIUM: (("easy", "hard"), ("junk",)),
          RevisitopProtocol.HARD: (("hard",), ("junk", "easy"))}


@dataclass(frozen=True)
class ImageRetrievalOptions:
    imsize: int = 224          # longer side of every image (``make probe``: the task's, probes.core.task_table)
    multiscale: bool = False   # DINO --multiscale (``make probe``: DINO's README, ``DINO_MULTISCALE``)
    crop_queries: bool = True  # revisitop's protocol: a query is its box (DINO's script reads it whole)
    protocols: tuple[RevisitopProtocol, ...] = tuple(RevisitopProtocol)
    kappas: tuple[int, ...] = field(default=KAPPAS)
    bf16: bool = False         # --bf16: the backbone in bf16 autocast on CUDA (DINO: fp32)


# DINO's README commands: Oxford single-scale at 224, Paris multi-scale at 512 (the sizes: probes.core.task_table)
DINO_MULTISCALE = {"roxford5k": False, "rparis6k": True}


def protocol_lists(gnd: Sequence[dict], protocol: RevisitopProtocol) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per query (positives, junk) as database indices under ``protocol``."""
    ok, junk = _LISTS[RevisitopProtocol(protocol)]
    cat = lambda g, keys: np.concatenate([np.asarray(g[k], dtype=np.int64).ravel() for k in keys])  # noqa: E731
    return [(cat(g, ok), cat(g, junk)) for g in gnd]


def _hits(ranks: np.ndarray, lists: Sequence[np.ndarray], cols: slice) -> np.ndarray:
    """(n_ranked, queries of ``cols``) bool: is the image at each rank in that query's list."""
    sub = ranks[:, cols]
    size = max(int(ranks.max()) + 1, max((int(x.max()) + 1 for x in lists if x.size), default=0))
    member = np.zeros((sub.shape[1], size), dtype=bool)
    for q, idx in enumerate(lists[cols]):
        member[q, idx] = True
    return member[np.arange(sub.shape[1])[None, :], sub]


def revisitop_map(ranks: np.ndarray, lists: Sequence[tuple[np.ndarray, np.ndarray]],
                  kappas: Sequence[int] = KAPPAS) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    """(mAP, AP per query, mP@k, P@k per query) as revisitop's ``compute_map(ranks, gnd, kappas)``: ``ranks``
    (n_ranked, n_queries) database indices best first; a positive's rank is lowered by the junk ranked before it;
    queries without positives are NaN and left out of the means."""
    ranks = np.asarray(ranks)
    n, nq = ranks.shape
    aps, prs = np.full(nq, np.nan), np.full((nq, len(kappas)), np.nan)
    step = max(1, CHUNK // max(n, 1))  # queries per chunk: bounded memory with a million distractors
    oks, junks = [np.asarray(o) for o, _ in lists], [np.asarray(j) for _, j in lists]
    for c0 in range(0, nq, step):
        cols = slice(c0, min(nq, c0 + step))
        ok, junk = _hits(ranks, oks, cols), _hits(ranks, junks, cols)
        before = np.cumsum(junk, axis=0) - junk  # junk strictly before each rank (revisitop: pos > junk)
        r = np.arange(n)[:, None] - before      # ranks with the junk taken out
        j = np.cumsum(ok, axis=0) - 1           # how many positives precede
        with np.errstate(divide="ignore", invalid="ignore"):
            p0 = np.where(r == 0, 1.0, j / np.maximum(r, 1))
        p1 = (j + 1) / (r + 1)
        nres = np.array([len(o) for o in oks[cols]], dtype=np.float64)
        has = nres > 0  # revisitop: a query without positives is NaN, out of the means
        aps[cols] = np.where(has, np.where(ok, p0 + p1, 0.0).sum(0) / 2.0 / np.maximum(nres, 1), np.nan)
        pos1 = np.where(ok, r + 1, np.iinfo(np.int64).max)  # 1-based adjusted ranks of the positives
        last = np.where(ok, r + 1, 0).max(0)
        for t, k in enumerate(kappas):
            kq = np.minimum(last, k)
            prs[cols, t] = np.where(has, (pos1 <= kq[None, :]).sum(0) / np.maximum(kq, 1), np.nan)
    valid = ~np.isnan(aps)
    return float(aps[valid].mean()), aps, prs[valid].mean(0), prs


def rank_database(database: torch.Tensor, queries: torch.Tensor) -> np.ndarray:
    """(n_database, n_queries) database indices by descending cosine (DINO: ``argsort(-db @ q.T, dim=0)``)."""
    db, q = F.normalize(database.double(), dim=1), F.normalize(queries.double(), dim=1)
    return torch.argsort(-(db @ q.T), dim=0, stable=True).numpy()


def block_cls(backbone: nn.Module, x: torch.Tensor, blocks: Optional[Sequence[int]] = None) -> torch.Tensor:
    """The normalised [CLS] of the last block (or of ``blocks``' one block: ``LAYER=k``), fp32."""
    kw = {"blocks": list(blocks)} if blocks is not None else {"n_last_blocks": 1}
    return backbone.extract(patch_multiple(x, backbone), **kw)[-1]["cls"].float()


def retrieval_descriptor(backbone: nn.Module, images: torch.Tensor, multiscale: bool = False,
                         blocks: Optional[Sequence[int]] = None, bf16: bool = False) -> torch.Tensor:
    """(B, D): the last block's normalised [CLS]; ``multiscale``: averaged over ``SCALES`` and divided by its
    norm, as DINO's ``multi_scale`` (which divides a batch of one by its norm). fp32 as DINO; ``bf16``: the
    backbone under bf16 autocast on CUDA."""
    x = normalize(images)
    with inference_autocast(x.device, bf16):
        if not multiscale:
            return block_cls(backbone, x, blocks)
        v = 0.0
        for s in SCALES:
            inp = x if s == 1 else F.interpolate(x, scale_factor=s, mode="bilinear", align_corners=False)
            v = v + block_cls(backbone, inp, blocks)
    v = v / len(SCALES)
    return v / v.norm(dim=1, keepdim=True)


def score(database: torch.Tensor, queries: torch.Tensor, gnd: Sequence[dict], cfg: ImageRetrievalOptions) -> dict:
    """mAP and mP@k (percent) of every protocol in ``cfg.protocols``."""
    ranks = rank_database(database, queries)
    out: dict[str, Any] = {"mAP": {}, "mP@k": {}}
    for p in cfg.protocols:
        m, _, mpr, _ = revisitop_map(ranks, protocol_lists(gnd, p), cfg.kappas)
        out["mAP"][p.value] = 100.0 * m
        out["mP@k"][p.value] = {str(k): 100.0 * v for k, v in zip(cfg.kappas, mpr)}
    return out


def run_image_retrieval(backbone: nn.Module, database, queries, cfg: ImageRetrievalOptions, how: Extraction,
                        blocks: Optional[Sequence[int]] = None) -> dict[str, Any]:
    """Descriptors of both splits (datamodules.datasets.revisitop, opened with ``cfg.imsize`` and
    ``cfg.crop_queries``), then ``score``. Every process extracts its shard; every process gets the metrics."""
    t0 = time.perf_counter()

    def describe(bb, images):
        return retrieval_descriptor(bb, images, cfg.multiscale, blocks, cfg.bf16)

    db = extract_descriptors(backbone, database, describe, 1, how)  # sizes differ: one image per batch (as DINO)
    q = extract_descriptors(backbone, queries, describe, 1, how)
    out = score(db, q, database.gnd, cfg)
    return {**out, "num_database": len(database), "num_queries": len(queries), "imsize": cfg.imsize,
            "multiscale": cfg.multiscale, "crop_queries": cfg.crop_queries, "seconds": time.perf_counter() - t0}


def run_image_retrieval_kind(ctx, cfg: ImageRetrievalOptions, spec, logger) -> dict[str, Any]:
    """``KINDS[Kind.IMAGE_RETRIEVAL].runner``: the probe context's backbone, dataset (``roxford5k`` / ``rparis6k``
    at DATA_ROOT) and options (``ImageRetrievalOptions``); ``spec.blocks``: ``LAYER=k``."""
    from datamodules import build_dataset
    database = build_dataset(ctx.dataset, Path(ctx.root), "database", imsize=cfg.imsize)
    queries = build_dataset(ctx.dataset, Path(ctx.root), "query", imsize=cfg.imsize, crop_queries=cfg.crop_queries)
    how = Extraction(launch=ctx.launch, progress=ctx.progress)
    return run_image_retrieval(ctx.info.model, database, queries, cfg, how, spec.blocks)


def summary_line(m: dict) -> str:
    """The line ``make probe`` prints."""
    return "mAP " + ", ".join(f"{p} {v:.2f}" for p, v in m["mAP"].items())


def profile(m: dict) -> dict:
    """``LAYER=all``: mAP per protocol over the blocks."""
    return {f"mAP {p}": v for p, v in m["mAP"].items()}
