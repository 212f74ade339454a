"""Statistics of attention maps: exact-zero share, support size, entropy, and [CLS]->patch maps, from what
``model.attention_maps(images)`` returns per block: (B, H, T, T), rows = queries, T = num_prefix + N. Softmax never
yields exact zeros (except underflow); entmax-1.5 / sparsemax do, which is the point of measuring them.
"""
from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["attention_stats", "attention_stats_per_layer", "cls_attention_maps"]


def _check_attn(attn: torch.Tensor) -> None:
    if attn.ndim != 4 or attn.shape[-1] != attn.shape[-2]:
        raise ValueError(f"expected attention probabilities of shape (B, H, T, T), got {tuple(attn.shape)}")


def attention_stats(attn: torch.Tensor, queries: str = "all", num_prefix: int = 1) -> dict[str, torch.Tensor]:
    """Per-head statistics of one block's attention, averaged over images and query rows ("all", "cls": row 0,
    "patch": rows from ``num_prefix``): (H,) tensors ``zero_share`` (exact zeros), ``support_size`` (non-zero
    keys per row), ``entropy`` (nats, 0 log 0 = 0)."""
    _check_attn(attn)
    a = attn.detach().to(torch.float64)
    if queries == "cls":
        a = a[:, :, :1]
    elif queries == "patch":
        a = a[:, :, num_prefix:]
    elif queries != "all":
        raise ValueError(f"queries must be 'all', 'cls' or 'patch', got {queries!r}")
    nz = a != 0
    zero_share = 1.0 - nz.to(torch.float64).mean(dim=(0, 2, 3))
    support = nz.to(torch.float64).sum(-1).mean(dim=(0, 2))
    # xlogy gives 0 for p = 0, so exact zeros of sparse attention contribute nothing
    ent = -torch.special.xlogy(a, a).sum(-1).mean(dim=(0, 2))
    return {"zero_share": zero_share.float(), "support_size": support.float(), "entropy": ent.float()}


def attention_stats_per_layer(attns: Sequence[torch.Tensor], **kw) -> dict[str, torch.Tensor]:
    """Stack :func:`attention_stats` over blocks -> dict of (L, H) tensors (oldest block first)."""
    per = [attention_stats(a, **kw) for a in attns]
    return {k: torch.stack([p[k] for p in per]) for k in per[0]}


def cls_attention_maps(attn: torch.Tensor, num_prefix: int, grid: tuple[int, int]) -> torch.Tensor:
    """[CLS]-query attention to the patch tokens as (B, H, h, w) maps (DINO's ``visualize_attention``); the
    prefix tokens are dropped, so a map need not sum to 1."""
    _check_attn(attn)
    B, H, T, _ = attn.shape
    h, w = int(grid[0]), int(grid[1])
    if T - num_prefix != h * w:
        raise ValueError(f"attention has T={T} tokens; with num_prefix={num_prefix} that leaves {T - num_prefix} "
                         f"patches, but grid {h}x{w} needs {h * w}")
    return attn[:, :, 0, num_prefix:].reshape(B, H, h, w)
