"""A DINOv2 model as facebookresearch/dinov2 builds it (``official/dinov2.py``, transcribed at b8931f7bf915:
``DinoVisionTransformer`` with the hub's per-model settings), at a cheap shape with trained-scale random weights:
the source that the foreign-checkpoint and diffusion-dial tests write files from and compare against."""
from __future__ import annotations

import torch

from official.dinov2 import DinoVisionTransformer, hub_settings

SHAPE = dict(embed_dim=128, num_heads=2, depth=2)  # width 128, 2 heads of 64, 2 blocks; patch 14, a 37 x 37 table


def dinov2_source(name: str, block_chunks: int = 0, seed: int = 0) -> DinoVisionTransformer:
    """DINOv2's ``name`` (hub settings) at ``SHAPE``, random weights at a trained scale."""
    torch.manual_seed(seed)
    m = DinoVisionTransformer(**{**hub_settings(name), **SHAPE, "block_chunks": block_chunks}).eval()
    with torch.no_grad():
        for p in m.parameters():  # the transcription has no init: every tensor (LayerScale, norms, biases) drawn
            p.add_(torch.randn_like(p) * 0.02)
        m.pos_embed.mul_(25)
        m.cls_token.normal_()
        if m.register_tokens is not None:
            m.register_tokens.normal_()
    return m
