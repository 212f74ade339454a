"""Run a study's missing cells here, one subprocess at a time, in dependency order.

Each cell's output goes to ``<logs>/<cell>.log``; a finished cell writes its marker (``cells.record``). A
failed pretraining skips its evaluations and the study goes on with the others; the call returns the failures.
An interrupted pretraining resumes from its own last.ckpt (the pretraining CLI's ``--resume``) on the next call.
"""
from __future__ import annotations

import os
import resource
import subprocess
import time
from pathlib import Path
from typing import Optional

from tokenmix import paths

from .cells import PRETRAIN, Cell, done_record, record
from .progress import Progress


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def run_cell(cell: Cell, python: str, progress: Progress, logs: Path) -> tuple[Optional[dict], float, Path]:
    """Run one cell; (its marker, or None when it failed; seconds; log file)."""
    resume = cell.kind == PRETRAIN and cell.checkpoint.is_file()
    cmd = cell.command(python, resume=resume)
    log = logs / f"{cell.id}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    progress.started(cell.id + (" (resuming)" if resume else ""))
    since, t0 = time.time() - 1, time.monotonic()
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log, "a") as f:
        f.write(f"\n# {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=paths.REPO,
                                env={**os.environ, **cell.env})
        try:
            while proc.poll() is None:
                time.sleep(1)
                progress.tick()
        except BaseException:  # Ctrl-C / kill of the study: do not leave the cell running on its own
            proc.terminate()
            proc.wait()
            raise
    seconds = time.monotonic() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the cell's own CPU time: a measure contention leaves alone
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    rec = None
    if proc.returncode == 0:
        try:
            rec = record(cell, seconds, since=since, cpu_seconds=cpu)
        except FileNotFoundError as e:
            with open(log, "a") as f:
                f.write(f"[study] {e}\n")
    progress.finished(cell.stage, seconds, rec is not None)
    return rec, seconds, log


def run_missing(cells: list[Cell], done: dict, python: str, progress: Progress, logs: Path,
                board=None) -> list[tuple[str, str]]:
    """Run every cell without a marker whose pretraining is done; returns [(cell id, reason)] of failures."""
    failures = []
    for c in cells:
        if not done.get(c.id) and c.depends and done.get(c.depends):
            # its pretraining was recorded again in this run (a lost marker, a requeue): its results may hold
            done[c.id] = done_record(c, done[c.depends])
            if done[c.id]:
                progress.reused(c.stage)
        if done.get(c.id):
            continue
        if c.depends and not done.get(c.depends):
            failures.append((c.id, f"skipped: {c.depends} did not finish"))
            continue
        rec, seconds, log = run_cell(c, python, progress, logs)
        if board is not None:
            board.progress(progress.done)
        if rec:
            done[c.id] = rec
        else:
            failures.append((c.id, f"failed after {seconds:.0f}s; log {log}:\n{_tail(log)}"))
            print(f"[study] {c.id} failed (log: {log}):\n{_tail(log)}", flush=True)
    return failures
