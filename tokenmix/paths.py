"""Where runs live: ``runs/<variant>/<kind>/...`` (TensorBoard: ``make tensorboard``), the newest pretraining
checkpoint of a variant and claiming a fresh ``version_N`` folder.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable, Optional

REPO = Path(__file__).resolve().parent.parent
RUNS = Path(os.environ.get("TOKENMIX_RUNS", REPO / "runs"))
DEMO_ROOT = Path(os.environ.get("TOKENMIX_DEMO_ROOT", REPO / "data" / "demo"))
VERSION_ENV = "TOKENMIX_RUN_VERSION"  # the version folder rank 0 claimed, inherited by the DDP processes


def latest_checkpoint(variant: str, runs: Optional[Path] = None, accept: Optional[Callable[[Path], bool]] = None,
                      objective: str = "") -> Path:
    """Newest ``last.ckpt`` (by mtime) under ``<runs>/<variant>/pretrain`` (``runs``: default ``RUNS``).
    ``accept``: only files it accepts, asked newest first (RESUME: the runs of one objective, told from each
    checkpoint); ``objective`` names them in the error. ``FileNotFoundError`` naming the folder and the fix."""
    root = (Path(runs) if runs is not None else RUNS) / variant / "pretrain"
    found = sorted(root.glob("**/last.ckpt"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in found:
        if accept is None or accept(path):
            return path
    which = f" of a {objective} run" if objective else ""
    make = "make pretrain" + (f" OBJECTIVE={objective}" if objective and objective != "dino" else "")
    raise FileNotFoundError(f"no last.ckpt{which} for variant '{variant}' under {root} (looked for **/last.ckpt). "
                            f"Run `{make} VARIANT={variant}` first, or pass the path of a checkpoint.")


def claim_version_dir(root: Path) -> Path:
    """Create the next free ``version_N`` under ``root`` atomically (mkdir fails if another run took it), so
    each run, even concurrent ones, owns a fresh folder and results never mix."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    taken = [int(m.group(1)) for p in root.iterdir() if (m := re.fullmatch(r"version_(\d+)", p.name))]
    n = max(taken, default=-1) + 1
    while True:
        try:
            (root / f"version_{n}").mkdir()
            return root / f"version_{n}"
        except FileExistsError:
            n += 1


def run_version(root: Path, spawns: bool) -> str:
    """This run's ``version_N`` under ``root``: claimed by rank 0 and handed to the processes Lightning starts
    through the environment (``spawns``); ranks a cluster launcher started get ``version_rank<r>``, never written.
    :func:`release_version` when the run is over lets a next run in this process claim its own folder."""
    from .launch import global_rank
    if os.environ.get(VERSION_ENV):
        return os.environ[VERSION_ENV]
    if global_rank() != 0:
        return f"version_rank{global_rank()}"
    version = claim_version_dir(root).name
    if spawns:
        os.environ[VERSION_ENV] = version  # inherited by the processes the DDP launcher starts
    return version


def release_version() -> None:
    os.environ.pop(VERSION_ENV, None)
