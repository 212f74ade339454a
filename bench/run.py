"""``make bench``: every comparison in its own subprocess, one table of ratios, bench/results.json.

Comparisons (a module ``bench/<name>.py`` with ``run(quick: bool = False) -> {"rows": [...]}``):
  attention    sparse attention (entmax-1.5, sparsemax) vs fused softmax: ViT fwd+bwd, op, peak memory
  multicrop    multi-crop uint8 pipeline vs PIL, images/s
  multicrop_batched  data.augment_on: decode-only vs full CPU workers (img/s per core), the batched augmentation
  probe_cache  probe epoch 1 vs later epochs
  dino_step    one DINO training step: plain main_dino.py-style loop vs DINOPretrainModule eager / compiled
A missing module is skipped with a note. ``--quick`` uses tiny sizes (smoke test). On a GPU machine the
comparisons measure the GPU.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
COMPARISONS = ("attention", "multicrop", "multicrop_batched", "probe_cache", "dino_step")
DEFAULT_OUT = REPO / "bench" / "results.json"
_MARK = "@@tokenmix-bench@@"
_CHILD = ("import json, sys; from bench import {name} as m; "
          "r = m.run(quick={quick}); print(); print({mark!r} + json.dumps(r, default=str))")


def machine_description(device: torch.device | str | None = None) -> dict:
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


def run_comparison(name: str, quick: bool, threads: int | None = None) -> dict:
    """One comparison in a fresh interpreter: no allocator or thread-pool state leaks between them."""
    if importlib.util.find_spec(f"bench.{name}") is None:
        return {"comparison": name, "skipped": f"bench/{name}.py not present", "rows": []}
    code = _CHILD.format(name=name, quick=bool(quick), mark=_MARK)
    env = dict(os.environ)
    if threads:  # torch reads these at start-up; the comparison's own subprocesses inherit them
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_MARK)]
    if proc.returncode != 0 or not lines:
        return {"comparison": name, "error": f"exit code {proc.returncode} (its stderr is above)", "rows": [],
                "wall_s": round(wall, 1)}
    result = json.loads(lines[-1][len(_MARK):])
    result.setdefault("comparison", name)
    result["wall_s"] = round(wall, 1)
    return result


def _fmt(v) -> str:
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


def format_table(results: list[dict]) -> str:
    head = ("comparison", "measurement", "value", "unit", "ratio", "target")
    body = []
    for r in results:
        if not r.get("rows"):
            body.append((r["comparison"], r.get("skipped") or r.get("error") or "no rows", "", "", "", ""))
        for row in r.get("rows", []):
            name, value, unit, ratio = _row_cells(row)
            body.append((r["comparison"], name, _fmt(value), unit, _fmt(ratio),
                         _fmt(row.get("target")) if "target" in row else ""))
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    line = lambda cells: "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(head), line(tuple("-" * w for w in widths)), *map(line, body)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes (smoke test, seconds)")
    p.add_argument("--only", choices=COMPARISONS, action="append", help="run only this comparison (repeatable)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads in every comparison (e.g. 1: steadier ratios on a busy machine)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help=f"results file (default {DEFAULT_OUT.relative_to(REPO)})")
    a = p.parse_args(argv)
    from tokenmix.io import atomic_json_dump

    names = a.only or list(COMPARISONS)
    machine = machine_description("cuda" if torch.cuda.is_available() else "cpu")
    if a.threads:
        machine["torch_threads"] = a.threads
    print("machine: " + ", ".join(f"{k}={v}" for k, v in machine.items()), flush=True)
    results = []
    for name in names:
        print(f"[bench] {name} ...", flush=True)
        results.append(run_comparison(name, a.quick, a.threads))
    print()
    print(format_table(results))
    print("ratio = value / baseline of the same comparison (for times lower is better); target = the issue's bound")
    atomic_json_dump({"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "quick": a.quick, "machine": machine,
                      "command": " ".join([Path(sys.executable).name, "-m", "bench.run", *(argv or sys.argv[1:])]),
                      "results": results}, a.out)
    print(f"wrote {a.out}")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
