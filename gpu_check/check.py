"""One call on a machine with a CUDA GPU: ``make gpu-check`` (= ``python -m gpu_check [--out DIR]``).

Parts, each with its own time budget (what a part has not reached when its budget or the whole check's runs out
is recorded as a row "skipped: budget"):
(a) the Triton entmax-1.5 / sparsemax attention kernel on the GPU against the ``entmax`` library in float64: every
    normaliser x dtype x N in {37, 197, 201, 257, 785, 1025}, peaked and flat score rows, and a one-query row (the
    [CLS]-only last block): values and q/k/v gradients; the paper's combinations first (bf16 and fp16 at 197 and
    37 tokens, entmax then sparsemax), fp32 last (``parts.kernel_plan``). A row (a) skips fails the check;
(b) the attention op alone, forward and forward+backward, bf16, B x H = 64 x 6, head dim 64: the Triton kernel
    against SDPA's flash backend: time, TFLOP/s (4 B H N^2 d forward, x 3.5 with backward, as FlashAttention
    counts) and the ratio;
(c) a ViT-S/16 training step at 224 px, batch 64, bf16-mixed: softmax vs entmax, time and peak memory;
(d) the DINO paper preset at 64 images per GPU, 16-mixed then bf16-mixed: images/s with the batch already on the
    GPU (the compute ceiling) for the transcribed main_dino.py step (``official.main_dino``, softmax, entmax) and
    ``DINOPretrainModule`` under ``Trainer.fit`` (softmax, entmax), step peak memory; images/s of the real
    ``DINOPretrainDataModule`` with 14 workers on real-size JPEGs written at the start (the data ceiling);
(e) the demo end to end: ``make pretrain`` then ``make probe TASK=voc`` (the same module commands), wall time,
    the k-NN gain and the probe's mIoU; the demo data is generated before the timed steps, a step the budget
    stops is "skipped", not an error.
A preflight first checks that every module the chosen parts import is there (``REQUIRES``), before CUDA is
touched: exit 2 naming what is missing and how to get it (``make gpu-wheels``).
Every part writes ``part_<x>.json`` and ``part_<x>.md`` into ``--out`` the moment it ends (a killed run keeps them);
the whole check writes ``gpu_check.json`` / ``gpu_check.md`` and prints the combined table last. Exit 1 when a
part failed with an error, a check failed or a row of (a) was skipped. Without a CUDA GPU: "no CUDA GPU:
skipped", exit 0.
``--smoke``: the same plan end to end on the CPU at tiny sizes (the Triton rows in Triton's interpreter,
TRITON_INTERPRET=1): checks this script, measures nothing. Run by ``make test`` (tests/test_gpu_check.py).
"""
from __future__ import annotations

import argparse
import importlib.util
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
# modules each part imports beyond torch (the GPU image lacks the .whl/ ones: Makefile GPU_WHEELS)
REQUIRES = {"a": ("triton", "entmax"), "b": ("triton",), "c": ("timm",),
            "d": ("lightning", "timm", "yaml", "PIL", "entmax"),
            "e": ("lightning", "timm", "jsonargparse", "docstring_parser", "typeshed_client", "rich", "entmax")}


def preflight(parts: str) -> list[str]:
    """The modules ``parts`` need that this interpreter cannot find (found, not imported: no CUDA yet)."""
    need = dict.fromkeys(m for p in parts for m in REQUIRES.get(p, ()))
    return [m for m in need if importlib.util.find_spec(m) is None]


def failures(results: list[dict]) -> list[dict]:
    """Rows that fail the check: an error, a check not ok, or any row of (a) skipped (an unchecked kernel
    combination is not a pass)."""
    return [r for res in results for r in res["rows"]
            if "error" in r or r.get("ok") is False or (res["part"] == "a" and "skipped" in r)]


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


def run_part(part: str, ctx: dict, seconds: float, whole_deadline: float) -> dict:
    """Part ``part``'s rows: its untimed preparation (``PREPARE``), then its rows under a budget of ``seconds``."""
    from gpu_check import dino as gpu_dino, parts as gpu_parts
    fn = {"a": gpu_parts.kernel_rows, "b": gpu_parts.op_rows, "c": gpu_parts.vit_rows,
          "d": gpu_dino.dino_rows, "e": gpu_dino.demo_rows}[part]
    prepare = {"e": gpu_dino.demo_prepare}.get(part)
    t0 = time.perf_counter()
    try:
        if prepare is not None:
            prepare(ctx)
        rows = fn(ctx, Budget(seconds, whole_deadline))
    except Exception as e:  # recorded, and the next part still runs
        traceback.print_exc()
        rows = [{"part": part, "error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}]
    return {"part": part, "title": TITLES[part], "rows": rows, "seconds": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU: checks this script, measures nothing")
    ap.add_argument("--out", type=Path, default=OUT, help=f"folder for the JSON and tables (default {OUT})")
    ap.add_argument("--parts", default=PARTS, help="subset of 'abcde' (default: all)")
    ap.add_argument("--budget", action="append", default=[], metavar="PART=SECONDS",
                    help="override a part's time budget (e.g. a=0: every row of (a) skipped, the check fails)")
    args = ap.parse_args(argv)
    missing = preflight(args.parts)
    if missing:
        print(f"gpu-check: missing modules {', '.join(missing)}: run 'make gpu-wheels' where there is network, copy "
              f".whl/ here and run 'make gpu-check PYTHON=...' (installs them into a temporary folder), or "
              f"'make install'", file=sys.stderr)
        return 2
    if args.smoke:  # before anything imports triton: the kernel rows run in Triton's interpreter on the CPU
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch
    if not args.smoke and not torch.cuda.is_available():
        print("no CUDA GPU: skipped")
        return 0
    from bench.harness import machine_line
    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cpu" if args.smoke else "cuda")
    budgets = {**(SMOKE_BUDGET if args.smoke else BUDGET),
               **{p: float(v) for p, v in (b.split("=", 1) for b in args.budget)}}
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
            res = run_part(part, ctx, budgets[part], whole)
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
    bad = failures(results)
    if bad:
        print(f"gpu-check FAILED: {len(bad)} row(s) with an error, a failed check or a skipped kernel row",
              file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
