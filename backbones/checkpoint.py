"""Load backbone weights from the three formats researchers have, always with ``weights_only=True``.

(a) an official DINO released backbone (``dino_deitsmall16_pretrain.pth``): a plain ViT state dict;
(b) an official DINO training checkpoint (``main_dino.py``'s ``checkpoint.pth``, the released
    ``*_full_checkpoint.pth``): ``{"student", "teacher", "optimizer", "epoch", "args", "dino_loss"}``, the student
    under DDP (``module.backbone.*``), the teacher plain (``backbone.*``), ``head.*`` dropped; teacher by default, as
    DINO's evaluations do. ``args`` is an ``argparse.Namespace``, allowed by ``tokenmix.io.safe_torch_load``;
(c) this project's Lightning checkpoints: ``state_dict`` keys ``teacher.backbone.*`` / ``student.backbone.*``
    (label-supervised runs: ``backbone.*``, ``tokenmix.kind == "supervised"``) and
    ``checkpoint["tokenmix"]["backbone"]`` = the config that rebuilds the backbone;
(d) torchvision ``VisionTransformer`` weights, plain or in detectron2's layout
    ``{"model": {"model.<torchvision key>": ...}, "iteration": ...}`` (the LaSt-ViT release), mapped to
    timm keys by ``torchvision_vit_to_timm``.
A classifier ``head.*`` is loaded only into a model built with ``num_classes``; a backbone without a head
(probes, analyses) ignores it.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Mapping

import torch

from tokenmix.io import CheckpointError, safe_torch_load

from .variants import parse_variant
from .vit import ARCHS, TokenMixViT, create_vit


def _strip(sd: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in sd.items()}


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


def is_torchvision_vit(sd: Mapping[str, Any]) -> bool:
    return "class_token" in sd or "encoder.pos_embedding" in sd


def torchvision_vit_to_timm(sd: Mapping[str, Any], source: str = "checkpoint") -> dict[str, Any]:
    """torchvision ``VisionTransformer`` state dict -> timm/tokenmix keys. Same tensors, same layouts: packed
    q,k,v ``in_proj`` = timm ``qkv``, pre-norm blocks, LayerNorm eps 1e-6, exact GELU.

    >>> torchvision_vit_to_timm({"class_token": t, "encoder.layers.encoder_layer_0.mlp.3.bias": b})
    {'cls_token': t, 'blocks.0.mlp.fc2.bias': b}
    """
    out, unknown = {}, []
    for k, v in sd.items():
        for pat, rep in _TV_RULES:
            new, n = re.subn(pat, rep, k)
            if n:
                out[new] = v
                break
        else:
            unknown.append(k)
    if unknown:  # e.g. heads.pre_logits (representation_size) has no counterpart in the tokenmix ViT
        raise CheckpointError(f"{source}: torchvision ViT keys without a tokenmix counterpart: {unknown[:10]}")
    return out


def extract_backbone_state(obj: Any, which: str = "teacher", source: str = "checkpoint") -> tuple[dict, dict]:
    """Return ``(backbone state dict, tokenmix metadata)`` from any supported checkpoint object."""
    if which not in ("teacher", "student"):
        raise ValueError(f"which must be 'teacher' or 'student', got {which!r}")
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{source}: expected a dict of tensors, got {type(obj).__name__}")
    meta = dict(obj.get("tokenmix") or {}) if isinstance(obj.get("tokenmix"), Mapping) else {}
    if isinstance(obj.get("state_dict"), Mapping):  # (c) Lightning checkpoint
        sd = obj["state_dict"]
        prefix = "backbone." if meta.get("kind") == "supervised" else f"{which}.backbone."
        if not any(k.startswith(prefix) for k in sd):
            raise CheckpointError(f"{source}: Lightning checkpoint without '{prefix}*' keys; not a tokenmix "
                                  f"pretraining checkpoint (first keys: {list(sd)[:5]})")
        sd = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
    elif isinstance(obj.get(which), Mapping):  # (b) official DINO training checkpoint
        sd = _strip(_strip(obj[which], "module."), "backbone.")
        sd = {k: v for k, v in sd.items() if not k.startswith("head.")}
    elif isinstance(obj.get("model"), Mapping) and any(str(k).startswith("model.") for k in obj["model"]):
        sd = {k[len("model."):]: v for k, v in obj["model"].items() if k.startswith("model.")}  # (d) detectron2
    elif all(isinstance(v, torch.Tensor) for v in obj.values()) and obj:  # (a) plain state dict
        sd = _strip(_strip(dict(obj), "module."), "backbone.")
    else:
        raise CheckpointError(f"{source}: unrecognised checkpoint layout (top-level keys: {list(obj)[:8]}); "
                              "expected a ViT state dict, a DINO training checkpoint or a tokenmix .ckpt")
    if is_torchvision_vit(sd):  # (d) torchvision keys, plain or from the detectron2 layout
        sd = torchvision_vit_to_timm(sd, source)
    return dict(sd), meta


def load_checkpoint(model: TokenMixViT, path: str | Path, strict: bool = True, which: str = "teacher") -> dict:
    """Load backbone weights into ``model``; returns ``{"missing": [...], "unexpected": [...]}``.

    Refuses (``CheckpointError``) a checkpoint recorded for another arch/variant, any shape mismatch, and,
    unless ``strict=False``, any missing or unexpected key (all of them named in the message).
    """
    sd, meta = extract_backbone_state(safe_torch_load(path), which, str(path))
    recorded = meta.get("backbone") or {}
    mine = getattr(model, "config", {})
    theirs = {"arch": recorded.get("arch"),
              "variant": parse_variant(recorded["variant"]).name if "variant" in recorded else None}
    for key, value in theirs.items():
        if value is not None and key in mine and value != mine[key]:
            raise CheckpointError(
                f"{path}: checkpoint was trained as {key}={value!r} but the model is {key}={mine[key]!r}. "
                f"Build the model with backbones.backbone_from_checkpoint('{path}') or pass the matching {key}.")
    own = model.state_dict()
    if not any(k.startswith("head.") for k in own):  # a feature backbone: a classifier head is not part of it
        sd = {k: v for k, v in sd.items() if not k.startswith("head.")}
    bad_shapes = [f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
                  for k, v in sd.items() if k in own and tuple(v.shape) != tuple(own[k].shape)]
    if bad_shapes:
        raise CheckpointError(f"{path}: shape mismatch (another architecture?):\n  " + "\n  ".join(bad_shapes[:20]))
    missing = sorted(set(own) - set(sd))
    unexpected = sorted(set(sd) - set(own))
    if strict and (missing or unexpected):
        raise CheckpointError(f"{path}: keys do not match the {mine.get('arch', '?')}/{mine.get('variant', '?')} "
                              f"backbone.\n  missing: {missing}\n  unexpected: {unexpected}\n"
                              "Pass strict=False to load the rest anyway.")
    model.load_state_dict({k: v for k, v in sd.items() if k in own}, strict=False)
    return {"missing": missing, "unexpected": unexpected}


def infer_config(sd: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """Arch/variant of a state dict without metadata (official DINO files), from parameter shapes."""
    try:
        dim = sd["cls_token"].shape[-1]
        patch = sd["patch_embed.proj.weight"].shape[-1]
        n_pos = sd["pos_embed"].shape[1] - 1
    except KeyError as e:
        raise CheckpointError(f"not a ViT state dict: missing {e}") from e
    depth = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
    for name, a in ARCHS.items():
        if (a["embed_dim"], a["depth"], a["patch_size"]) == (dim, depth, patch):
            break
    else:
        raise CheckpointError(f"no known arch with embed_dim={dim}, depth={depth}, patch={patch}; "
                              f"known: {', '.join(ARCHS)}")
    config: dict[str, Any] = {"arch": name, "variant": "softmax"}
    side = int(math.isqrt(n_pos))
    if side * side == n_pos and side * patch != a["img_size"]:
        config["img_size"] = side * patch
    if "reg_token" in sd:
        config.update(variant="registers", num_registers=sd["reg_token"].shape[1])
    config.update(_infer_specialization(sd))
    return config


def _infer_specialization(sd: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """spec_blocks (and, where norms and q/k/v differ, spec_norm_blocks / spec_qkv_blocks) from the *_cls keys."""
    found = {c: sorted({int(k.split(".")[1]) for k in sd if k.startswith("blocks.") and f".{key}_cls." in k})
             for c, key in (("norm1", "norm1"), ("norm2", "norm2"), ("qkv", "attn.qkv"))}
    union = sorted({b for v in found.values() for b in v})
    if not union:
        return {}
    config: dict[str, Any] = {"variant": "specialization", "spec_blocks": union}
    if any(v != union for v in found.values()):
        config["spec_components"] = [c for c in ("norm1", "qkv", "norm2") if found[c]]
        if found["norm1"] and found["norm2"] and found["norm1"] != found["norm2"]:
            raise CheckpointError(f"norm1 and norm2 are specialised in different blocks ({found['norm1']} vs "
                                  f"{found['norm2']}); build the backbone yourself and use load_checkpoint")
        norms = found["norm1"] or found["norm2"]
        if norms and norms != union:
            config["spec_norm_blocks"] = norms
        if found["qkv"] and found["qkv"] != union:
            config["spec_qkv_blocks"] = found["qkv"]
    return config


def backbone_from_checkpoint(path: str | Path, which: str = "teacher", strict: bool = True,
                             **overrides: Any) -> TokenMixViT:
    """Build the backbone recorded in (or inferred from) a checkpoint and load its weights."""
    sd, meta = extract_backbone_state(safe_torch_load(path), which, str(path))
    config = dict(meta.get("backbone") or infer_config(sd))
    config.update(overrides)
    model = create_vit(**config)
    load_checkpoint(model, path, strict=strict, which=which)
    return model
