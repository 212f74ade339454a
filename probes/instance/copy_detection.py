"""Copy detection on Copydays (``make probe TASK=copydays``), as DINO's eval_copy_detection.py runs and scores it.

- Descriptor (``copy_descriptor``): the last block's normalised [CLS] concatenated with the GeM (p = 4) pool of its
  patch tokens clamped at 1e-6; images resized to ``imsize`` x ``imsize`` (bicubic; DINO's default 320).
- Database: the originals, plus the distractors when given. Queries: every Copydays block present (``original``,
  ``strong``, the jpegqual / crops ones); ``strong`` is the reported figure (DINO's README: "eval on strong").
- Whitening (``Whitening.learn``), when a whitening set is given: the descriptors are centred on the whitening
  set's mean and multiplied by ``diag(d ** -0.5) V^T`` from the eigen-decomposition of the whitening set's
  covariance, which DINO computes without centring (``F^T F / n``); eigenvalues below 1e-5 x the largest are
  raised to it (DINO ``utils.PCA``, float32 as there).
- Search: cosine of L2-normalised descriptors, the top 20 originals/distractors per query; AP over those 20 with
  the Holidays trapezoid rule (``copydays_ap``, vectorised; equal to DINO's ``eval_result``:
  tests/test_copy_detection.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from datamodules.transforms.views import normalize
from tokenmix.precision import inference_autocast

from probes.core.features import FeatureSpec
from probes.instance.global_features import Extraction, extract_descriptors, patch_multiple

TOP_K = 20  # DINO: similarity.topk(20)
GEM_P = 4.0


@dataclass(frozen=True)
class CopyDetectionOptions:
    imsize: int = 320      # DINO --imsize (square; ``make probe``: the task's, probes.core.task_table)
    batch_size: int = 16   # DINO --batch_size_per_gpu (--batch-size)
    top_k: int = TOP_K
    whitening_root: Optional[Path] = None    # None: <DATA_ROOT>/whitening when it exists (DINO --whitening_path)
    distractors_root: Optional[Path] = None  # None: <DATA_ROOT>/distractors when it exists (--distractors_path)
    bf16: bool = False     # --bf16: the backbone in bf16 autocast on CUDA (DINO: fp32)


def copy_descriptor(backbone: nn.Module, images: torch.Tensor, blocks: Optional[Sequence[int]] = None,
                    bf16: bool = False) -> torch.Tensor:
    """(B, 2D): [CLS] and GeM(p=4) of the patch tokens of the last block (DINO ``extract_features``; ``blocks``:
    of that one block instead, ``LAYER=k``). fp32 as DINO; ``bf16``: the backbone under bf16 autocast on CUDA."""
    x = normalize(images)
    kw = {"blocks": list(blocks)} if blocks is not None else {"n_last_blocks": 1}
    with inference_autocast(x.device, bf16):
        out = backbone.extract(patch_multiple(x, backbone), **kw)[-1]
    cls, patch = out["cls"].float(), out["patch"].float()
    gem = patch.clamp(min=1e-6).pow(GEM_P).mean(dim=1).pow(1.0 / GEM_P)
    return torch.cat([cls, gem], dim=1)


@dataclass
class Whitening:
    mean: torch.Tensor  # (D,) of the whitening set
    dvt: torch.Tensor   # (D, D): diag(d ** -0.5) V^T, eigenvalues descending

    @classmethod
    def learn(cls, feats: torch.Tensor) -> "Whitening":
        feats = feats.float()
        cov = (feats.T @ feats / feats.shape[0]).numpy()  # uncentred, as DINO
        d, v = np.linalg.eigh(cov)
        d = np.maximum(d, d.max() * 1e-5)
        order = np.argsort(d)[::-1]
        d, v = d[order], v[:, order]
        return cls(feats.mean(0), torch.from_numpy((v / d ** 0.5).T.astype(np.float32)))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x.float() - self.mean) @ self.dvt.T


def search(database: torch.Tensor, queries: torch.Tensor, k: int = TOP_K) -> torch.Tensor:
    """(n_queries, min(k, n_database)) database indices by descending cosine."""
    sim = F.normalize(queries, dim=1) @ F.normalize(database, dim=1).T
    return sim.topk(min(k, database.shape[0]), dim=1, largest=True, sorted=True).indices


def copydays_ap(indices: torch.Tensor | np.ndarray, positives: Sequence[Sequence[int]]) -> np.ndarray:
    """AP per query over its ranked list (Holidays ``score_ap_from_ranks_1``): trapezoids with recall steps of
    1 / number of positives; positives not in the list add nothing."""
    idx = np.asarray(indices)
    nq, k = idx.shape
    member = np.zeros((nq, max(int(idx.max()) + 1, max((max(p) + 1 for p in positives if p), default=0))), bool)
    for q, pos in enumerate(positives):
        member[q, list(pos)] = True
    hit = member[np.arange(nq)[:, None], idx]               # (nq, k)
    rank = np.arange(k)[None, :]
    ntp = np.cumsum(hit, axis=1) - hit                      # true positives before each rank
    p0 = np.where(rank == 0, 1.0, ntp / np.maximum(rank, 1))
    p1 = (ntp + 1) / (rank + 1)
    nres = np.array([len(p) for p in positives], dtype=np.float64)
    if (nres == 0).any():
        raise ValueError(f"query {int(np.argmin(nres))} has no positive: its AP is undefined")
    return np.where(hit, p0 + p1, 0.0).sum(1) / 2.0 / nres


def score_blocks(database: torch.Tensor, queries: dict[str, torch.Tensor], positives: dict[str, list],
                 whitening: Optional[Whitening], k: int = TOP_K) -> dict[str, float]:
    """mAP (percent) per query block."""
    if whitening is not None:
        database = whitening(database)
    out = {}
    for name, q in queries.items():
        q = whitening(q) if whitening is not None else q
        out[name] = 100.0 * float(copydays_ap(search(database, q, k), positives[name]).mean())
    return out


def run_copy_detection(backbone: nn.Module, blocks: dict[str, Any], cfg: CopyDetectionOptions, how: Extraction,
                       distractors=None, whitening_set=None, layer: Optional[Sequence[int]] = None) -> dict[str, Any]:
    """``blocks``: the Copydays datasets by block name (``original`` first, opened with ``imsize``); optional
    distractor and whitening datasets. Every process extracts its shard; every process gets the metrics."""
    t0 = time.perf_counter()

    def feats(ds):
        return extract_descriptors(backbone, ds, lambda bb, x: copy_descriptor(bb, x, layer, cfg.bf16),
                                   cfg.batch_size, how)

    queries = {name: feats(ds) for name, ds in blocks.items()}
    database = queries["original"]
    if distractors is not None:
        database = torch.cat([database, feats(distractors)])
    white = Whitening.learn(feats(whitening_set)) if whitening_set is not None else None
    maps = score_blocks(database, queries, {n: ds.positives() for n, ds in blocks.items()}, white, cfg.top_k)
    return {"mAP": maps, "num_database": int(database.shape[0]), "num_originals": len(blocks["original"]),
            "num_distractors": 0 if distractors is None else len(distractors),
            "num_whitening": 0 if whitening_set is None else len(whitening_set),
            "num_queries": {n: len(ds) for n, ds in blocks.items()}, "imsize": cfg.imsize,
            "seconds": time.perf_counter() - t0}


def open_copydays(root: Path, cfg: CopyDetectionOptions) -> tuple[dict[str, Any], Any, Any]:
    """(query blocks present, distractors or None, whitening set or None) at ``root``; ``original`` and ``strong``
    are required, a given whitening / distractor folder too, the other blocks are read when present."""
    from datamodules.datasets.copydays import QUERY_BLOCKS, CopydaysDataset
    from datamodules.errors import SplitAbsentError
    blocks = {}
    for name in QUERY_BLOCKS:
        try:
            blocks[name] = CopydaysDataset(root, name, imsize=cfg.imsize)
        except SplitAbsentError:
            if name in ("original", "strong"):
                raise
    extra = {}
    for name, given in (("distractors", cfg.distractors_root), ("whitening", cfg.whitening_root)):
        if given is not None or (Path(root) / name).is_dir():
            extra[name] = CopydaysDataset(root, name, imsize=cfg.imsize, **{f"{name}_root": given})
    return blocks, extra.get("distractors"), extra.get("whitening")


def run_copy_detection_kind(ctx, cfg: CopyDetectionOptions, spec, logger) -> dict[str, Any]:
    """``KINDS[Kind.COPY_DETECTION].runner``: the probe context's backbone, Copydays at DATA_ROOT and options
    (``CopyDetectionOptions``); ``spec.blocks``: ``LAYER=k``."""
    blocks, distractors, whitening = open_copydays(Path(ctx.root), cfg)
    how = Extraction(launch=ctx.launch, progress=ctx.progress)
    return run_copy_detection(ctx.info.model, blocks, cfg, how, distractors, whitening, spec.blocks)


def copy_spec(options: CopyDetectionOptions, depth: int, blocks) -> FeatureSpec:
    """What the descriptor reads (results.json's ``features``): [CLS] and the patch tokens of one block."""
    return FeatureSpec(kind="dense", n_last_blocks=1, blocks=blocks, with_cls=True)


def summary_line(m: dict) -> str:
    """The line ``make probe`` prints: strong first (DINO's reported block), then original."""
    return "mAP " + ", ".join(f"{b} {m['mAP'][b]:.2f}" for b in ("strong", "original") if b in m["mAP"])


def profile(m: dict) -> dict:
    """``LAYER=all``: strong mAP over the blocks."""
    return {"mAP strong": m["mAP"]["strong"]}
