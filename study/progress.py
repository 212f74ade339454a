"""Progress of a study: one live line per stage, and the study's own TensorBoard run.

    [study] pretraining 3/4, evaluations 0/12 | running pretrain.entmax.seed1 | elapsed 1m05s, ETA 4m30s

The ETA is each stage's mean finished-cell duration times its cells left; a stage with none finished adds
nothing and the ETA is marked '≥' (an evaluation may take a tenth of a pretraining or as long: no borrowing).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional


def fmt_seconds(s: float) -> str:
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")


class Progress:
    STAGES = ("pretraining", "evaluations")

    def __init__(self, totals: dict[str, int], done: dict[str, int], stream=None):
        self.totals, self.done = dict(totals), dict(done)
        self.durations: dict[str, list[float]] = {s: [] for s in self.STAGES}
        self.failed = 0
        self.start = time.monotonic()
        self.stream = stream or sys.stderr
        self.live = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.current = ""

    def eta(self) -> Optional[str]:
        total, bound = 0.0, False
        means = {s: sum(d) / len(d) for s, d in self.durations.items() if d}
        for s in self.STAGES:
            left = self.totals.get(s, 0) - self.done.get(s, 0)
            if left <= 0:
                continue
            if s in means:
                total += left * means[s]
            elif means:
                bound = True
            else:
                return None
        return ("≥" if bound else "") + fmt_seconds(total)

    def line(self) -> str:
        stages = ", ".join(f"{s} {self.done.get(s, 0)}/{self.totals.get(s, 0)}" for s in self.STAGES)
        run = f" | running {self.current}" if self.current else ""
        fail = f" | {self.failed} failed" if self.failed else ""
        eta = self.eta()
        return (f"[study] {stages}{run}{fail} | elapsed {fmt_seconds(time.monotonic() - self.start)}"
                f"{', ETA ' + eta if eta else ''}")

    def show(self, final: bool = False) -> None:
        if self.live:
            self.stream.write("\r\033[K" + self.line() + ("\n" if final else ""))
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def tick(self) -> None:
        """Called about once a second while a cell runs: redraws the line on a terminal only."""
        if self.live:
            self.show()

    def started(self, cell_id: str) -> None:
        self.current = cell_id
        self.show()

    def reused(self, stage: str) -> None:
        """A cell found finished after all (its results hold for a checkpoint recorded again): counted, not timed."""
        self.done[stage] = self.done.get(stage, 0) + 1
        self.show()

    def finished(self, stage: str, seconds: float, ok: bool) -> None:
        self.current = ""
        if ok:
            self.done[stage] = self.done.get(stage, 0) + 1
            self.durations[stage].append(seconds)
        else:
            self.failed += 1
        self.show()


class StudyBoard:
    """The study's TensorBoard run (<study>/tensorboard): progress scalars, then per-variant cell means, every
    seed's value and a table linking cells to run folders; each invocation replaces the previous events."""

    def __init__(self, folder: Path):
        from torch.utils.tensorboard import SummaryWriter
        for old in Path(folder).glob("events.out.tfevents.*"):  # one invocation's view; the cells keep their own
            old.unlink()
        self.w = SummaryWriter(log_dir=str(folder))
        self.step = 0

    def progress(self, done: dict[str, int]) -> None:
        self.step += 1
        for stage, n in done.items():
            self.w.add_scalar(f"progress/{stage}_done", n, self.step)
        self.w.flush()

    def results(self, table, root: Path) -> None:
        for (variant, key), s in table.summaries.items():
            self.w.add_scalar(f"{key}/mean/{variant}", s.mean, s.n)
            for seed, value, _ in table.values[(variant, key)]:
                self.w.add_scalar(f"{key}/seeds/{variant}", value, seed)
        for (variant, key), curve in table.curves.items():  # AT: the mean over seeds per % of the schedule
            for point, vals in curve.items():
                x = table.progress.get(point)
                if len(table.points) > 1 and x is not None and vals:
                    self.w.add_scalar(f"{key}/curve/{variant}", sum(v for _, v in vals) / len(vals), round(x))
        rows = ["| cell | run folder | checkpoint |", "|---|---|---|"]
        for cid, rd, sha in table.cells:
            rel = Path(rd).relative_to(root) if rd and Path(rd).is_relative_to(root) else rd
            rows.append(f"| {cid} | {rel} | {sha[:12]} |")
        self.w.add_text("study/cells", "\n".join(rows), 0)
        self.w.flush()

    def close(self) -> None:
        self.w.close()
