"""``make export CKPT=... VARIANT=... OUT=...``: the pretrained backbone in the official released DINO format.

A plain ``{name: tensor}`` state dict of the teacher backbone (as ``dino_deitsmall16_pretrain.pth``; variants add
``reg_token`` / ``*_cls``) plus a ``<out>.json`` sidecar: the checkpoint's ``tokenmix`` entry and the file's
sha256, which ``backbones.read_checkpoint`` checks before rebuilding the recorded variant (entmax or lastvit
leave no trace in the tensors).
"""
from __future__ import annotations

import argparse
import hashlib
import io
import sys
from pathlib import Path
from typing import Optional

import torch

from backbones.checkpoint import read_checkpoint
from tokenmix import paths
from tokenmix.cli import error_exit
from tokenmix.io import CheckpointError, atomic_json_dump, atomic_write


def export(ckpt_path: str | Path, out: str | Path, which: str = "teacher") -> Path:
    ck = read_checkpoint(ckpt_path, which)  # one read; layout and config from backbones.checkpoint
    if not ck.entry:
        raise CheckpointError(f"{ckpt_path}: not a tokenmix Lightning checkpoint (no 'tokenmix' entry); "
                              "make export converts `make pretrain` checkpoints")
    sd = {k: v.detach().clone().contiguous() for k, v in ck.state_dict.items() if not k.startswith("head.")}
    buf = io.BytesIO()
    torch.save(sd, buf)
    out = Path(out)
    with atomic_write(out, "wb") as f:
        f.write(buf.getvalue())
    meta = {**ck.entry, "backbone": ck.config.to_dict(), "which": which, "source": str(Path(ckpt_path).resolve()),
            "source_sha256": ck.sha256, "sha256": hashlib.sha256(buf.getvalue()).hexdigest(),
            "global_step": ck.progress.get("global_step"), "epoch": ck.progress.get("epoch")}
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
        ckpt = Path(a.ckpt) if a.ckpt else paths.latest_checkpoint(a.variant)
        out = Path(a.out) if a.out else paths.RUNS / a.variant / "export" / f"{ckpt.stem}_{a.which}_backbone.pth"
        written = export(ckpt, out, a.which)
    except (CheckpointError, FileNotFoundError, ValueError) as e:
        return error_exit(e, 2)
    print(f"wrote {written} (+ {written.name}.json) from {ckpt}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
