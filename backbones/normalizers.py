"""Attention normalisers: the one line a token-interaction swap replaces, ``attn.softmax(-1)``, mapping logits
(B, heads, T, T) to row-stochastic weights. Sparse ones run in fp32 even under mixed precision (their thresholds
are ill-conditioned in half precision) and cast back to the input dtype.
"""
from __future__ import annotations

from typing import Callable

import torch
import entmax as entmax_lib

from .entmax_fast import BACKENDS, DEFAULT_BACKEND
from .variants import Normalizer as NormalizerName

Normalizer = Callable[[torch.Tensor], torch.Tensor]


def _fp32(fn: Callable[[torch.Tensor], torch.Tensor]) -> Normalizer:
    def wrapped(scores: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=scores.device.type, enabled=False):
            if scores.dtype in (torch.float32, torch.float64):
                return fn(scores)
            return fn(scores.float()).to(scores.dtype)
    return wrapped


def _sparse(name: str, backend: str) -> Normalizer:
    """The project's fast exact op, tagged with ``fused_kind`` so the attention layer can use the fused
    ``sparse_attention`` (no stored N x N probabilities) when it does not need the weights."""
    from backbones import entmax_fast
    op = getattr(entmax_fast, name)
    fn = _fp32(lambda s: op(s, dim=-1, backend=backend))
    fn.fused_kind = name
    return fn


NORMALIZERS = tuple(n.value for n in NormalizerName)


def build_normalizer(name: str, alpha: float = 1.5, n_iter: int = 50,
                     backend: str = DEFAULT_BACKEND) -> Normalizer | None:
    """``None`` means softmax (the layer then uses SDPA); ``backend``: entmax_fast's kernel (auto | cpp | torch)."""
    try:
        name = NormalizerName(name)
    except ValueError:
        raise ValueError(f"unknown attention normaliser '{name}'; valid: {', '.join(NORMALIZERS)}") from None
    if backend not in BACKENDS:
        raise ValueError(f"unknown entmax backend '{backend}'; valid: {', '.join(BACKENDS)}")
    if name is NormalizerName.SOFTMAX:
        return None
    if name in (NormalizerName.ENTMAX15, NormalizerName.SPARSEMAX):
        return _sparse(name.value, backend)
    return _fp32(lambda s: entmax_lib.entmax_bisect(s, alpha=alpha, dim=-1, n_iter=n_iter))
