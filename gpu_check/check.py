"""One call on a machine with a CUDA GPU: ``make gpu-check`` (= ``python -m gpu_check [--out DIR]``).

Parts, each with its own time budget (what a part has not reached when its budget or the whole check's runs out
is recorded as a row "skipped: budget"):
(a) the Triton entmax-1.5 / sparsemax attention kernel on the GPU against the ``entmax`` library in float64: every
    normaliser x dtype x N in {37, 197, 201, 257, 785, 1025}, peaked and flat score rows, and a one-query row (the
    [CLS]-only last block): values and q/k/v gradients;
(b) the attention op alone, forward and forward+backward, bf16, B x H = 64 x 6, head dim 64: the Triton kernel
    against SDPA's flash backend: time, TFLOP/s (4 B H N^2 d forward, x 3.5 with backward, as FlashAttention
    counts) and the ratio;
(c) a ViT-S/16 training step at 224 px, batch 64, bf16-mixed: softmax vs entmax, time and peak memory;
(d) the DINO paper preset at 64 images per GPU, bf16-mixed and 16-mixed: images/s with the batch already on the
    GPU (the compute ceiling) for the transcribed main_dino.py step (``official.main_dino``, softmax) and
    ``DINOPretrainModule`` under ``Trainer.fit`` (softmax, entmax), step peak memory; images/s of the real
    ``DINOPretrainDataModule`` with 14 workers on real-size JPEGs written at the start (the data ceiling);
(e) the demo end to end: ``make pretrain`` then ``make probe TASK=voc`` (the same module commands), wall time,
    the k-NN gain and the probe's mIoU.
Every part writes ``part_<x>.json`` and ``part_<x>.md`` into ``--out`` the moment it ends (a killed run keeps them);
the whole check writes ``gpu_check.json`` / ``gpu_check.md`` and prints the combined table last. Exit 1 when a
part failed with an error or a kernel check failed. Without a CUDA GPU: "no CUDA GPU: skipped", exit 0.
``--smoke``: the same plan end to end on the CPU at tiny sizes (the Triton rows in Triton's interpreter,
TRITON_INTERPRET=1): checks this script, measures nothing. Run by ``make test`` (tests/test_gpu_check.py).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "runs" / "gpu-check"
PARTS = "abcde"
TITLES = {"a": "kernel correctness", "b": "attention op vs SDPA flash", "c": "ViT-S/16 step, bf16-mixed",
          "d": "DINO paper preset, 64 img/GPU", "e": "demo end to end"}
# seconds per part on one H200 (whole check <= 8 min including start-up); --smoke: on 2 CPU cores
BUDGET = {"a": 60, "b": 35, "c": 45, "d": 170, "e": 140}
SMOKE_BUDGET = {"a": 90, "b": 40, "c": 40, "d": 150, "e": 240}  # generous: a loaded 2-core CI machine
TOTAL = {"full": 470, "smoke": 560}


class Budget:
    """Seconds left for a part: its own budget, capped by what is left of the whole check."""

    def __init__(self, seconds: float, whole_deadline: float):
        self.deadline = min(time.monotonic() + seconds, whole_deadline)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def over(self) -> bool:
        return self.left() <= 0


def skipped(part: str, what: dict, reason: str = "budget") -> dict:
    return {"part": part, **what, "skipped": reason}


def write_part(out: Path, part: str, result: dict) -> None:
    """``part_<x>.json`` + ``part_<x>.md``, each written to a temporary name then renamed (never half a file)."""
    from bench.harness import markdown_table
    for name, text in ((f"part_{part}.json", json.dumps(result, indent=1) + "\n"),
                       (f"part_{part}.md", f"### ({part}) {TITLES[part]}\n\n{markdown_table(result['rows'])}\n")):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, out / name)


def combined_table(summary: dict) -> str:
    from bench.harness import markdown_table
    head = [f"## make gpu-check{' --smoke (CPU rehearsal: measures nothing)' if summary['smoke'] else ''}",
            "", f"{summary['machine']}; {summary['date']}; {summary['wall_s']} s", ""]
    body = []
    for res in summary["parts"]:
        body += [f"### ({res['part']}) {res['title']} ({res['seconds']} s, budget "
                 f"{summary['budgets_s'][res['part']]} s)", "", markdown_table(res["rows"]), ""]
    return "\n".join(head + body).rstrip()


def run_part(part: str, ctx: dict, budget: Budget) -> dict:
    from gpu_check import dino as gpu_dino, parts as gpu_parts
    fn = {"a": gpu_parts.kernel_rows, "b": gpu_parts.op_rows, "c": gpu_parts.vit_rows,
          "d": gpu_dino.dino_rows, "e": gpu_dino.demo_rows}[part]
    t0 = time.perf_counter()
    try:
        rows = fn(ctx, budget)
    except Exception as e:  # recorded, and the next part still runs
        traceback.print_exc()
        rows = [{"part": part, "error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}]
    return {"part": part, "title": TITLES[part], "rows": rows, "seconds": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU: checks this script, measures nothing")
    ap.add_argument("--out", type=Path, default=OUT, help=f"folder for the JSON and tables (default {OUT})")
    ap.add_argument("--parts", default=PARTS, help="subset of 'abcde' (default: all)")
    args = ap.parse_args(argv)
    if args.smoke:  # before anything imports triton: the kernel rows run in Triton's interpreter on the CPU
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch
    if not args.smoke and not torch.cuda.is_available():
        print("no CUDA GPU: skipped")
        return 0
    from bench.harness import machine_line
    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cpu" if args.smoke else "cuda")
    budgets = SMOKE_BUDGET if args.smoke else BUDGET
    whole = time.monotonic() + TOTAL["smoke" if args.smoke else "full"]
    ctx = {"dev": dev, "smoke": args.smoke, "out": args.out}
    t0 = time.perf_counter()
    results = []
    for part in PARTS:
        if part not in args.parts:
            continue
        if time.monotonic() >= whole:
            res = {"part": part, "title": TITLES[part], "rows": [skipped(part, {})], "seconds": 0.0}
        else:
            res = run_part(part, ctx, Budget(budgets[part], whole))
        write_part(args.out, part, res)
        results.append(res)
        print(f"part ({part}) {TITLES[part]}: {res['seconds']} s -> {args.out / f'part_{part}.json'}", flush=True)
    summary = {"machine": machine_line(dev), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "smoke": args.smoke, "budgets_s": budgets, "parts": results,
               "wall_s": round(time.perf_counter() - t0, 1)}
    table = combined_table(summary)
    (args.out / "gpu_check.json").write_text(json.dumps(summary, indent=1) + "\n")
    (args.out / "gpu_check.md").write_text(table + "\n")
    print(table)
    bad = [r for res in results for r in res["rows"] if "error" in r or r.get("ok") is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
