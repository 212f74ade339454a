"""The study's files, all read and written here (``study.cells`` decides what they mean): plan.json; a cell's marker
``<study>/done/<cell>/<key>.json`` (atomic: its key, the sha256, size and mtime of the checkpoint it made or used,
an evaluation's results.json); results.json, one schema (``tokenmix/results.py``), files from before it still read
(probes: ``backbone.checkpoint_sha256`` + ``config.data``; analyses: ``ckpt_sha256`` + ``data``).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from tokenmix.io import atomic_json_dump, sha256_file

from .cells import PRETRAIN, Cell, Job, finished, next_job


@dataclass(frozen=True)
class Result:
    path: Path
    task: str
    source: str  # probe | analysis
    checkpoint_sha256: Optional[str]
    data: str
    metrics: dict = field(repr=False)
    payload: dict = field(repr=False)


def _first(*values) -> Any:
    return next((v for v in values if v not in (None, "")), None)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError, TypeError):
        return None


def read_result(path: Path) -> Optional[Result]:
    """A results.json as a :class:`Result`; None when the file is missing, unreadable or has no metrics."""
    r = _read_json(path)
    if not isinstance(r, dict) or not isinstance(r.get("metrics"), dict):
        return None
    backbone = r.get("backbone") if isinstance(r.get("backbone"), dict) else {}
    config = r.get("config") if isinstance(r.get("config"), dict) else {}
    parts = Path(path).parts
    folder = parts[-4] if len(parts) >= 4 else ""  # runs/<variant>/<probe|analysis>/<task>/version_N/
    source = folder if folder in ("probe", "analysis") else ("probe" if "checkpoint_sha256" in backbone else "analysis")
    task = str(_first(r.get("task"), parts[-3] if len(parts) >= 3 else ""))
    sha = _first(backbone.get("sha256"), r.get("ckpt_sha256"), backbone.get("checkpoint_sha256"))  # new, legacy
    data = str(_first(r.get("data"), config.get("data"), "demo"))
    return Result(Path(path), task, str(source), sha, data, r["metrics"], r)


def read_plan(path: Path) -> list[Cell]:
    """The cells of a plan.json (``study.plan.write_plan``), as they were resolved."""
    return [Cell.from_json(c) for c in json.loads(Path(path).read_text())["cells"]]


def _checkpoint_sha(path: Path, entry: dict) -> Optional[str]:
    """sha256 of a checkpoint, trusting the marker's value while size and mtime are unchanged (hashing a ViT-S
    checkpoint per cell and per invocation would cost seconds each)."""
    if not path.is_file():
        return None
    st = path.stat()
    if entry.get("size") == st.st_size and entry.get("mtime_ns") == st.st_mtime_ns and entry.get("ckpt_sha256"):
        return entry["ckpt_sha256"]
    return sha256_file(path)


def _facts(cell: Cell, hashes: bool = True) -> tuple[Optional[dict], dict, Optional[Result]]:
    """(the cell's marker if it has today's key, sha256 today of each checkpoint it names, the result it names)."""
    m = _read_json(cell.marker)
    if not isinstance(m, dict) or m.get("key") != cell.key:
        return None, {}, None
    if cell.kind != PRETRAIN:
        return m, {}, read_result(Path(m.get("results", "")))
    entries = [m, *(m.get("points") or {}).values()] if hashes else []
    return m, {r.get("checkpoint", ""): _checkpoint_sha(Path(r.get("checkpoint", "")), r) for r in entries}, None


def status(cells: list[Cell]) -> dict[str, Optional[dict]]:
    """cell id -> marker of a finished cell, or None (to run)."""
    out: dict[str, Optional[dict]] = {}
    for c in cells:
        out[c.id] = finished(c, out.get(c.depends) if c.depends else None, *_facts(c))
    return out


def job(cell: Cell, done: dict, python: str) -> Job:
    """What the local runner does with ``cell`` now (``cells.next_job``), from its marker and checkpoint on disk."""
    m, _, result = _facts(cell, hashes=False) if cell.depends and not done.get(cell.id) else (None, {}, None)
    return next_job(cell, done, python, m, result, cell.checkpoint.is_file())


def _checkpoint_entry(path: Path) -> dict:
    st = path.stat()
    return {"checkpoint": str(path), "ckpt_sha256": sha256_file(path), "size": st.st_size,
            "mtime_ns": st.st_mtime_ns, "global_step": _global_step(path)}


def _global_step(path: Path) -> Optional[int]:
    """The optimizer step a Lightning checkpoint was saved at (the report's x axis for step points), read
    memory-mapped with ``weights_only=True`` as ``checkpoint_io.checkpoint_kind`` reads a run's checkpoint."""
    try:
        import torch
        return int(torch.load(path, map_location="cpu", mmap=True, weights_only=True)["global_step"])
    except Exception:  # noqa: BLE001 (not a Lightning checkpoint, e.g. a test's stand-in: the step is unknown)
        return None


def find_results(cell: Cell, sha: str, since: float = 0.0) -> Optional[Path]:
    """Newest results.json of ``cell.task`` under the cell's runs folder computed from checkpoint ``sha``."""
    found = [p for p in cell.runs.glob(f"*/{cell.kind}/{cell.task}/version_*/results.json")
             if p.stat().st_mtime >= since and (r := read_result(p)) and r.checkpoint_sha256 == sha
             and r.task == cell.task]
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


def record(cell: Cell, seconds: float = 0.0, since: float = 0.0, cpu_seconds: Optional[float] = None) -> dict:
    """Write the marker of a cell that just finished (local runner and job scripts). Raises when the cell left
    nothing to record (no checkpoint; no results.json for its checkpoint)."""
    ckpt = cell.checkpoint
    if not ckpt.is_file():
        raise FileNotFoundError(f"{cell.id}: no checkpoint at {ckpt}")
    rec = {"cell": cell.id, "key": cell.key, "kind": cell.kind, "variant": cell.variant, "seed": cell.seed,
           "task": cell.task, "point": cell.point, "seconds": round(seconds, 2),
           "cpu_seconds": None if cpu_seconds is None else round(cpu_seconds, 2),
           "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if cell.kind == PRETRAIN:
        rec.update(_checkpoint_entry(ckpt), run_dir=str(ckpt.parent.parent), points={})
        for p, path in cell.kept:
            if not path.is_file():
                raise FileNotFoundError(f"{cell.id}: the run kept no checkpoint {path} for AT point {p}")
            rec["points"][p] = _checkpoint_entry(path)
    else:
        sha = sha256_file(ckpt)
        rec.update(checkpoint=str(ckpt), ckpt_sha256=sha)
        res = find_results(cell, sha, since)
        if res is None:
            raise FileNotFoundError(f"{cell.id}: no results.json for checkpoint {sha[:12]} under "
                                    f"{cell.runs}/*/{cell.kind}/{cell.task}/")
        rec.update(results=str(res), run_dir=str(res.parent))
    atomic_json_dump(rec, cell.marker)
    return rec
