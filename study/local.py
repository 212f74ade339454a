"""Run a study's missing cells here, one subprocess at a time, in dependency order: for each, the store reads the
disk and the cell decides (``store.job``); a run logs to ``<logs>/<cell>.log``, then the store writes its marker. A
failed pretraining skips its evaluations; an interrupted one resumes from its own last.ckpt next time.
"""
from __future__ import annotations

import os
import resource
import subprocess
import time
from pathlib import Path
from typing import Optional

from tokenmix import paths

from . import store
from .cells import Cell, Job
from .progress import Progress


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def run_job(job: Job, progress: Progress, logs: Path) -> tuple[Optional[dict], float, Path]:
    """Run one cell's command, then record its marker; (the marker, or None when it failed; seconds; log file)."""
    log = logs / f"{job.cell.id}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    progress.started(job.cell.id + (" (resuming)" if job.resume else ""))
    since, t0 = time.time() - 1, time.monotonic()
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log, "a") as f:
        f.write(f"\n# {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(job.command)}\n")
        f.flush()
        proc = subprocess.Popen(job.command, stdout=f, stderr=subprocess.STDOUT, cwd=paths.REPO,
                                env={**os.environ, **dict(job.env)})
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
            rec = store.record(job.cell, seconds, since=since, cpu_seconds=cpu)
        except FileNotFoundError as e:
            with open(log, "a") as f:
                f.write(f"[study] {e}\n")
    progress.finished(job.stage, seconds, rec is not None)
    return rec, seconds, log


def run_missing(cells: list[Cell], done: dict, python: str, progress: Progress, logs: Path,
                board=None) -> list[tuple[str, str]]:
    """Run every cell without a marker whose pretraining is done; returns [(cell id, reason)] of failures."""
    failures = []
    for job in (store.job(c, done, python) for c in cells):
        cid = job.cell.id
        if job.record or job.skip:
            done[cid] = job.record
            if job.reused:
                progress.reused(job.stage)
            failures += [(cid, job.skip)] if job.skip else []
            continue
        rec, seconds, log = run_job(job, progress, logs)
        if board is not None:
            board.progress(progress.done)
        done[cid] = rec
        if not rec:
            failures.append((cid, f"failed after {seconds:.0f}s; log {log}:\n{_tail(log)}"))
            print(f"[study] {cid} failed (log: {log}):\n{_tail(log)}", flush=True)
    return failures
