"""Which backbone a probe or an analysis runs on: a checkpoint (this project's or official DINO), or a baseline
(``random``: the same architecture, untrained; ``pixels``: raw patch pixels). The one place that turns
``--ckpt ''|random|pixels|<path>`` into a backbone.

    info = resolve_backbone("", "entmax", "vit_demo_patch8", 8)        # newest `make pretrain VARIANT=entmax` run
    info.model, info.sha256, info.backbone_config                       # file read once: weights, hash, config
    resolve_backbone("random", "lastvit", "vit_demo_patch8", 8, seed=0)  # same init for the same seed
    resolve_backbone("dinov2_vits14_reg4_pretrain.pth", "", "vit_demo_patch8", 8)   # foreign: layout from the keys
    resolve_backbone("model.safetensors", "", "vit_small_patch14_reg4_dinov2", 8)   # a timm model's weights

``arch`` names the architecture of ``random``; with a checkpoint file a tokenmix arch (``backbones.ARCHS``) is not
used (the file records or shows its own), while a timm model name says whose weights the file holds
(``backbones.foreign.timm_config``): ``CKPT=model.safetensors ARGS="--arch vit_small_patch14_reg4_dinov2"``.
``random`` with a timm name is that model's architecture, untrained.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from backbones import ARCHS, BackboneConfig, create_vit, read_checkpoint

from backbones.baselines import PixelBackbone

BASELINES = ("random", "pixels")


@dataclass
class BackboneInfo:
    model: torch.nn.Module
    source: str                       # "checkpoint" | "random" | "pixels"
    run_name: str                     # folder under runs/: the variant, <variant>_random or pixels
    checkpoint: Optional[str] = None
    sha256: Optional[str] = None      # of the bytes the weights were read from
    config: dict[str, Any] = field(default_factory=dict)
    backbone_config: Optional[BackboneConfig] = None  # what rebuilds the model (None for pixels)


def checkpoint_path(ckpt: str, variant: str) -> Optional[Path]:
    """The file --ckpt names (None for 'random' / 'pixels'), checked to exist without reading it: the CLIs call
    this before opening data, so a wrong CKPT fails before a demo folder is generated or a dataset scanned."""
    ckpt, variant = (ckpt or "").strip(), (variant or "softmax").strip()
    if ckpt in ("random", "pixels"):
        return None
    if not ckpt:
        from tokenmix.paths import latest_checkpoint
        return latest_checkpoint(variant)  # FileNotFoundError naming the folder and the fix
    path = Path(ckpt).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} not found. Pass CKPT=<file> (a tokenmix .ckpt, an official "
                                f"DINO or DINOv2 .pth, a timm model's .pth/.safetensors with --arch <its timm "
                                f"name>), CKPT=random / CKPT=pixels for the baselines, or leave CKPT empty "
                                f"for the latest `make pretrain VARIANT={variant}` run.")
    return path


def resolve_backbone(ckpt: str, variant: str, arch: str, patch_size: int, seed: int = 0,
                     which: str = "teacher", path: Optional[Path] = None) -> BackboneInfo:
    """--ckpt '' -> the latest pretraining checkpoint of --variant; a path; 'random' (``arch``, ``seed``);
    'pixels' (``patch_size``). ``which``: the teacher or student of a DINO checkpoint. ``path``: the file
    ``checkpoint_path`` already found for ``ckpt`` (the CLIs resolve it once, before opening data)."""
    ckpt = (ckpt or "").strip()
    variant = (variant or "softmax").strip()
    if ckpt == "pixels":
        m = PixelBackbone(patch_size)
        return BackboneInfo(m, "pixels", "pixels", config=dict(m.config))
    if ckpt == "random":
        if arch in ARCHS:
            m = create_vit(arch, variant, seed=seed)  # the same random init every time for a given seed
        else:  # a timm model's architecture (its own variant: registers or not)
            from backbones.foreign import timm_config
            m = create_vit(**BackboneConfig.from_dict(timm_config(arch), f"timm model {arch}").to_dict(), seed=seed)
        return BackboneInfo(m, "random", f"{m.variant}_random", config={**m.config, "seed": seed},
                            backbone_config=m.backbone_config)
    path = path or checkpoint_path(ckpt, variant)
    ck = read_checkpoint(path, which=which, arch=arch)  # one read: the sha256 is of the bytes the weights come from
    m = ck.build()
    # other projects' weights get a run folder of their own, not that of the tokenmix variant they resemble
    name = arch if ck.config.pos_interp == "timm" and not ck.recorded else \
        "dinov2" + ("_reg" if m.num_reg_tokens else "") if ck.layout == "dinov2" else m.variant
    return BackboneInfo(m, "checkpoint", name, checkpoint=str(Path(path).resolve()), sha256=ck.sha256,
                        config=dict(m.config), backbone_config=m.backbone_config)
