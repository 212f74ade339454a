"""CLS/patch specialization (Marouani et al. 2026): [CLS] and patch tokens keep one joint attention but
use separate parameters in the norm layers and the q/k/v projection of the chosen blocks.

A timm ``block_fn``: same parameter names as timm's ``Block`` plus ``norm1_cls``, ``norm2_cls`` and
``attn.qkv_cls`` where specialised, so a plain ViT state dict still loads into the shared parameters.
Token 0 is [CLS]; registers (if any) use the patch parameters.
"""
from __future__ import annotations

import copy
from typing import Sequence

import torch
from timm.models.vision_transformer import Block

COMPONENTS = ("norm1", "qkv", "norm2")


def _split(x: torch.Tensor, f_cls, f_patch) -> torch.Tensor:
    return torch.cat([f_cls(x[:, :1]), f_patch(x[:, 1:])], dim=1)


class SpecializedBlock(Block):
    def __init__(self, *args, spec_blocks: Sequence[int] = (0, 1, 2, 3), components: Sequence[str] = COMPONENTS,
                 depth: int = 0, **kwargs) -> None:
        super().__init__(*args, depth=depth, **kwargs)
        bad = set(components) - set(COMPONENTS)
        if bad:
            raise ValueError(f"unknown specialization components {sorted(bad)}; valid: {COMPONENTS}")
        self.specialized = tuple(components) if depth in set(spec_blocks) else ()
        # separate parameters, initialised by the same scheme as the shared ones (timm's init_weights
        # later re-draws the q/k/v copy independently)
        self.norm1_cls = copy.deepcopy(self.norm1) if "norm1" in self.specialized else None
        self.norm2_cls = copy.deepcopy(self.norm2) if "norm2" in self.specialized else None
        if "qkv" in self.specialized:
            self.attn.qkv_cls = copy.deepcopy(self.attn.qkv)

    def forward(self, x: torch.Tensor, attn_mask=None, is_causal: bool = False) -> torch.Tensor:
        n1 = self.norm1(x) if self.norm1_cls is None else _split(x, self.norm1_cls, self.norm1)
        x = x + self.drop_path1(self.ls1(self.attn(n1, attn_mask=attn_mask, is_causal=is_causal)))
        n2 = self.norm2(x) if self.norm2_cls is None else _split(x, self.norm2_cls, self.norm2)
        x = x + self.drop_path2(self.ls2(self.mlp(n2)))
        return x
