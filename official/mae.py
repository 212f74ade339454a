"""facebookresearch/mae (efb2a8062c206524e35e47d04501ed4f544c0ae8) ``models_vit.py``, transcribed: the model that
MAE's fine-tuning and linear probing (``main_finetune.py``, ``main_linprobe.py``) load its checkpoints into, the
reference that foreign-checkpoint tests compare MAE files with.

``VisionTransformer`` (``__init__``, ``forward_features``: [CLS] after the final ``norm``, or with
``global_pool`` the mean of the patch tokens through ``fc_norm``, the final ``norm`` deleted) and the shapes of
``vit_base_patch16``, ``vit_large_patch16``, ``vit_huge_patch14`` (``MAE_MODELS``). Its base class is timm 0.3.2's
``VisionTransformer`` (MAE's README: "based on timm==0.3.2"), transcribed in ``official/deit.py`` and imported from
there. The fine-tuning resampling of the position table, ``util/pos_embed.py`` ``interpolate_pos_embed``, is the
same code as DeiT's (``official.deit.interpolate_pos_embed``).

Project addition, not in MAE: ``tokens`` (``global_pool=False`` only), ``forward_features`` before its
``[:, 0]``. Nothing here imports the project.
"""
from __future__ import annotations

from functools import partial

import torch
import torch.nn as nn

from official import deit


class VisionTransformer(deit.VisionTransformer):
    """ Vision Transformer with support for global average pooling
    """
    def __init__(self, global_pool=False, **kwargs):
        super(VisionTransformer, self).__init__(**kwargs)

        self.global_pool = global_pool
        if self.global_pool:
            norm_layer = kwargs['norm_layer']
            embed_dim = kwargs['embed_dim']
            self.fc_norm = norm_layer(embed_dim)

            del self.norm  # remove the original norm

    def forward_features(self, x):
        B = x.shape[0]
        x = self.patch_embed(x)

        cls_tokens = self.cls_token.expand(B, -1, -1)  # stole cls_tokens impl from Phil Wang, thanks
        x = torch.cat((cls_tokens, x), dim=1)
        x = x + self.pos_embed

        for blk in self.blocks:
            x = blk(x)

        if self.global_pool:
            x = x[:, 1:, :].mean(dim=1)  # global pool without cls token
            outcome = self.fc_norm(x)
        else:
            x = self.norm(x)
            outcome = x[:, 0]

        return outcome


_SHAPE = dict(mlp_ratio=4, qkv_bias=True, norm_layer=partial(nn.LayerNorm, eps=1e-6))
MAE_MODELS = {  # models_vit.vit_*: their VisionTransformer arguments
    "vit_base_patch16": dict(patch_size=16, embed_dim=768, depth=12, num_heads=12, **_SHAPE),
    "vit_large_patch16": dict(patch_size=16, embed_dim=1024, depth=24, num_heads=16, **_SHAPE),
    "vit_huge_patch14": dict(patch_size=14, embed_dim=1280, depth=32, num_heads=16, **_SHAPE),
}


def mae_model(name: str, **kwargs) -> VisionTransformer:
    """``models_vit.__dict__[name](**kwargs)`` (``global_pool``, ``num_classes``, ...; a test's ``depth``)."""
    return VisionTransformer(**{**MAE_MODELS[name], **kwargs})
