"""Which backbone a probe or an analysis runs on: a checkpoint (this project's or official DINO), or a baseline
(``random``: the same architecture, untrained; ``pixels``: raw patch pixels). The one place that turns
``--ckpt ''|random|pixels|<path>`` into a backbone.

    info = resolve_backbone("", "entmax", "vit_demo_patch8", 8)        # newest `make pretrain VARIANT=entmax` run
    info.model, info.sha256, info.backbone_config                       # file read once: weights, hash, config
    resolve_backbone("random", "lastvit", "vit_demo_patch8", 8, seed=0)  # same init for the same seed
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from backbones import BackboneConfig, create_vit, read_checkpoint

from .baselines import PixelBackbone

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


def resolve_backbone(ckpt: str, variant: str, arch: str, patch_size: int, seed: int = 0,
                     which: str = "teacher") -> BackboneInfo:
    """--ckpt '' -> the latest pretraining checkpoint of --variant; a path; 'random' (``arch``, ``seed``);
    'pixels' (``patch_size``). ``which``: the teacher or student of a DINO checkpoint."""
    ckpt = (ckpt or "").strip()
    variant = (variant or "softmax").strip()
    if ckpt == "pixels":
        m = PixelBackbone(patch_size)
        return BackboneInfo(m, "pixels", "pixels", config=dict(m.config))
    if ckpt == "random":
        m = create_vit(arch, variant, seed=seed)  # the same random init every time for a given seed
        return BackboneInfo(m, "random", f"{m.variant}_random", config={**m.config, "seed": seed},
                            backbone_config=m.backbone_config)
    if not ckpt:
        from tokenmix.paths import latest_pretrain_checkpoint
        path = latest_pretrain_checkpoint(variant)  # FileNotFoundError naming the folder and the fix
    else:
        path = Path(ckpt).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"checkpoint {path} not found. Pass CKPT=<file> (a tokenmix .ckpt or an official "
                                    f"DINO .pth), CKPT=random / CKPT=pixels for the baselines, or leave CKPT empty "
                                    f"for the latest `make pretrain VARIANT={variant}` run.")
    ck = read_checkpoint(path, which=which)  # one read: the sha256 is of the bytes the weights come from
    m = ck.build()
    return BackboneInfo(m, "checkpoint", m.variant, checkpoint=str(Path(path).resolve()), sha256=ck.sha256,
                        config=dict(m.config), backbone_config=m.backbone_config)
