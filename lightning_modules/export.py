"""``make export CKPT=... VARIANT=... OUT=...``: the pretrained backbone in the official released DINO format.

Writes a plain ``{name: tensor}`` state dict of the teacher backbone (what DINO releases, e.g.
``dino_deitsmall16_pretrain.pth``: ``cls_token``, ``pos_embed``, ``patch_embed.proj.*``, ``blocks.N.*``, ``norm.*``;
variants add ``reg_token`` / ``*_cls`` tensors) plus a ``<out>.json`` sidecar with the backbone config.
Loads with ``torch.load(weights_only=True)`` and ``backbones.load_checkpoint`` / ``backbone_from_checkpoint``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

import torch

from tokenmix import paths
from tokenmix.io import CheckpointError, atomic_json_dump, atomic_torch_save, safe_torch_load

from lightning_modules.checkpoint_io import validate_pretrain_checkpoint


def backbone_state_dict(ckpt: dict, which: str = "teacher") -> dict[str, torch.Tensor]:
    if which not in ("teacher", "student"):
        raise ValueError(f"which must be 'teacher' or 'student', got {which!r}")
    prefix = f"{which}.backbone."
    sd = {k[len(prefix):]: v.detach().clone().contiguous() for k, v in ckpt["state_dict"].items()
          if k.startswith(prefix)}
    if not sd:
        raise CheckpointError(f"no '{prefix}*' tensors in the checkpoint")
    return sd


def export(ckpt_path: str | Path, out: str | Path, which: str = "teacher") -> Path:
    ckpt = validate_pretrain_checkpoint(safe_torch_load(ckpt_path), str(ckpt_path))
    sd = backbone_state_dict(ckpt, which)
    out = Path(out)
    atomic_torch_save(sd, out)
    meta = {**ckpt["tokenmix"], "which": which, "source": str(Path(ckpt_path).resolve()),
            "global_step": ckpt.get("global_step"), "epoch": ckpt.get("epoch")}
    atomic_json_dump(meta, out.with_suffix(out.suffix + ".json"))
    return out


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", default="", help="Lightning checkpoint ('' = newest last.ckpt of --variant)")
    p.add_argument("--variant", default="softmax")
    p.add_argument("--out", default="", help="output .pth ('' = runs/<variant>/export/<ckpt name>_backbone.pth)")
    p.add_argument("--which", default="teacher", choices=("teacher", "student"),
                   help="DINO evaluates and releases the teacher")
    a = p.parse_args(argv)
    try:
        ckpt = Path(a.ckpt) if a.ckpt else paths.latest_pretrain_checkpoint(a.variant)
        out = Path(a.out) if a.out else paths.RUNS / a.variant / "export" / f"{ckpt.stem}_{a.which}_backbone.pth"
        written = export(ckpt, out, a.which)
    except (CheckpointError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {written} (+ {written.name}.json) from {ckpt}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
