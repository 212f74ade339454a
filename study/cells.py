"""A cell of a study, resolved once when it is planned (``study.plan.plan``), and its marker.

A ``Cell`` holds everything a runner needs: its command (after the python executable), the runs folder its CLI
writes into, the checkpoint it writes or reads, its key and its marker path. The runners (``study.local``,
``study.slurm``, ``python -m study.record``) and the status read only these fields, never the spec.

A finished cell leaves a marker ``<study>/done/<cell>/<key>.json`` (written atomically) holding its key and the
sha256 of the checkpoint it made or used. A cell counts as done only when its marker exists and the checkpoint /
results.json it names still exist with that sha256: its pretraining's checkpoint, or, for an evaluation of a given
file (``--checkpoint``, no pretraining), the sha256 that file had when the study was planned.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Optional

from tokenmix.io import atomic_json_dump, sha256_file

from .points import FINAL
from .results import read_result

PRETRAIN = "pretrain"
_PATHS = ("runs", "checkpoint", "marker")


@dataclass(frozen=True)
class Cell:
    id: str
    kind: str  # pretrain | probe | analysis
    variant: str
    seed: int
    task: str = ""
    key: str = ""       # hash of everything that decides the result (study.plan)
    depends: str = ""   # id of the pretraining cell an evaluation reads
    point: str = ""     # the training point an evaluation reads (study.points; "" = the end, last.ckpt)
    args: tuple[str, ...] = ()  # the command line after the python executable: -m <module> <flags>
    runs: Path = Path(".")        # the seed's runs folder (TOKENMIX_RUNS of the cell's CLI)
    checkpoint: Path = Path(".")  # pretraining: the last.ckpt it writes; evaluation: the checkpoint it reads
    marker: Path = Path(".")      # <study>/done/<cell>/<key>.json
    kept: tuple[tuple[str, Path], ...] = ()  # pretraining: (AT point, checkpoint it keeps) beside last.ckpt
    sha256: str = ""    # evaluation of a given file (no pretraining, ``depends`` ""): the sha256 it must have

    @property
    def stage(self) -> str:
        return "pretraining" if self.kind == PRETRAIN else "evaluations"

    def command(self, python: str, resume: bool = False) -> list[str]:
        """The cell's command line; ``resume``: a pretraining goes on from its own last.ckpt."""
        return [python, *self.args] + (["--resume", str(self.checkpoint)] if resume else [])

    @property
    def env(self) -> dict[str, str]:
        """TOKENMIX_RUNS points every CLI (analysis.run has no --runs-dir flag) at the seed's runs folder."""
        return {"TOKENMIX_RUNS": str(self.runs)}

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out.update({k: str(out[k]) for k in _PATHS}, args=list(self.args),
                   kept=[[p, str(path)] for p, path in self.kept])
        return out

    @classmethod
    def from_json(cls, d: dict) -> "Cell":
        known = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        d.update({k: Path(d[k]) for k in _PATHS if k in d}, args=tuple(d.get("args", ())),
                 kept=tuple((p, Path(path)) for p, path in d.get("kept", ())))
        return cls(**d)


def read_plan(path: Path) -> list[Cell]:
    """The cells of a plan.json (``study.plan.write_plan``), as they were resolved."""
    return [Cell.from_json(c) for c in json.loads(Path(path).read_text())["cells"]]


# --------------------------------------------------------------------------- finished cells

def _read_json(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _checkpoint_sha(path: Path, marker: dict) -> Optional[str]:
    """sha256 of a checkpoint, trusting the marker's value while size and mtime are unchanged (hashing a ViT-S
    checkpoint per cell and per invocation would cost seconds each)."""
    if not path.is_file():
        return None
    st = path.stat()
    if marker.get("size") == st.st_size and marker.get("mtime_ns") == st.st_mtime_ns and marker.get("ckpt_sha256"):
        return marker["ckpt_sha256"]
    return sha256_file(path)


def done_record(cell: Cell, pre_record: Optional[dict] = None) -> Optional[dict]:
    """The cell's marker if the cell is finished for today's key (and, for an evaluation, for today's checkpoint
    ``pre_record`` of its pretraining); None otherwise."""
    m = _read_json(cell.marker)
    if not m or m.get("key") != cell.key:
        return None
    if cell.kind == PRETRAIN:
        kept = [(m.get("points") or {}).get(p) or {} for p, _ in cell.kept]
        ok = all(_checkpoint_sha(Path(r.get("checkpoint", "")), r) == r.get("ckpt_sha256") for r in [m, *kept])
        return m if ok else None
    want = cell.sha256 or point_record(pre_record or {}, cell.point).get("ckpt_sha256")
    if not want or m.get("ckpt_sha256") != want:
        return None
    res = read_result(Path(m.get("results", "")))
    return m if res and res.checkpoint_sha256 == m["ckpt_sha256"] and res.task == cell.task else None


def point_record(pre_record: dict, point: str) -> dict:
    """The checkpoint entry (path, sha256, size, mtime, global step) of one point of a pretraining marker."""
    return pre_record if point == FINAL else (pre_record.get("points") or {}).get(point) or {}


def status(cells: list[Cell]) -> dict[str, Optional[dict]]:
    """cell id -> marker of a finished cell, or None (to run)."""
    out: dict[str, Optional[dict]] = {}
    for c in cells:
        out[c.id] = done_record(c, out.get(c.depends) if c.depends else None)
    return out


def _checkpoint_entry(path: Path) -> dict:
    st = path.stat()
    return {"checkpoint": str(path), "ckpt_sha256": sha256_file(path), "size": st.st_size,
            "mtime_ns": st.st_mtime_ns, "global_step": _global_step(path)}


def _global_step(path: Path) -> Optional[int]:
    """The optimizer step a Lightning checkpoint was saved at (the report's x axis for step points)."""
    try:
        import torch
        return int(torch.load(path, map_location="cpu", mmap=True, weights_only=False)["global_step"])
    except Exception:  # not a Lightning checkpoint (a test's stand-in): the step is unknown
        return None


def find_results(cell: Cell, sha: str, since: float = 0.0) -> Optional[Path]:
    """Newest results.json of ``cell.task`` under the cell's runs folder computed from checkpoint ``sha``."""
    best = None
    for p in cell.runs.glob(f"*/{cell.kind}/{cell.task}/version_*/results.json"):
        if p.stat().st_mtime < since:
            continue
        r = read_result(p)
        if r and r.checkpoint_sha256 == sha and r.task == cell.task and (best is None or p.stat().st_mtime >
                                                                           best.stat().st_mtime):
            best = p
    return best


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
