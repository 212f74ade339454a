"""Tables and shared helpers of ``make gpu-check`` (bench/gpu_check.py): timing, peak memory, Markdown."""
from __future__ import annotations

import platform
import statistics
import time
from typing import Callable

import torch


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def peak_reset(dev: torch.device) -> int:
    """Start a peak-memory window; returns the bytes allocated now (the window's baseline)."""
    if dev.type != "cuda":
        return 0
    torch.cuda.reset_peak_memory_stats(dev)
    return torch.cuda.memory_allocated(dev)


def peak_mib(dev: torch.device, base: int = 0) -> float | None:
    return round((torch.cuda.max_memory_allocated(dev) - base) / 2 ** 20, 1) if dev.type == "cuda" else None


def time_fn(fn: Callable[[], object], dev: torch.device, warmup: int, repeats: int, budget=None) -> list[float]:
    """Wall seconds of ``repeats`` calls after ``warmup`` untimed ones; stops early when ``budget`` runs out
    (at least one timed call once the warm-up is done)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync(dev)
        t0 = time.perf_counter()
        fn()
        sync(dev)
        times.append(time.perf_counter() - t0)
        if budget is not None and budget.over():
            break
    return times


def median_ms(times: list[float]) -> float:
    return round(1e3 * statistics.median(times), 3)


def machine(dev: torch.device) -> str:
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"CPU ({platform.machine()})"
    return f"{where}; {_versions()}"


def _versions() -> str:
    out = [f"python {platform.python_version()}", f"torch {torch.__version__}"]
    for name in ("triton", "lightning", "timm"):
        try:
            out.append(f"{name} {__import__(name).__version__}")
        except ImportError:
            out.append(f"{name} absent")
    return ", ".join(out)


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e-2 and v != 0 else f"{v:,.4g}" if abs(v) < 1e5 else f"{v:,.0f}"
    if isinstance(v, (list, tuple)):
        return " / ".join(_fmt(x) for x in v)
    return str(v).replace("|", "/")


def _one_table(rows: list[dict]) -> str:
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k != "part" and k not in cols]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def part_table(rows: list[dict]) -> str:
    """Markdown: a column per key, in the order keys first appear ('part' left out); a new table where the rows'
    kind changes (the settings they share, i.e. their first key, differ: (d)'s compute then data rows)."""
    groups: list[list[dict]] = []
    for r in rows:
        first = next((k for k in r if k != "part"), None)
        if groups and next((k for k in groups[-1][0] if k != "part"), None) == first:
            groups[-1].append(r)
        else:
            groups.append([r])
    return "\n\n".join(_one_table(g) for g in groups)


def combined_table(summary: dict) -> str:
    head = [f"## make gpu-check{' --smoke (CPU rehearsal: measures nothing)' if summary['smoke'] else ''}",
            "", f"{summary['machine']}; {summary['date']}; {summary['wall_s']} s", ""]
    body = []
    for res in summary["parts"]:
        body += [f"### ({res['part']}) {res['title']} ({res['seconds']} s, budget "
                 f"{summary['budgets_s'][res['part']]} s)", "", part_table(res["rows"]), ""]
    return "\n".join(head + body).rstrip()
