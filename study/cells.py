"""A cell of a study, resolved once when it is planned (``study.plan.plan``), and the decisions about it: pure
functions of the cell and of the facts ``study.store`` read; nothing here touches a file.

A ``Cell`` holds everything a runner needs: its command (after the python executable), the runs folder its CLI
writes into, the checkpoint it writes or reads, its key and its marker path; the runners and the status read only
these fields, never the spec. ``finished`` accepts a cell's marker only when the checkpoint / results.json it names
still have its sha256: its pretraining's checkpoint, or, for an evaluation of a given file (``--checkpoint``), the
sha256 that file had when the study was planned. ``next_job`` says what the local runner does with a cell.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Optional

from .points import FINAL

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


def point_record(pre_record: dict, point: str) -> dict:
    """The checkpoint entry (path, sha256, size, mtime, global step) of one point of a pretraining marker."""
    return pre_record if point == FINAL else (pre_record.get("points") or {}).get(point) or {}


def finished(cell: Cell, pre_record: Optional[dict], marker: Optional[dict], shas: dict, result) -> Optional[dict]:
    """The marker if it proves the cell finished for today's key (and an evaluation, for today's checkpoint of its
    pretraining ``pre_record``), else None. ``shas``: checkpoint path -> sha256 today; ``result``: the marker's."""
    if not marker or marker.get("key") != cell.key:
        return None
    if cell.kind == PRETRAIN:
        kept = [(marker.get("points") or {}).get(p) or {} for p, _ in cell.kept]
        ok = all(shas.get(r.get("checkpoint", "")) == r.get("ckpt_sha256") for r in [marker, *kept])
        return marker if ok else None
    want = cell.sha256 or point_record(pre_record or {}, cell.point).get("ckpt_sha256")
    if not want or marker.get("ckpt_sha256") != want:
        return None
    return marker if result and result.checkpoint_sha256 == want and result.task == cell.task else None


@dataclass(frozen=True)
class Job:
    """What the local runner does with a cell: nothing (``record``: finished; ``reused``: found finished only now),
    report why not (``skip``), or run ``command`` with ``env`` (``resume``: from its own last.ckpt)."""
    cell: Cell
    stage: str
    record: Optional[dict] = None
    reused: bool = False
    skip: str = ""
    command: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    resume: bool = False


def next_job(cell: Cell, done: dict, python: str, marker: Optional[dict], result, checkpoint_there: bool) -> Job:
    """The cell's job given ``done`` (cell id -> marker) and what the store read: the marker and result of an
    evaluation whose pretraining was recorded again in this run (they may still hold); its checkpoint's presence."""
    rec, pre = done.get(cell.id), done.get(cell.depends) if cell.depends else None
    if rec or pre and (rec := finished(cell, pre, marker, {}, result)):
        return Job(cell, cell.stage, record=rec, reused=not done.get(cell.id))
    if cell.depends and not pre:
        return Job(cell, cell.stage, skip=f"skipped: {cell.depends} did not finish")
    resume = cell.kind == PRETRAIN and checkpoint_there
    return Job(cell, cell.stage, command=tuple(cell.command(python, resume)), env=tuple(cell.env.items()),
               resume=resume)
