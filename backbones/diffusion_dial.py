"""The diffusion dial: a known dose of each paper's mechanism added to a fixed backbone, in its last blocks only (no
weight is touched), so that every dense measure can be asked whether it sees that dose. ``a`` in [0, 1]; ``x``:
the residual stream (B, T, D) at the input of each chosen block; [CLS] = token 0, registers = tokens 1 .. P - 1.

- ``semantic`` models the entmax paper's semantic diffusion, "global semantics spread through patch tokens beyond
  what is locally justified" (docs/REFERENCE.md, paper A): every patch row becomes ``x_i + a ‖x_i‖ ĉ``, ĉ the unit
  [CLS] vector of that image at that block. Each patch keeps its own content (at a = 1 it is half its own vector,
  half the global direction at its own norm); [CLS] and registers are left alone.
- ``lazy`` models LaSt-ViT's lazy aggregation, "the model uses background patches as a shortcut for global
  semantics" (paper B): the ``k`` patches with the lowest Patch Score (cos([CLS], x_i) at the block input: the
  patches least like the image's global vector, "background" without labels) become
  ``(1 - a) x_j + a LAZY_NORM m ĉ`` (m: the image's mean patch norm: high-norm copies of the global vector), and
  [CLS]'s attention logits towards them get ``+ a ln N`` (N keys: at a = 1 each planted key's weight is multiplied
  by N before normalising).
- ``tokens``: a deletion, not a diffusion: every patch row becomes ``(1 - a) x_i + a mean_j(x_j)`` (j over the
  patches; [CLS] and registers left alone). At a = 1 all patches are one vector: local content is gone, and every
  measure of local content hits its floor by construction.

Each dial records its manipulation check, the dose actually applied (``Dial.check``): semantic, the mean
cos(x_i, ĉ) of the patch rows before and after; lazy, [CLS]'s attention mass on the planted patches without and with
the bias (mean over the dialed blocks, heads and images); tokens, the mean cos(x_i, mean patch) before and after.

Works on every backbone the probes and analyses load (all built as ``backbones.vit.TokenMixViT``). The dial is a
forward pre-hook on the chosen blocks; ``lazy`` also wraps the attention layer's normaliser (softmax included), so
those blocks take the explicit lines ``attn = normalizer(q kᵀ · scale)``. At ``a = 0`` nothing is hooked or wrapped:
the forward is bitwise the unmodified one (tests/test_diffusion_dial.py).
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from enum import Enum
from typing import Iterator, Optional

import torch
import torch.nn.functional as F

from .attention import TokenMixAttention

__all__ = ["Mode", "Dial", "LAZY_NORM", "LAZY_K", "default_blocks", "dialed_blocks", "diffusion_dial",
           "semantic_rows", "lazy_rows", "mix_tokens"]

LAZY_NORM, LAZY_K = 4.0, 4  # planted norm = 4 x the mean patch norm (high-norm tokens); 4 planted patches


class Mode(str, Enum):
    SEMANTIC = "semantic"
    LAZY = "lazy"
    TOKENS = "tokens"


def default_blocks(depth: int) -> int:
    """The last third of the blocks (at least one): 1 of 2, 2 of 4 (demo), 4 of 12 (ViT-S/B)."""
    return max(1, math.ceil(depth / 3))


def dialed_blocks(depth: int, blocks: Optional[int] = None) -> list[int]:
    """Indices of the last ``blocks`` blocks (default :func:`default_blocks`)."""
    n = default_blocks(depth) if blocks is None else int(blocks)
    if not 1 <= n <= depth:
        raise ValueError(f"the diffusion dial's blocks must be in 1..{depth} (the backbone's depth), got {blocks}")
    return list(range(depth - n, depth))


def _unit_cls(x: torch.Tensor) -> torch.Tensor:
    return F.normalize(x[:, :1], dim=-1)  # (B, 1, D)


def semantic_rows(x: torch.Tensor, a: float, prefix: int) -> torch.Tensor:
    """Patch rows ``x_i + a ‖x_i‖ ĉ``; the ``prefix`` tokens ([CLS], registers) unchanged."""
    p = x[:, prefix:]
    return torch.cat([x[:, :prefix], p + a * p.norm(dim=-1, keepdim=True) * _unit_cls(x)], dim=1)


def lazy_rows(x: torch.Tensor, a: float, prefix: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x with the ``k`` lowest-Patch-Score patches set to ``(1 - a) x_j + a LAZY_NORM m ĉ``, their token indices
    (B, k))."""
    c, p = _unit_cls(x), x[:, prefix:]
    idx = (F.normalize(p, dim=-1) * c).sum(-1).argsort(dim=1)[:, :k] + prefix  # lowest cos([CLS], x_i)
    planted = LAZY_NORM * p.norm(dim=-1).mean(1)[:, None, None] * c  # (B, 1, D)
    out = x.clone()
    rows = out.gather(1, idx[..., None].expand(-1, -1, x.shape[-1]))
    out.scatter_(1, idx[..., None].expand(-1, -1, x.shape[-1]), (1 - a) * rows + a * planted)
    return out, idx


def mix_tokens(x: torch.Tensor, a: float, prefix: int) -> torch.Tensor:
    """Patch rows ``(1 - a) x_i + a mean_j(x_j)`` (j over the patches); the prefix tokens unchanged."""
    p = x[:, prefix:]
    return torch.cat([x[:, :prefix], (1 - a) * p + a * p.mean(1, keepdim=True)], dim=1)


def _mean_cos(p: torch.Tensor, ref: torch.Tensor) -> float:
    return F.cosine_similarity(p, ref.expand_as(p), dim=-1).mean().item()


class Dial:
    """The state of one dial inside the ``with``: the dialed blocks and the manipulation check's running means."""

    def __init__(self, mode: Mode, a: float, blocks: list[int], prefix: int, k: int):
        self.mode, self.a, self.blocks, self.prefix, self.k = mode, a, blocks, prefix, k
        self.planted: Optional[torch.Tensor] = None  # lazy: token indices planted at the current block
        self._sums = {"before": 0.0, "after": 0.0, "n": 0}

    def _note(self, before: float, after: float) -> None:
        self._sums["before"] += before
        self._sums["after"] += after
        self._sums["n"] += 1

    def check(self) -> dict:
        """What was applied (module docstring), as results.json records it."""
        n = max(self._sums["n"], 1)
        what = {Mode.SEMANTIC: "mean cos(patch, [CLS] direction) at the dialed blocks' input",
                Mode.LAZY: "[CLS] attention mass on the planted patches (dialed blocks, heads, images)",
                Mode.TOKENS: "mean cos(patch, mean patch) at the dialed blocks' input"}[self.mode]
        return {"measure": what, "without": self._sums["before"] / n, "with": self._sums["after"] / n,
                "a": self.a, "k": self.k if self.mode is Mode.LAZY else None}

    def pre_hook(self, module, args, kwargs):
        x, p = args[0], self.prefix
        if self.mode is Mode.SEMANTIC:
            y, ref = semantic_rows(x, self.a, p), _unit_cls(x)
        elif self.mode is Mode.LAZY:
            y, self.planted = lazy_rows(x, self.a, p, self.k)
            return (y,) + tuple(args[1:]), kwargs
        else:
            y, ref = mix_tokens(x, self.a, p), x[:, p:].mean(1, keepdim=True)
        self._note(_mean_cos(x[:, p:], ref), _mean_cos(y[:, p:], ref))
        return (y,) + tuple(args[1:]), kwargs

    def biased(self, inner):
        """A normaliser: [CLS]'s logits towards the planted keys + a ln N, the mass on them noted."""
        def normalise(scores: torch.Tensor) -> torch.Tensor:
            norm = (lambda s: s.softmax(dim=-1)) if inner is None else inner
            cols = self.planted[:, None, None, :].expand(-1, scores.shape[1], 1, -1)  # (B, heads, 1, k)
            bias = torch.zeros_like(scores[:, :, :1]).scatter_(-1, cols, self.a * math.log(scores.shape[-1]))
            out = norm(torch.cat([scores[:, :, :1] + bias, scores[:, :, 1:]], dim=2))
            self._note(norm(scores[:, :, :1]).gather(-1, cols).sum(-1).mean().item(),
                       out[:, :, :1].gather(-1, cols).sum(-1).mean().item())
            return out
        return normalise


def _layers(model: torch.nn.Module, n: Optional[int]) -> list[int]:
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        raise ValueError(f"the diffusion dial needs a ViT with .blocks (a backbones.TokenMixViT, as every checkpoint "
                         f"the probes load is built); got {type(model).__name__} (CKPT=pixels has no attention)")
    idx = dialed_blocks(len(blocks), n)
    bad = {type(blocks[i].attn).__name__ for i in idx if not isinstance(blocks[i].attn, TokenMixAttention)}
    if bad:
        raise ValueError(f"the diffusion dial needs TokenMixAttention in blocks {idx}, found {sorted(bad)}. "
                         "Build the backbone with backbones.create_vit / load it through backbones.load.")
    return idx


@contextmanager
def diffusion_dial(model: torch.nn.Module, a: float, blocks: Optional[int] = None, mode: Mode = Mode.SEMANTIC,
                   k: int = LAZY_K) -> Iterator[Dial]:
    """Inside the ``with``, the last ``blocks`` blocks of ``model`` (default :func:`default_blocks`) take dose ``a``
    of ``mode`` (module docstring); yields the :class:`Dial`. ``a = 0``: nothing is changed (bitwise). Everything
    is restored on exit, also after an error."""
    a, mode = float(a), Mode(mode)
    if not (0.0 <= a <= 1.0) or math.isnan(a):
        raise ValueError(f"the diffusion dial's a must be in [0, 1], got {a}")
    idx = _layers(model, blocks)
    prefix = getattr(model, "num_prefix_tokens", 1)
    n_patch = model.patch_embed.num_patches if hasattr(model, "patch_embed") else None
    if mode is Mode.LAZY and not (1 <= k and (n_patch is None or k <= n_patch)):
        raise ValueError(f"the lazy dial's k must be in 1..{n_patch} (the patches), got {k}")
    dial = Dial(mode, a, idx, prefix, k)
    if a == 0.0:
        yield dial
        return
    attns = [model.blocks[i].attn for i in idx]
    saved = [layer.normalizer for layer in attns]
    hooks = []
    try:
        hooks = [model.blocks[i].register_forward_pre_hook(dial.pre_hook, with_kwargs=True) for i in idx]
        if mode is Mode.LAZY:
            for layer in attns:
                layer.normalizer = dial.biased(layer.normalizer)
        yield dial
    finally:
        for h in hooks:
            h.remove()
        for layer, norm in zip(attns, saved):
            layer.normalizer = norm
