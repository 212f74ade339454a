"""``make bench``: every comparison in its own subprocess, one table of ratios, runs/bench/results.json.

Comparisons (a module ``bench/<name>.py`` with ``run(quick: bool = False) -> {"rows": [...]}``):
  attention    sparse attention (entmax-1.5, sparsemax) vs fused softmax: ViT fwd+bwd, op, peak memory
  multicrop    multi-crop uint8 pipeline vs PIL, images/s
  multicrop_batched  data.augment_on: decode-only vs full CPU workers (img/s per core), the batched augmentation
  probe_cache  probe epoch 1 vs later epochs
  dino_step    one DINO training step: plain main_dino.py-style loop vs DINOPretrainModule eager / compiled
  label_propagation  DAVIS label propagation: the official loop vs probes/video/propagation.py, same features
``--quick`` uses tiny sizes (smoke test). On a GPU machine the comparisons measure the GPU. Timing, the machine
line and the table: ``bench.harness``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.harness import machine_description, ratio_table

REPO = Path(__file__).resolve().parents[1]
COMPARISONS = ("attention", "multicrop", "multicrop_batched", "probe_cache", "dino_step", "label_propagation")
DEFAULT_OUT = REPO / "runs" / "bench" / "results.json"  # generated: git-ignored
_MARK = "@@tokenmix-bench@@"
_CHILD = ("import json, sys; from bench import {name} as m; "
          "r = m.run(quick={quick}); print(); print({mark!r} + json.dumps(r, default=str))")


def run_comparison(name: str, quick: bool, threads: int | None = None) -> dict:
    """One comparison in a fresh interpreter: no allocator or thread-pool state leaks between them."""
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
    print(ratio_table(results))
    print("ratio = value / baseline of the same comparison (for times lower is better); target = the bound to meet")
    atomic_json_dump({"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "quick": a.quick, "machine": machine,
                      "command": " ".join([Path(sys.executable).name, "-m", "bench.run", *(argv or sys.argv[1:])]),
                      "results": results}, a.out)
    print(f"wrote {a.out}")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
