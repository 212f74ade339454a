"""Reference "backbones" for the probe comparison: raw pixels (``--ckpt pixels``); a random-init ViT
(``--ckpt random``) is just ``backbones.create_vit`` without weights."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F


class PixelBackbone(nn.Module):
    """Raw pixels with the backbone's extract() API: each patch token is its normalised patch pixels
    flattened (3*p*p values); [CLS] is a p x p thumbnail of the whole image (area-averaged, 3*p*p values,
    the usual raw-pixel k-NN baseline). One "block"; any block index gives it."""

    def __init__(self, patch_size: int = 16):
        super().__init__()
        self.patch_size = int(patch_size)
        self.embed_dim = 3 * self.patch_size ** 2
        self.depth = 1
        self.num_prefix_tokens = 1
        self.arch, self.variant = f"pixels_patch{self.patch_size}", "pixels"
        self.config = {"arch": self.arch, "variant": "pixels"}

    def grid_size(self, images: torch.Tensor) -> tuple[int, int]:
        return images.shape[-2] // self.patch_size, images.shape[-1] // self.patch_size

    def extract(self, images: torch.Tensor, n_last_blocks: int = 1, blocks: Optional[Sequence[int]] = None,
                votes: bool = False) -> list[dict[str, torch.Tensor]]:
        p = self.patch_size
        patches = F.unfold(images, kernel_size=p, stride=p).transpose(1, 2)  # (B, N, 3*p*p), row-major
        thumb = F.adaptive_avg_pool2d(images, (p, p)).flatten(1)
        out = {"cls": thumb, "patch": patches}
        n = len(blocks) if blocks is not None else n_last_blocks
        return [out] * n

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.extract(images)[0]["cls"]
