"""Other projects' ViT weights in tokenmix (= timm) keys: one filter for every foreign layout, as timm keeps them
in ``checkpoint_filter_fn``, and the config of a checkpoint named by a timm model.

Layouts (``LAYOUTS``), told apart by their keys:
- ``timm``: timm's ``VisionTransformer`` keys, which official DINO, DeiT and MAE releases also use (``cls_token``,
  ``pos_embed``, ``patch_embed.proj``, ``blocks.N.{norm1,attn.qkv,attn.proj,ls1.gamma,norm2,mlp.fc1,mlp.fc2,
  ls2.gamma}``, ``norm``, ``reg_token``). A ``pos_embed`` without a [CLS] entry (timm's ``no_embed_class``:
  DeiT III, timm's DINOv2 with registers) gets a zero one: the same sums, since tokenmix adds ``pos_embed[:, 0]``
  to [CLS] and nothing to registers;
- ``dinov2``: the facebookresearch/dinov2 torch.hub state dict: ``register_tokens`` (placed after [CLS], no
  position embedding, as tokenmix's ``reg_token``), ``mask_token`` (masked training only: dropped), and under
  ``block_chunks`` (its training checkpoints) ``blocks.<chunk>.<N>.*``;
- ``torchvision``: torchvision's ``VisionTransformer`` (plain, or inside detectron2's layout: the LaSt-ViT release).
MAE's pretraining ``decoder_*`` and ``mask_token`` are dropped too; any other key is left for the strict load to
name. A state dict in none of these layouts is refused, naming a few of its keys and the layouts known, and so are,
by name, models whose output the tokenmix ViT does not compute (DeiT distilled).
``layout_config``: what a file decides beyond the shapes (DINOv2 with registers: its hub's position-table rule; MAE
fine-tuned with ``global_pool``: ``fc_norm`` of the mean patch token as the [CLS] output).

    sd, layout = filter_state_dict(torch.load("dinov2_vits14_reg4_pretrain.pth"))   # layout == "dinov2"
    timm_config("vit_small_patch14_reg4_dinov2")   # {'arch': 'vit_small_patch14', 'variant': 'registers', ...}
"""
from __future__ import annotations

import re
from typing import Any, Mapping

import torch

from tokenmix.io import CheckpointError

from .config import ARCHS, SHAPE_FIELDS

LAYOUTS = {
    "timm": "timm VisionTransformer keys (also official DINO, DeiT, MAE): cls_token, pos_embed, blocks.N.attn.qkv",
    "dinov2": "facebookresearch/dinov2 torch.hub: register_tokens, mask_token, blocks.N.ls1.gamma",
    "torchvision": "torchvision VisionTransformer: class_token, encoder.layers.encoder_layer_N (also detectron2's)",
}
DROPPED = re.compile(r"mask_token|decoder_.*|decoder\..*")  # masked-training inputs, MAE's pretraining decoder

_TV_RULES = [  # torchvision VisionTransformer key -> timm key (regex, replacement)
    (r"^class_token$", "cls_token"), (r"^conv_proj\.", "patch_embed.proj."),
    (r"^encoder\.pos_embedding$", "pos_embed"), (r"^encoder\.ln\.", "norm."),
    (r"^encoder\.layers\.encoder_layer_(\d+)\.ln_1\.", r"blocks.\1.norm1."),
    (r"^encoder\.layers\.encoder_layer_(\d+)\.ln_2\.", r"blocks.\1.norm2."),
    (r"^encoder\.layers\.encoder_layer_(\d+)\.self_attention\.in_proj_(weight|bias)$", r"blocks.\1.attn.qkv.\2"),
    (r"^encoder\.layers\.encoder_layer_(\d+)\.self_attention\.out_proj\.", r"blocks.\1.attn.proj."),
    (r"^encoder\.layers\.encoder_layer_(\d+)\.mlp\.(0|linear_1)\.", r"blocks.\1.mlp.fc1."),
    (r"^encoder\.layers\.encoder_layer_(\d+)\.mlp\.(3|linear_2)\.", r"blocks.\1.mlp.fc2."),
    (r"^heads\.head\.", "head."),
]


def detect_layout(sd: Mapping[str, Any]) -> str:
    """The ``LAYOUTS`` name of a state dict (module./backbone. prefixes already stripped), or ``CheckpointError``
    naming a few of its keys and the layouts known."""
    if "class_token" in sd or "encoder.pos_embedding" in sd:
        return "torchvision"
    if "register_tokens" in sd or any(re.match(r"blocks\.\d+\.\d+\.", k) for k in sd) \
            or getattr(sd.get("mask_token"), "ndim", 0) == 2:  # dinov2's is (1, D); MAE's (1, 1, D)
        return "dinov2"
    if all(k in sd for k in ("cls_token", "pos_embed", "patch_embed.proj.weight")):
        return "timm"
    raise CheckpointError(f"unknown checkpoint layout (keys: {sorted(sd)[:8]}{' …' if len(sd) > 8 else ''}); "
                          "known layouts: " + "; ".join(f"{k} ({v})" for k, v in LAYOUTS.items()))


def filter_state_dict(sd: Mapping[str, Any], source: str = "checkpoint") -> tuple[dict[str, Any], str]:
    """``(state dict in tokenmix keys, layout)`` of a ViT state dict in any of ``LAYOUTS``: the one place that
    maps foreign keys. Keys that no tokenmix ViT has (``dist_token``, q/k norms, SwiGLU, ...) stay, so that
    ``BackboneCheckpoint.load_into`` names them as unexpected (or, ``strict=False``, loads the rest)."""
    try:
        layout = detect_layout(sd)
    except CheckpointError as e:
        raise CheckpointError(f"{source}: {e}") from None
    out: dict[str, Any] = {}
    unmapped = []
    for k, v in sd.items():
        if layout == "torchvision":
            for pat, rep in _TV_RULES:
                k, n = re.subn(pat, rep, k)
                if n:
                    break
            else:  # e.g. heads.pre_logits (representation_size): no counterpart in a timm-style ViT
                unmapped.append(k)
        elif layout == "dinov2":
            k = re.sub(r"^blocks\.\d+\.(\d+)\.", r"blocks.\1.", k)  # block_chunks: blocks.<chunk>.<N>
            k = "reg_token" if k == "register_tokens" else k
        if not DROPPED.fullmatch(k):
            out[k] = v
    if unmapped:
        raise CheckpointError(f"{source}: torchvision ViT keys without a tokenmix counterpart: {unmapped[:10]}")
    _refuse_other_outputs(out, source)
    n = out["pos_embed"].shape[1] if getattr(out.get("pos_embed"), "ndim", 0) == 3 else 0
    if n and int(n ** 0.5) ** 2 == n:  # no [CLS] entry (no_embed_class): [CLS] gets none, i.e. a zero one
        out["pos_embed"] = torch.cat([out["pos_embed"].new_zeros(1, 1, out["pos_embed"].shape[-1]),
                                      out["pos_embed"]], dim=1)
    elif n and int((n - 1) ** 0.5) ** 2 != n - 1:
        raise CheckpointError(f"{source}: pos_embed of {n} entries is neither a square grid nor [CLS] + one; "
                              "only square position grids load")
    return out, layout


def _refuse_other_outputs(sd: Mapping[str, Any], source: str) -> None:
    """Files whose model outputs something the tokenmix ViT (one [CLS] or MAE's pooled output, see
    ``layout_config``) does not compute, refused by name rather than by their keys alone."""
    if "dist_token" in sd:
        raise CheckpointError(f"{source}: a DeiT distilled model (dist_token, head_dist): a second prefix token "
                              "with its own position, which the tokenmix ViT does not have. Load the "
                              "non-distilled DeiT release (deit_*_patch16_224-*.pth) instead")


def layout_config(layout: str, sd: Mapping[str, Any]) -> dict[str, Any]:
    """``BackboneConfig`` fields that a file decides beyond the shapes (files without a recorded config):
    - DINOv2 interpolates position tables by its hub's per-model rule (dinov2/hub/backbones.py, also its eval
      configs ``*_reg4_pretrain.yaml``): the ``*_reg`` models with ``interpolate_antialias=True,
      interpolate_offset=0``, the others with the defaults (antialias off, offset 0.1: DINO's rule). A DINOv2 file
      has registers when it holds ``register_tokens`` (``reg_token`` once filtered);
    - ``fc_norm.*`` without a final ``norm.*``: MAE fine-tuned with ``global_pool`` (its default; ``models_vit.py``
      deletes ``norm`` and adds ``fc_norm``), whose output is ``fc_norm`` of the mean patch token."""
    config: dict[str, Any] = {}
    if layout == "dinov2" and "reg_token" in sd:
        config["pos_interp"] = "dinov2_reg"
    if "fc_norm.weight" in sd and "norm.weight" not in sd:
        config["global_pool"] = True
    return config


def timm_config(name: str) -> dict[str, Any]:
    """The ``BackboneConfig`` fields of timm model ``name`` (e.g. ``vit_small_patch14_reg4_dinov2``), read from the
    model timm builds (on the meta device: no weights, no network); ``pos_interp="timm"``, so position
    embeddings resample as timm's ``dynamic_img_size`` does. A model the tokenmix ViT cannot compute exactly
    (other norms, activations, MLPs, a position embedding on registers, ...) is refused, saying why."""
    import timm
    from timm.layers import LayerScale, Mlp
    from timm.models.vision_transformer import Block, VisionTransformer
    if not timm.is_model(name):
        raise CheckpointError(f"--arch {name!r}: neither a tokenmix arch ({', '.join(ARCHS)}) nor a timm model "
                              "(timm.list_models('vit_*') lists them)")
    with torch.device("meta"):
        m = timm.create_model(name, pretrained=False, num_classes=0)
    blk = m.blocks[0] if isinstance(m, VisionTransformer) and len(m.blocks) else None
    dim = getattr(m, "embed_dim", 0)
    why = [w for w, bad in (
        ("not a timm VisionTransformer", blk is None),
        ("blocks are not timm's Block", blk is not None and type(blk) is not Block),
        ("no class token", getattr(m, "cls_token", None) is None),
        ("prefix tokens other than [CLS] and registers (a distillation token?)",
         getattr(m, "num_prefix_tokens", 1) != 1 + getattr(m, "num_reg_tokens", 0)),
        ("registers with a position embedding", getattr(m, "num_reg_tokens", 0) and not m.no_embed_class),
        ("a norm before the blocks or in the patch embedding", not isinstance(getattr(m, "norm_pre", None),
                                                                              torch.nn.Identity)
         or not isinstance(getattr(m.patch_embed, "norm", None), torch.nn.Identity)),
        ("no final LayerNorm of eps 1e-6", not (isinstance(getattr(m, "norm", None), torch.nn.LayerNorm)
                                                and m.norm.eps == 1e-6)),
        ("an MLP other than fc1-GELU-fc2 of ratio 4", blk is not None and not (
            type(blk.mlp) is Mlp and type(blk.mlp.act) is torch.nn.GELU and blk.mlp.act.approximate == "none"
            and blk.mlp.fc1.out_features == 4 * dim and isinstance(blk.mlp.norm, torch.nn.Identity))),
        ("q/k norms or no qkv bias", blk is not None and (not isinstance(blk.attn.q_norm, torch.nn.Identity)
                                                          or blk.attn.qkv.bias is None)),
        ("non-square images or patches", m.patch_embed.img_size[0] != m.patch_embed.img_size[1]
         or m.patch_embed.patch_size[0] != m.patch_embed.patch_size[1]),
    ) if bad]
    if why:
        raise CheckpointError(f"timm model {name!r} differs from the tokenmix ViT ({'; '.join(why)}); "
                              "it cannot be loaded exactly")
    shape = dict(img_size=m.patch_embed.img_size[0], patch_size=m.patch_embed.patch_size[0], embed_dim=dim,
                 depth=len(m.blocks), num_heads=blk.attn.num_heads)
    config: dict[str, Any] = {"arch": nearest_arch(shape), "variant": "softmax", "pos_interp": "timm"}
    config.update({k: v for k, v in shape.items() if v != ARCHS[config["arch"]][k]})
    if m.num_reg_tokens:
        config.update(variant="registers", num_registers=m.num_reg_tokens)
    if isinstance(blk.ls1, LayerScale):  # its init value: from one real block (the meta one holds no values)
        one = timm.create_model(name, pretrained=False, num_classes=0, depth=1, img_size=m.patch_embed.patch_size)
        config["init_values"] = float(f"{one.blocks[0].ls1.gamma[0].item():.6g}")  # float32 -> the written value
    return config


def nearest_arch(shape: Mapping[str, int]) -> str:
    """The tokenmix arch that shares most of ``shape``'s fields (width, depth and heads first): the rest is
    recorded in the config as overrides."""
    def score(a: str) -> tuple:
        same = [ARCHS[a][k] == shape[k] for k in SHAPE_FIELDS]
        return (all(same[2:]), sum(same))
    return max(ARCHS, key=score)
