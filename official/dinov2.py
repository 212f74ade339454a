"""facebookresearch/dinov2 (b8931f7bf91576930313be2c6d6af376033b35f0), transcribed: DINOv2's own ViT forward, the
reference that foreign-checkpoint tests compare the project's loader with.

From ``dinov2/models/vision_transformer.py``: ``BlockChunk``, ``DinoVisionTransformer`` (``__init__`` without
the weight init, ``interpolate_pos_encoding``, ``prepare_tokens_with_masks``, ``forward_features``), the shapes of
``vit_small``, ``vit_base``, ``vit_large``; from ``dinov2/layers/``: ``PatchEmbed``, ``Attention`` (what
``MemEffAttention`` runs without xFormers: torch's ``scaled_dot_product_attention``, as DINOv2 calls it),
``LayerScale``, ``Mlp``, ``Block`` (its eval branch); from ``dinov2/hub/backbones.py``: the per-model settings of
``_make_dinov2_model`` and the ``dinov2_vit*14[_reg]`` functions (``HUB_MODELS``, ``hub_settings``).
Same class, argument and parameter names, so a hub ``state_dict`` loads strictly and ``block_chunks > 0`` gives
the training checkpoints' keys (``blocks.<chunk>.<N>``). Deviations that change no number: no weight init (tests
draw their own weights), no drop-path, dropout or SwiGLU branches (a feature forward in eval mode), no xFormers
(without it DINOv2 runs exactly this ``Attention``), ``forward_features`` without the list-of-crops branch.
Nothing here imports the project.
"""
from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn as nn

# dinov2/hub/backbones.py: _make_dinov2_model defaults, then what each hub function passes
HUB_DEFAULTS = dict(img_size=518, patch_size=14, init_values=1.0, ffn_layer="mlp", block_chunks=0,
                    num_register_tokens=0, interpolate_antialias=False, interpolate_offset=0.1)
_REG = dict(num_register_tokens=4, interpolate_antialias=True, interpolate_offset=0.0)
HUB_MODELS = {
    "dinov2_vits14": dict(arch_name="vit_small"),
    "dinov2_vitb14": dict(arch_name="vit_base"),
    "dinov2_vitl14": dict(arch_name="vit_large"),
    "dinov2_vitg14": dict(arch_name="vit_giant2", ffn_layer="swiglufused"),
    "dinov2_vits14_reg": dict(arch_name="vit_small", **_REG),
    "dinov2_vitb14_reg": dict(arch_name="vit_base", **_REG),
    "dinov2_vitl14_reg": dict(arch_name="vit_large", **_REG),
    "dinov2_vitg14_reg": dict(arch_name="vit_giant2", ffn_layer="swiglufused", **_REG),
}


# ----------------------------------------------------------------------------------------------- dinov2/layers
class PatchEmbed(nn.Module):
    def __init__(self, img_size=224, patch_size=16, in_chans=3, embed_dim=768):
        super().__init__()
        image_HW, patch_HW = (img_size, img_size), (patch_size, patch_size)
        self.img_size, self.patch_size = image_HW, patch_HW
        self.num_patches = (image_HW[0] // patch_HW[0]) * (image_HW[1] // patch_HW[1])
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_HW, stride=patch_HW)
        self.norm = nn.Identity()

    def forward(self, x):
        _, _, H, W = x.shape
        patch_H, patch_W = self.patch_size
        assert H % patch_H == 0, f"Input image height {H} is not a multiple of patch height {patch_H}"
        assert W % patch_W == 0, f"Input image width {W} is not a multiple of patch width: {patch_W}"
        x = self.proj(x)  # B C H W
        x = x.flatten(2).transpose(1, 2)  # B HW C
        x = self.norm(x)
        return x


class Attention(nn.Module):
    def __init__(self, dim, num_heads=8, qkv_bias=False, proj_bias=True):
        super().__init__()
        self.dim, self.num_heads = dim, num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim, bias=proj_bias)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads)
        q, k, v = torch.unbind(qkv, 2)
        q, k, v = [t.transpose(1, 2) for t in [q, k, v]]
        x = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0, is_causal=False)
        x = x.transpose(1, 2).contiguous().view(B, N, C)
        return self.proj(x)


class LayerScale(nn.Module):
    def __init__(self, dim, init_values=1e-5):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init_values)))

    def forward(self, x):
        return x * self.gamma


class Mlp(nn.Module):
    def __init__(self, in_features, hidden_features=None, act_layer=nn.GELU, bias=True):
        super().__init__()
        hidden_features = hidden_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features, bias=bias)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_features, in_features, bias=bias)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio=4.0, qkv_bias=False, proj_bias=True, ffn_bias=True,
                 init_values=None, norm_layer=nn.LayerNorm):
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = Attention(dim, num_heads=num_heads, qkv_bias=qkv_bias, proj_bias=proj_bias)
        self.ls1 = LayerScale(dim, init_values=init_values) if init_values else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(in_features=dim, hidden_features=int(dim * mlp_ratio), bias=ffn_bias)
        self.ls2 = LayerScale(dim, init_values=init_values) if init_values else nn.Identity()

    def forward(self, x):
        def attn_residual_func(x):
            return self.ls1(self.attn(self.norm1(x)))

        def ffn_residual_func(x):
            return self.ls2(self.mlp(self.norm2(x)))

        x = x + attn_residual_func(x)
        x = x + ffn_residual_func(x)
        return x


# ----------------------------------------------------------------------------- dinov2/models/vision_transformer.py
class BlockChunk(nn.ModuleList):
    def forward(self, x):
        for b in self:
            x = b(x)
        return x


class DinoVisionTransformer(nn.Module):
    def __init__(self, img_size=224, patch_size=16, in_chans=3, embed_dim=768, depth=12, num_heads=12,
                 mlp_ratio=4.0, qkv_bias=True, ffn_bias=True, proj_bias=True, init_values=None, block_chunks=1,
                 num_register_tokens=0, interpolate_antialias=False, interpolate_offset=0.1):
        super().__init__()
        norm_layer = partial(nn.LayerNorm, eps=1e-6)
        self.num_features = self.embed_dim = embed_dim
        self.num_tokens = 1
        self.n_blocks = depth
        self.num_heads = num_heads
        self.patch_size = patch_size
        self.num_register_tokens = num_register_tokens
        self.interpolate_antialias = interpolate_antialias
        self.interpolate_offset = interpolate_offset

        self.patch_embed = PatchEmbed(img_size=img_size, patch_size=patch_size, in_chans=in_chans,
                                      embed_dim=embed_dim)
        num_patches = self.patch_embed.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + self.num_tokens, embed_dim))
        assert num_register_tokens >= 0
        self.register_tokens = (
            nn.Parameter(torch.zeros(1, num_register_tokens, embed_dim)) if num_register_tokens else None
        )
        blocks_list = [
            Block(dim=embed_dim, num_heads=num_heads, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, proj_bias=proj_bias,
                  ffn_bias=ffn_bias, norm_layer=norm_layer, init_values=init_values)
            for i in range(depth)
        ]
        if block_chunks > 0:
            self.chunked_blocks = True
            chunked_blocks = []
            chunksize = depth // block_chunks
            for i in range(0, depth, chunksize):
                # this is to keep the block index consistent if we chunk the block list
                chunked_blocks.append([nn.Identity()] * i + blocks_list[i: i + chunksize])
            self.blocks = nn.ModuleList([BlockChunk(p) for p in chunked_blocks])
        else:
            self.chunked_blocks = False
            self.blocks = nn.ModuleList(blocks_list)
        self.norm = norm_layer(embed_dim)
        self.head = nn.Identity()
        self.mask_token = nn.Parameter(torch.zeros(1, embed_dim))

    def interpolate_pos_encoding(self, x, w, h):
        previous_dtype = x.dtype
        npatch = x.shape[1] - 1
        N = self.pos_embed.shape[1] - 1
        if npatch == N and w == h:
            return self.pos_embed
        pos_embed = self.pos_embed.float()
        class_pos_embed = pos_embed[:, 0]
        patch_pos_embed = pos_embed[:, 1:]
        dim = x.shape[-1]
        w0 = w // self.patch_size
        h0 = h // self.patch_size
        M = int(math.sqrt(N))  # Recover the number of patches in each dimension
        assert N == M * M
        kwargs = {}
        if self.interpolate_offset:
            # Historical kludge: add a small number to avoid floating point error in the interpolation,
            # see https://github.com/facebookresearch/dino/issues/8
            # Note: still needed for backward-compatibility, the underlying operators are using both output size
            # and scale factors
            sx = float(w0 + self.interpolate_offset) / M
            sy = float(h0 + self.interpolate_offset) / M
            kwargs["scale_factor"] = (sx, sy)
        else:
            # Simply specify an output size instead of a scale factor
            kwargs["size"] = (w0, h0)
        patch_pos_embed = nn.functional.interpolate(
            patch_pos_embed.reshape(1, M, M, dim).permute(0, 3, 1, 2),
            mode="bicubic",
            antialias=self.interpolate_antialias,
            **kwargs,
        )
        assert (w0, h0) == patch_pos_embed.shape[-2:]
        patch_pos_embed = patch_pos_embed.permute(0, 2, 3, 1).view(1, -1, dim)
        return torch.cat((class_pos_embed.unsqueeze(0), patch_pos_embed), dim=1).to(previous_dtype)

    def prepare_tokens_with_masks(self, x, masks=None):
        B, nc, w, h = x.shape
        x = self.patch_embed(x)
        if masks is not None:
            x = torch.where(masks.unsqueeze(-1), self.mask_token.to(x.dtype).unsqueeze(0), x)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = x + self.interpolate_pos_encoding(x, w, h)
        if self.register_tokens is not None:
            x = torch.cat((x[:, :1], self.register_tokens.expand(x.shape[0], -1, -1), x[:, 1:]), dim=1)
        return x

    def forward_features(self, x, masks=None):
        x = self.prepare_tokens_with_masks(x, masks)
        for blk in self.blocks:
            x = blk(x)
        x_norm = self.norm(x)
        return {
            "x_norm_clstoken": x_norm[:, 0],
            "x_norm_regtokens": x_norm[:, 1: self.num_register_tokens + 1],
            "x_norm_patchtokens": x_norm[:, self.num_register_tokens + 1:],
            "x_prenorm": x,
            "masks": masks,
        }


# vit_small / vit_base / vit_large: their DinoVisionTransformer arguments (block_fn MemEffAttention = Attention here)
ARCH_SHAPES = {
    "vit_small": dict(embed_dim=384, depth=12, num_heads=6, mlp_ratio=4),
    "vit_base": dict(embed_dim=768, depth=12, num_heads=12, mlp_ratio=4),
    "vit_large": dict(embed_dim=1024, depth=24, num_heads=16, mlp_ratio=4),
}


def hub_settings(name: str) -> dict:
    """The ``DinoVisionTransformer`` arguments of ``torch.hub.load("facebookresearch/dinov2", name)``:
    ``_make_dinov2_model``'s defaults, what the hub function ``name`` passes (``HUB_MODELS``) and its arch's shape.
    A test may change the shape (e.g. ``depth``) and keep the rest. Only the MLP models (ViT-g's SwiGLU is not
    transcribed)."""
    settings = {**HUB_DEFAULTS, **HUB_MODELS[name]}
    arch_name, ffn_layer = settings.pop("arch_name"), settings.pop("ffn_layer")
    if ffn_layer != "mlp":
        raise NotImplementedError(f"{name}: ffn_layer={ffn_layer!r} is not transcribed")
    return {**ARCH_SHAPES[arch_name], **settings}
