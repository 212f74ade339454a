"""The diffusion dial: a positive control for every dense measure. It adds indiscriminate token mixing to a fixed
backbone, in its last blocks only, and changes nothing else (no weight, token or other block is touched). Two
modes (``Mode``), both ``a`` in [0, 1]:

- ``attention``: in each chosen block every attention row P (over the N keys: [CLS], registers, patches) is mixed
  with the uniform row, ``P' = (1 - a) * P + a / N``, so a token's attention output becomes
  ``(1 - a) * (P v) + a * mean(v)``: a share ``a`` of every token's update is the image-wide average of the values,
  whatever the token's content or position;
- ``tokens``: the residual stream itself is mixed at the input of each chosen block,
  ``x_i' = (1 - a) * x_i + a * mean_j(x_j)`` (j over every token): a share ``a`` of each token *is* the image-wide
  average. This one acts whatever the attention already does: on a barely trained backbone, whose attention rows
  are near-uniform already, ``attention`` has nothing left to flatten (a tiny test run: entropy 4.171 of log N =
  4.174 nats; the demo checkpoint after 50 steps: 5.5473 of 5.5491, docs/calibration.md), while ``tokens`` still
  dilutes every patch. ``make analyze TASK=calibration`` uses ``tokens`` unless told otherwise.

Why this models semantic diffusion (the entmax paper: global semantics spread through the patch tokens beyond what
is locally justified): ``mean(v)`` is a global, image-level summary, and the dial pours it into every patch token in
proportion ``a``, regardless of whether the patch's own content supports it. Patch tokens drift towards one shared
vector (cos(patch, [CLS]) up, effective rank down), local evidence is diluted (dense probes down, Point-in-Box
towards chance), and the attention rows lose their structure (entropy up to log N at a = 1; no exact zeros left,
also for entmax-1.5). It acts in the last blocks because that is where the papers see the degradation and what the
dense probes read; rows are row-stochastic for any ``a``, so it is a valid attention for every normaliser. The
``tokens`` mode is the same dilution one step further: in the features themselves rather than in their update.

Works on every backbone the probes and analyses load (``backbones.load.resolve_backbone``: this project's
checkpoints, official DINO, DINOv2 with or without registers, timm / DeiT / MAE files, LaSt-ViT): all are built as
``backbones.vit.TokenMixViT``, whose blocks' ``attn`` is a ``TokenMixAttention``. The dial wraps the attention
layer's normaliser (``backbones.normalizers``; softmax included), so the layer takes its explicit lines
``attn = normalizer(q kᵀ · scale); x = attn @ v`` (``backbones/attention.py``): the fused SDPA / entmax kernels are
left for those blocks while the dial is on, and ``model.attention_maps`` records the mixed rows. The ``tokens`` mode
is a forward pre-hook on the chosen blocks (a watched block runs timm's full path: every token, every sample).

At ``a = 0`` nothing is wrapped: the forward is bitwise the unmodified one (tests/test_diffusion_dial.py).

    >>> import torch
    >>> from backbones import create_vit
    >>> m = create_vit("vit_test_patch8", "entmax", seed=0).eval()
    >>> with diffusion_dial(m, 1.0, blocks=1):
    ...     p = m.attention_maps(torch.randn(1, 3, 32, 32))[-1]
    >>> bool(torch.allclose(p, torch.full_like(p, 1 / p.shape[-1])))
    True
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from enum import Enum
from typing import Callable, Iterator, Optional

import torch

from .attention import TokenMixAttention

__all__ = ["Mode", "Rows", "default_blocks", "dialed_blocks", "diffusion_dial", "mix_tokens", "mix_uniform"]


class Mode(str, Enum):
    """Where the dial mixes (module docstring)."""
    ATTENTION = "attention"  # each attention row with the uniform row
    TOKENS = "tokens"        # each block input token with the mean token


class Rows(str, Enum):
    """Which query rows the dial mixes."""
    ALL = "all"      # every token's row ([CLS], registers, patches): the formula as stated
    PATCH = "patch"  # the patch tokens' rows only: [CLS] and registers keep their own attention


def default_blocks(depth: int) -> int:
    """The last third of the blocks (at least one): 1 of 2, 2 of 4 (demo), 4 of 12 (ViT-S/B)."""
    return max(1, math.ceil(depth / 3))


def dialed_blocks(depth: int, blocks: Optional[int] = None) -> list[int]:
    """Indices of the last ``blocks`` blocks (default :func:`default_blocks`)."""
    n = default_blocks(depth) if blocks is None else int(blocks)
    if not 1 <= n <= depth:
        raise ValueError(f"the diffusion dial's blocks must be in 1..{depth} (the backbone's depth), got {blocks}")
    return list(range(depth - n, depth))


def mix_uniform(p: torch.Tensor, a: float, first_row: int = 0) -> torch.Tensor:
    """``(1 - a) * p + a / N`` on the query rows from ``first_row`` on of (..., rows, N) attention weights."""
    n = p.shape[-1]
    mixed = (1.0 - a) * p + a / n
    if first_row <= 0:
        return mixed
    return torch.cat([p[..., :first_row, :], mixed[..., first_row:, :]], dim=-2)


def mix_tokens(x: torch.Tensor, a: float, first_token: int = 0) -> torch.Tensor:
    """``(1 - a) * x_i + a * mean_j(x_j)`` for the tokens from ``first_token`` on of (B, T, D) ``x`` (the mean over
    every token)."""
    mixed = (1.0 - a) * x + a * x.mean(dim=1, keepdim=True)
    if first_token <= 0:
        return mixed
    return torch.cat([x[:, :first_token], mixed[:, first_token:]], dim=1)


class _Mixed:
    """A normaliser (logits -> weights) that mixes the wrapped one's rows with the uniform row. No ``fused_kind``:
    the attention layer then runs its explicit lines, which call it."""

    def __init__(self, inner: Optional[Callable[[torch.Tensor], torch.Tensor]], a: float, first_row: int):
        self.inner, self.a, self.first_row = inner, float(a), first_row

    def __call__(self, scores: torch.Tensor) -> torch.Tensor:
        p = scores.softmax(dim=-1) if self.inner is None else self.inner(scores)  # None: softmax (SDPA's maths)
        return mix_uniform(p, self.a, self.first_row)


def _attention_layers(model: torch.nn.Module, n: Optional[int]) -> tuple[list[int], list[TokenMixAttention]]:
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        raise ValueError(f"the diffusion dial needs a ViT with .blocks (a backbones.TokenMixViT, as every checkpoint "
                         f"the probes load is built); got {type(model).__name__} (CKPT=pixels has no attention)")
    idx = dialed_blocks(len(blocks), n)
    layers = [blocks[i].attn for i in idx]
    bad = {type(a).__name__ for a in layers if not isinstance(a, TokenMixAttention)}
    if bad:
        raise ValueError(f"the diffusion dial wraps TokenMixAttention's normaliser; blocks {idx} hold {sorted(bad)}. "
                         "Build the backbone with backbones.create_vit / load it through backbones.load.")
    return idx, layers


@contextmanager
def diffusion_dial(model: torch.nn.Module, a: float, blocks: Optional[int] = None, rows: Rows = Rows.ALL,
                   mode: Mode = Mode.ATTENTION) -> Iterator[list[int]]:
    """Inside the ``with``, the last ``blocks`` blocks of ``model`` (default :func:`default_blocks`) mix by ``mode``
    (``attention``: ``P' = (1 - a) P + a / N``; ``tokens``: ``x' = (1 - a) x + a mean(x)`` at each block's input) on
    the query / token ``rows``; yields the dialed block indices. ``a = 0``: nothing is changed (the unmodified
    forward, bitwise). Everything is restored on exit, also after an error."""
    a = float(a)
    if not (0.0 <= a <= 1.0) or math.isnan(a):
        raise ValueError(f"the diffusion dial's a must be in [0, 1], got {a}")
    rows, mode = Rows(rows), Mode(mode)
    idx, layers = _attention_layers(model, blocks)
    if a == 0.0:
        yield idx
        return
    first = getattr(model, "num_prefix_tokens", 1) if rows is Rows.PATCH else 0
    saved = [layer.normalizer for layer in layers]
    hooks = []
    try:
        if mode is Mode.ATTENTION:
            for layer in layers:
                layer.normalizer = _Mixed(layer.normalizer, a, first)
        else:
            hooks = [model.blocks[i].register_forward_pre_hook(
                lambda m, args, kwargs: ((mix_tokens(args[0], a, first),) + tuple(args[1:]), kwargs), with_kwargs=True)
                for i in idx]
        yield idx
    finally:
        for h in hooks:
            h.remove()
        for layer, norm in zip(layers, saved):
            layer.normalizer = norm
