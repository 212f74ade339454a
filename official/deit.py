"""facebookresearch/deit (7e160fe43f0252d17191b71cbb5826254114ea5b), transcribed with the timm it runs on: the
reference that foreign-checkpoint tests compare DeiT release files with.

DeiT's ``models.py`` builds ``deit_*_patch16_224`` as timm's ``VisionTransformer`` and the distilled ones as its
``DistilledVisionTransformer``; its ``requirements.txt`` pins ``timm==0.3.2``, whose classes today's timm no longer
has. So, from timm 0.3.2 (the PyPI wheel ``timm-0.3.2-py3-none-any.whl``, sha256 c1598ef6…8387875, file
``timm/models/vision_transformer.py``): ``Mlp``, ``Attention``, ``Block``, ``PatchEmbed``, ``VisionTransformer``
(``__init__`` without the weight init and the hybrid backbone, ``forward_features``, ``forward``); from DeiT's
``models.py``: ``DistilledVisionTransformer`` (``__init__`` without the init, ``forward_features``, ``forward``) and
the model shapes of ``deit_{tiny,small,base}[_distilled]_patch16_224`` (``DEIT_MODELS``). MAE's ``models_vit.py``
subclasses the same timm 0.3.2 class (``official/mae.py`` imports it from here).

Deviations that change no number: no weight init (tests draw their own weights), no dropout / drop-path modules
(identities in eval mode). Project addition, not in either repository: ``VisionTransformer.tokens``, the body of
``forward_features`` before its ``x[:, 0]``, i.e. every normalised token, from which the patch tokens that dense
probes read are taken. Nothing here imports the project.
"""
from __future__ import annotations

from functools import partial

import torch
import torch.nn as nn


# ------------------------------------------------------------------ timm 0.3.2 timm/models/vision_transformer.py
class Mlp(nn.Module):
    def __init__(self, in_features, hidden_features=None, out_features=None, act_layer=nn.GELU, drop=0.):
        super().__init__()
        out_features = out_features or in_features
        hidden_features = hidden_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_features, out_features)

    def forward(self, x):
        x = self.fc1(x)
        x = self.act(x)
        x = self.fc2(x)
        return x


class Attention(nn.Module):
    def __init__(self, dim, num_heads=8, qkv_bias=False, qk_scale=None):
        super().__init__()
        self.num_heads = num_heads
        head_dim = dim // num_heads
        # NOTE scale factor was wrong in my original version, can set manually to be compat with prev weights
        self.scale = qk_scale or head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]   # make torchscript happy (cannot use tensor as tuple)
        attn = (q @ k.transpose(-2, -1)) * self.scale
        attn = attn.softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        x = self.proj(x)
        return x


class Block(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio=4., qkv_bias=False, qk_scale=None, act_layer=nn.GELU,
                 norm_layer=nn.LayerNorm):
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = Attention(dim, num_heads=num_heads, qkv_bias=qkv_bias, qk_scale=qk_scale)
        self.norm2 = norm_layer(dim)
        mlp_hidden_dim = int(dim * mlp_ratio)
        self.mlp = Mlp(in_features=dim, hidden_features=mlp_hidden_dim, act_layer=act_layer)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        x = x + self.mlp(self.norm2(x))
        return x


class PatchEmbed(nn.Module):
    """ Image to Patch Embedding
    """
    def __init__(self, img_size=224, patch_size=16, in_chans=3, embed_dim=768):
        super().__init__()
        img_size = (img_size, img_size)
        patch_size = (patch_size, patch_size)
        num_patches = (img_size[1] // patch_size[1]) * (img_size[0] // patch_size[0])
        self.img_size = img_size
        self.patch_size = patch_size
        self.num_patches = num_patches
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x):
        B, C, H, W = x.shape
        # FIXME look at relaxing size constraints
        assert H == self.img_size[0] and W == self.img_size[1], \
            f"Input image size ({H}*{W}) doesn't match model ({self.img_size[0]}*{self.img_size[1]})."
        x = self.proj(x).flatten(2).transpose(1, 2)
        return x


class VisionTransformer(nn.Module):
    """ Vision Transformer with support for patch or hybrid CNN input stage
    """
    def __init__(self, img_size=224, patch_size=16, in_chans=3, num_classes=1000, embed_dim=768, depth=12,
                 num_heads=12, mlp_ratio=4., qkv_bias=False, qk_scale=None, norm_layer=nn.LayerNorm):
        super().__init__()
        self.num_classes = num_classes
        self.num_features = self.embed_dim = embed_dim  # num_features for consistency with other models
        self.patch_embed = PatchEmbed(img_size=img_size, patch_size=patch_size, in_chans=in_chans,
                                      embed_dim=embed_dim)
        num_patches = self.patch_embed.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, embed_dim))
        self.blocks = nn.ModuleList([
            Block(dim=embed_dim, num_heads=num_heads, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, qk_scale=qk_scale,
                  norm_layer=norm_layer)
            for i in range(depth)])
        self.norm = norm_layer(embed_dim)
        # Classifier head
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()

    def forward_features(self, x):
        return self.tokens(x)[:, 0]

    def tokens(self, x):
        """Not in timm 0.3.2: its ``forward_features`` up to the final ``norm``, every token kept."""
        B = x.shape[0]
        x = self.patch_embed(x)
        cls_tokens = self.cls_token.expand(B, -1, -1)  # stole cls_tokens impl from Phil Wang, thanks
        x = torch.cat((cls_tokens, x), dim=1)
        x = x + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        x = self.norm(x)
        return x

    def forward(self, x):
        x = self.forward_features(x)
        x = self.head(x)
        return x


# ------------------------------------------------------------------------------------------ deit models.py
class DistilledVisionTransformer(VisionTransformer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.dist_token = nn.Parameter(torch.zeros(1, 1, self.embed_dim))
        num_patches = self.patch_embed.num_patches
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + 2, self.embed_dim))
        self.head_dist = nn.Linear(self.embed_dim, self.num_classes) if self.num_classes > 0 else nn.Identity()

    def forward_features(self, x):
        # taken from https://github.com/rwightman/pytorch-image-models/blob/master/timm/models/vision_transformer.py
        # with slight modifications to add the dist_token
        B = x.shape[0]
        x = self.patch_embed(x)
        cls_tokens = self.cls_token.expand(B, -1, -1)  # stole cls_tokens impl from Phil Wang, thanks
        dist_token = self.dist_token.expand(B, -1, -1)
        x = torch.cat((cls_tokens, dist_token, x), dim=1)
        x = x + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        x = self.norm(x)
        return x[:, 0], x[:, 1]

    def forward(self, x):
        x, x_dist = self.forward_features(x)
        x = self.head(x)
        x_dist = self.head_dist(x_dist)
        return (x + x_dist) / 2  # eval mode: the average of both classifier predictions


# deit_{tiny,small,base}[_distilled]_patch16_224: the class and arguments each builds
_SHAPE = dict(patch_size=16, mlp_ratio=4, qkv_bias=True, norm_layer=partial(nn.LayerNorm, eps=1e-6))
DEIT_MODELS = {
    "deit_tiny_patch16_224": (VisionTransformer, dict(embed_dim=192, depth=12, num_heads=3, **_SHAPE)),
    "deit_small_patch16_224": (VisionTransformer, dict(embed_dim=384, depth=12, num_heads=6, **_SHAPE)),
    "deit_base_patch16_224": (VisionTransformer, dict(embed_dim=768, depth=12, num_heads=12, **_SHAPE)),
    "deit_tiny_distilled_patch16_224": (DistilledVisionTransformer,
                                        dict(embed_dim=192, depth=12, num_heads=3, **_SHAPE)),
    "deit_small_distilled_patch16_224": (DistilledVisionTransformer,
                                         dict(embed_dim=384, depth=12, num_heads=6, **_SHAPE)),
    "deit_base_distilled_patch16_224": (DistilledVisionTransformer,
                                        dict(embed_dim=768, depth=12, num_heads=12, **_SHAPE)),
}


def deit_model(name: str, **kwargs) -> VisionTransformer:
    """DeiT's ``name`` (``pretrained=False``); ``kwargs`` override its arguments (a test's ``depth``)."""
    cls, args = DEIT_MODELS[name]
    return cls(**{**args, **kwargs})


def interpolate_pos_embed(model, checkpoint_model):
    """DeiT's ``main.py`` (fine-tuning at another resolution, ``--finetune``), the same as MAE's
    ``util/pos_embed.py`` ``interpolate_pos_embed``: the checkpoint's table resampled once, bicubic to the
    model's (square) grid by output size, no antialias; [CLS] (and the distillation token) kept."""
    pos_embed_checkpoint = checkpoint_model['pos_embed']
    embedding_size = pos_embed_checkpoint.shape[-1]
    num_patches = model.patch_embed.num_patches
    num_extra_tokens = model.pos_embed.shape[-2] - num_patches
    # height (== width) for the checkpoint position embedding
    orig_size = int((pos_embed_checkpoint.shape[-2] - num_extra_tokens) ** 0.5)
    # height (== width) for the new position embedding
    new_size = int(num_patches ** 0.5)
    # class_token and dist_token are kept unchanged
    extra_tokens = pos_embed_checkpoint[:, :num_extra_tokens]
    # only the position tokens are interpolated
    pos_tokens = pos_embed_checkpoint[:, num_extra_tokens:]
    pos_tokens = pos_tokens.reshape(-1, orig_size, orig_size, embedding_size).permute(0, 3, 1, 2)
    pos_tokens = torch.nn.functional.interpolate(
        pos_tokens, size=(new_size, new_size), mode='bicubic', align_corners=False)
    pos_tokens = pos_tokens.permute(0, 2, 3, 1).flatten(1, 2)
    new_pos_embed = torch.cat((extra_tokens, pos_tokens), dim=1)
    checkpoint_model['pos_embed'] = new_pos_embed
