"""Where runs live: ``runs/<variant>/<kind>/...`` (TensorBoard: ``make tensorboard``)."""
from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUNS = Path(os.environ.get("TOKENMIX_RUNS", REPO / "runs"))
DEMO_ROOT = Path(os.environ.get("TOKENMIX_DEMO_ROOT", REPO / "data" / "demo"))


def pretrain_dir(variant: str) -> Path:
    return RUNS / variant / "pretrain"


def latest_pretrain_checkpoint(variant: str) -> Path:
    """Newest ``last.ckpt`` under ``runs/<variant>/pretrain``; a clear error when there is none."""
    root = pretrain_dir(variant)
    found = sorted(root.glob("**/last.ckpt"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(
            f"no pretraining checkpoint for variant '{variant}' under {root} (looked for **/last.ckpt). "
            f"Run `make pretrain VARIANT={variant}` first, or pass CKPT=<path>.")
    return found[-1]
