"""Attention normalisers: the one line a token-interaction swap replaces, ``attn.softmax(-1)``.

Each normaliser maps attention logits ``(B, heads, T, T)`` to row-stochastic weights over the key axis.
Sparse ones are computed in fp32 even under mixed precision (their thresholds are ill-conditioned in
half precision) and the result is cast back to the input dtype.
"""
from __future__ import annotations

from typing import Callable

import torch
import entmax as entmax_lib

Normalizer = Callable[[torch.Tensor], torch.Tensor]


def _fp32(fn: Callable[[torch.Tensor], torch.Tensor]) -> Normalizer:
    def wrapped(scores: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=scores.device.type, enabled=False):
            if scores.dtype in (torch.float32, torch.float64):
                return fn(scores)
            return fn(scores.float()).to(scores.dtype)
    return wrapped


def _fast_or_reference(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """Project's fast exact op (backbones/entmax_fast.py) when present, else the sort-based reference."""
    reference = {"entmax15": entmax_lib.entmax15, "sparsemax": entmax_lib.sparsemax}[name]
    try:
        from backbones import entmax_fast
        fast = getattr(entmax_fast, name)
    except (ImportError, AttributeError):
        fast = None
    return (lambda s: fast(s, dim=-1)) if fast is not None else (lambda s: reference(s, dim=-1))


def build_normalizer(name: str, alpha: float = 1.5, n_iter: int = 50) -> Normalizer | None:
    """``None`` means softmax: the attention layer then uses the fused SDPA kernel."""
    if name == "softmax":
        return None
    if name == "entmax15":
        return _fp32(_fast_or_reference("entmax15"))
    if name == "sparsemax":
        return _fp32(_fast_or_reference("sparsemax"))
    if name == "entmax_bisect":
        return _fp32(lambda s: entmax_lib.entmax_bisect(s, alpha=alpha, dim=-1, n_iter=n_iter))
    raise ValueError(f"unknown attention normaliser '{name}'; valid: {', '.join(NORMALIZERS)}")


NORMALIZERS = ("softmax", "entmax15", "sparsemax", "entmax_bisect")
