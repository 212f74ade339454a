"""The one harness of ``make bench`` and ``make gpu-check``: timing, peak memory, the machine line, tables."""
from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import torch


# ------------------------------------------------------------------------------------------------ timing
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


# ------------------------------------------------------------------------------------------- the machine
def machine_description(device: torch.device | str | None = None) -> dict:
    """The machine as fields (``make bench``'s results.json)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    desc = {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "python": platform.python_version(),
            "torch": torch.__version__, "os": platform.platform()}
    if torch.cuda.is_available():
        desc["gpu"] = torch.cuda.get_device_name(0)
    if device is not None:
        desc["device"] = str(device)
    return desc


def machine_line(dev: torch.device) -> str:
    """The device and the versions that matter, one line (``make gpu-check``'s tables)."""
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"CPU ({platform.machine()})"
    out = [f"python {platform.python_version()}", f"torch {torch.__version__}"]
    for name in ("triton", "lightning", "timm"):
        try:
            out.append(f"{name} {__import__(name).__version__}")
        except ImportError:
            out.append(f"{name} absent")
    return f"{where}; {', '.join(out)}"


# ------------------------------------------------------------------------------------------------ tables
def _fmt_text(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def _row_cells(row: dict) -> tuple[str, object, str, object]:
    """(name, value, unit, ratio); rows without the agreed keys are shown from their own fields."""
    if "name" in row:
        return str(row["name"]), row.get("value"), str(row.get("unit", "")), row.get("ratio")
    ratio_key = next((k for k in row if k.startswith("ratio")), None)
    value_key = next((k for k, v in row.items() if isinstance(v, float) and k != ratio_key), None)
    name = ", ".join(f"{k}={v}" for k, v in row.items() if k not in (ratio_key, value_key))
    return name, row.get(value_key) if value_key else None, value_key or "", row.get(ratio_key) if ratio_key else None


def ratio_table(results: list[dict]) -> str:
    """Plain text, one line per row of every comparison: measurement, value, unit, ratio, target."""
    head = ("comparison", "measurement", "value", "unit", "ratio", "target")
    body = []
    for r in results:
        if not r.get("rows"):
            body.append((r["comparison"], r.get("error") or "no rows", "", "", "", ""))
        for row in r.get("rows", []):
            name, value, unit, ratio = _row_cells(row)
            body.append((r["comparison"], name, _fmt_text(value), unit, _fmt_text(ratio),
                         _fmt_text(row.get("target")) if "target" in row else ""))
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    line = lambda cells: "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(head), line(tuple("-" * w for w in widths)), *map(line, body)])


def _fmt_md(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e-2 and v != 0 else f"{v:,.4g}" if abs(v) < 1e5 else f"{v:,.0f}"
    if isinstance(v, (list, tuple)):
        return " / ".join(_fmt_md(x) for x in v)
    return str(v).replace("|", "/")


def _one_table(rows: list[dict]) -> str:
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k != "part" and k not in cols]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt_md(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def markdown_table(rows: list[dict]) -> str:
    """Markdown: a column per key, in the order keys first appear ('part' left out); a new table where the rows'
    kind changes (the settings they share, i.e. their first key, differ: gpu-check (d)'s compute then data rows)."""
    groups: list[list[dict]] = []
    for r in rows:
        first = next((k for k in r if k != "part"), None)
        if groups and next((k for k in groups[-1][0] if k != "part"), None) == first:
            groups[-1].append(r)
        else:
            groups.append([r])
    return "\n\n".join(_one_table(g) for g in groups)
