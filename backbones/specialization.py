"""CLS/patch specialization (Marouani et al. 2026): [CLS] and patch tokens keep one joint attention but use
separate norm and q/k/v parameters in the chosen blocks (``specialization_sets``: norms and q/k/v may differ).

Parameter names are timm's ``Block``'s plus ``norm1_cls``, ``norm2_cls`` and ``attn.qkv_cls``, so a plain ViT
state dict still loads into the shared ones. Token 0 is [CLS]; registers use the patch parameters.
"""
from __future__ import annotations

import copy
from typing import Mapping, Optional, Sequence

import torch
from .block import TokenMixBlock

COMPONENTS = ("norm1", "qkv", "norm2")


def specialization_sets(spec_blocks: Sequence[int] = (0, 1, 2, 3), components: Sequence[str] = COMPONENTS,
                        norm_blocks: Optional[Sequence[int]] = None,
                        qkv_blocks: Optional[Sequence[int]] = None) -> dict[str, tuple[int, ...]]:
    """Component -> the blocks where it is specialised: ``spec_blocks`` for every chosen component, unless
    ``norm_blocks`` (norm1 and norm2) or ``qkv_blocks`` (attn.qkv) give that component its own set.

    >>> specialization_sets([0, 1], qkv_blocks=[0])
    {'norm1': (0, 1), 'qkv': (0,), 'norm2': (0, 1)}
    """
    bad = set(components) - set(COMPONENTS)
    if bad:
        raise ValueError(f"unknown specialization components {sorted(bad)}; valid: {COMPONENTS}")
    own = {"norm1": norm_blocks, "norm2": norm_blocks, "qkv": qkv_blocks}
    return {c: tuple(sorted({int(b) for b in (spec_blocks if own[c] is None else own[c])}))
            for c in COMPONENTS if c in components}


def _split(x: torch.Tensor, f_cls, f_patch) -> torch.Tensor:
    return torch.cat([f_cls(x[:, :1]), f_patch(x[:, 1:])], dim=1)


class SpecializedBlock(TokenMixBlock):
    def __init__(self, *args, spec_blocks: Sequence[int] = (0, 1, 2, 3), components: Sequence[str] = COMPONENTS,
                 spec_sets: Optional[Mapping[str, Sequence[int]]] = None, depth: int = 0, **kwargs) -> None:
        super().__init__(*args, depth=depth, **kwargs)
        sets = specialization_sets(spec_blocks, components) if spec_sets is None else spec_sets
        self.specialized = tuple(c for c in COMPONENTS if depth in set(sets.get(c, ())))
        # separate parameters, initialised by the same scheme as the shared ones (timm's init_weights
        # later re-draws the q/k/v copy independently)
        self.norm1_cls = copy.deepcopy(self.norm1) if "norm1" in self.specialized else None
        self.norm2_cls = copy.deepcopy(self.norm2) if "norm2" in self.specialized else None
        if "qkv" in self.specialized:
            self.attn.qkv_cls = copy.deepcopy(self.attn.qkv)

    def _norm1(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm1(x) if self.norm1_cls is None else _split(x, self.norm1_cls, self.norm1)

    def _norm2(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm2(x) if self.norm2_cls is None else _split(x, self.norm2_cls, self.norm2)
