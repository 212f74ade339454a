"""The tokenmix transformer block: timm's ``Block`` (same parameters, same maths) with two ways to do less work:
``forward_queries(x, n)``, only the first ``n`` tokens as queries (a ViT whose output is [CLS] runs its last block
so: about 6 % of a ViT-S/16 forward and backward at 224 px); and drop-path on a CPU in training, the residual
branch run on the kept samples only (the mask drawn as timm's ``DropPath``: same RNG stream; not on a GPU, a host
sync, nor under ``torch.compile`` or with a per-sample ``attn_mask``). Neither applies when someone watches the
block (``observed``). Results agree with ``Block.forward`` to rounding (``tests/test_backbone.py``).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from timm.layers import DropPath
from timm.models.vision_transformer import Block


class TokenMixBlock(Block):
    def _norm1(self, x: torch.Tensor) -> torch.Tensor:  # SpecializedBlock: [CLS] and patches apart
        return self.norm1(x)

    def _norm2(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm2(x)

    def _attn(self, x: torch.Tensor, attn_mask=None, is_causal: bool = False) -> torch.Tensor:
        return self.ls1(self.attn(self._norm1(x), attn_mask=attn_mask, is_causal=is_causal))

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.ls2(self.mlp(self._norm2(x)))

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
                is_causal: bool = False) -> torch.Tensor:
        # per-sample masks (not subset with the batch) or a user watching this block: every sample, timm's way
        full = _per_sample(attn_mask) or self.observed()
        x = _residual(x, x, lambda t: self._attn(t, attn_mask, is_causal), self.drop_path1, full)
        return _residual(x, x, self._mlp, self.drop_path2, full)

    def observed(self) -> bool:
        """True when someone watches this block or its attention (module hooks, global ones included, or
        ``attn.record``): they must see every sample and token, so neither shortcut applies."""
        return getattr(self.attn, "record", False) or any(_hooked(m) for m in (self, self.attn))

    def forward_queries(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """``self(x)[:, :n]`` with only the first ``n`` tokens as queries (no mask: a ViT's last block)."""
        y = _residual(x[:, :n], x, lambda t: self.ls1(self.attn.forward_queries(self._norm1(t), n)), self.drop_path1)
        return _residual(y, y, self._mlp, self.drop_path2)


def _hooked(m: torch.nn.Module) -> bool:
    from torch.nn.modules import module as M
    return bool(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
                or M._global_forward_hooks or M._global_forward_pre_hooks or M._global_backward_hooks
                or M._global_backward_pre_hooks)


def _per_sample(attn_mask: Optional[torch.Tensor]) -> bool:
    """A mask with one entry per sample ((B, ...) with B > 1), which a subset of the batch would not match."""
    return attn_mask is not None and attn_mask.ndim > 2 and attn_mask.shape[0] > 1


def _residual(base: torch.Tensor, x: torch.Tensor, branch: Callable[[torch.Tensor], torch.Tensor], drop_path,
              full: bool = False):
    """``base + drop_path(branch(x))``; on a CPU in training the branch runs on kept samples only, unless ``full``."""
    p = drop_path.drop_prob if isinstance(drop_path, DropPath) and drop_path.training else 0.0
    if full or not (p > 0 and x.device.type == "cpu") or torch.compiler.is_compiling():
        return base + drop_path(branch(x))
    keep = 1 - p
    mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)  # timm's draw, same RNG use
    if keep > 0 and drop_path.scale_by_keep:
        mask.div_(keep)
    kept = mask.view(-1).nonzero().view(-1)
    if kept.numel() in (0, x.shape[0]):  # none kept: the branch still runs, so every parameter gets a gradient
        return base + branch(x) * mask
    return base.index_add(0, kept, branch(x.index_select(0, kept)) * mask.index_select(0, kept))
