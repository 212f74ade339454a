"""Static compile report of the Triton attention kernels, without a GPU: resources, SASS mix, predicted time.

```
make kernel-report ARGS="--target sm_90 --json out.json"    # = python -m kernel_model; every N x dtype x normaliser
python -m kernel_model --n 197 --dtype bf16 --kind entmax15 --passes 3
python -m kernel_model --alu        # the ALU pipe in the model's max as well
python -m kernel_model --passes-from passes.json --source vit   # passes measured by kernel_model.threshold_passes
python -m kernel_model --deterministic   # the atomic-free backward (torch's deterministic mode)
```

For each kernel that ``backbones.triton_plan.kernel_launches`` says a call launches (block sizes, warps, stages and
grid as the launcher picks them), for N in {37, 197, 201, 257, 785, 1025}, fp16/bf16/fp32, entmax-1.5 and
sparsemax, forward and backward: compile for the target (``kernel_model.compiler``), record registers, spill
bytes, shared memory, wgmma / mma.sync in the PTX and the SASS counts (``kernel_model.sass``). Then the same for
the FlashAttention-2 yardstick (``kernel_model.flash_yardstick``) and, on sm_90, the H200 cost model
(``kernel_model.cost_model``): predicted entmax / flash time ratios for forward, backward and forward + backward.

Counts are static SASS, one per instruction of the listing, multiplied by the trip counts of the loops around it
(``kernel_model.loop_trips``: ``for ... in range`` bounds evaluated with the launch's N and constexprs; ``while``
loops, the data-dependent threshold passes, run ``--passes`` times (or, with ``--passes-from``, the mean per 64-row
program that ``kernel_model.threshold_passes`` measured for that N, path and source); loops ptxas unrolled, trips /
unroll; loops are the natural loops of the SASS control-flow graph, ``kernel_model.sass_loops``). Both sides of
every branch are counted (the all-zero-tile skips never skip). Table counts are per program (CTA) and per warp; the
JSON also has the flat static counts. Launches whose name contains "bwd" are the backward;
``kernel_launches(need_grad=False)`` is the forward.
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
from pathlib import Path

import torch

from backbones.triton_plan import kernel_launches
from kernel_model import cost_model, loop_trips, sass, sass_loops
from kernel_model.compiler import TARGETS, compile_many, loops_of

NS = (37, 197, 201, 257, 785, 1025)
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
KINDS = ("entmax15", "sparsemax")
SHARED_LIMIT = {"sm_90": 227 * 1024, "sm_80": 163 * 1024}  # opt-in per block: H100/H200, A100
HEAD_DIM, BH = 64, 384  # the paper preset's op: ViT-S heads, B*H = 64 images x 6 heads
RATIO_TARGET, RATIO_NS = 1.3, (197, 785)  # predicted fwd+bwd / flash yardstick at ViT-S/16's 224 and 448 px, 16-bit


def _is_bwd(name: str) -> bool:
    return "bwd" in name or "backward" in name


def _scalars(launch, n: int, m: int) -> dict:
    """Values of the launch's integer arguments: its own ``scalars`` if it has them, else N = queries, M = keys."""
    given = getattr(launch, "scalars", None)
    return dict(given) if given else {k: v for k, v in (("N", n), ("M", m)) if k in launch.signature}


def loop_weights(rec: dict, kernel_ns: dict, passes: float) -> tuple[dict, list]:
    """addr -> product of the trip counts of the SASS loops around it (0 where no path from the entry reaches);
    and each loop's description."""
    weights, described = {}, []
    addrs = [x[0] for x in rec["instrs"]]
    for lp in loops_of(rec):
        chain = tuple(tuple(x) for x in lp["chain"])
        hit = loop_trips.match(chain)
        if hit is None:
            trips, how, line = 1.0, "unresolved: no source loop for its back edge", None
        else:
            src, depth = hit
            trips, how = loop_trips.trip_count(src, chain, depth, kernel_ns, passes)
            line = f"{Path(src.file).name}:{src.lineno}"
        if lp.get("unroll", 1) > 1:  # ptxas unrolled it: the body holds u iterations (remainder copies: once)
            trips, how = trips / lp["unroll"], f"{how}, unrolled x{lp['unroll']} by ptxas"
        described.append(dict(start=lp["start"], end=lp["end"], source=line, trips=trips, how=how))
        for a in addrs:
            if sass_loops.in_loop(a, lp):
                weights[a] = weights.get(a, 1.0) * trips
    weights.update(dict.fromkeys(sass_loops.unreachable([sass.Instr(*x) for x in rec["instrs"]]), 0.0))
    return weights, described


def analyse(launch, rec: dict, n: int, m: int, passes: float, alu: bool = False) -> dict:
    """One kernel's row: resources, static and loop-weighted per-program SASS counts, the cost model."""
    row = dict(kernel=launch.name, num_warps=launch.num_warps, num_stages=launch.num_stages,
               programs=launch.programs, constexprs={k: repr(v) for k, v in launch.constexprs.items()})
    if "error" in rec:
        return dict(row, error=rec["error"])
    instrs = [sass.Instr(*x) for x in rec["instrs"]]
    static, _ = sass.weighted_counts(instrs, {})
    ns = {**launch.constexprs, **_scalars(launch, n, m)}
    weights, loops = loop_weights(rec, ns, passes)
    counts, macs = sass.weighted_counts(instrs, weights)
    cyc = cost_model.program_cycles(counts, macs, launch.num_warps, alu)
    scores = BH * n * m
    return dict(row, **{k: rec[k] for k in ("registers", "spill_stores", "spill_loads", "stack", "shared",
                                             "shared_static", "ptx_wgmma", "ptx_mma_sync")},
                static={k: int(static.get(k, 0)) for k in sass.COUNTERS},
                per_program={k: round(counts.get(k, 0), 1) for k in sass.COUNTERS},
                thread_ops_per_score={k: round(counts.get(k, 0) * launch.programs * launch.num_warps * 32 / scores, 3)
                                      for k in ("FFMA", "FMUL", "FADD", "MUFU", "ALU")},
                macs_per_program={k: v for k, v in macs.items()}, loops=loops, cycles=cyc,
                time_us=cost_model.kernel_time_us(cyc["cycles"], launch.programs))


def _launches(plan_fn, impl, n, dtype, kind, target) -> list[tuple]:
    """(row labels, launch) of the training plan (need_grad=True) and of the inference plan (forward only), with
    the target's blocks where the plan depends on the GPU (``arch``)."""
    out = []
    arch = dict(arch=int(target[3:])) if "arch" in inspect.signature(plan_fn).parameters else {}
    for phase, grad in (("train", True), ("inference", False)):
        for launch in plan_fn(n, DTYPES[dtype], kind=kind, head_dim=HEAD_DIM, bh=BH, need_grad=grad, **arch):
            out.append((dict(impl=impl, phase=phase, n=n, dtype=dtype, kind=kind), launch))
    return out


def times(rows: list[dict]) -> dict:
    """Predicted µs: fwd (need_grad=False plan), bwd (the "bwd" launches), fwd+bwd (the need_grad=True plan)."""
    t = lambda rs: sum(r.get("time_us", float("nan")) for r in rs)  # noqa: E731
    train = [r for r in rows if r["phase"] == "train"]
    return dict(fwd=t([r for r in rows if r["phase"] == "inference"]),
                bwd=t([r for r in train if _is_bwd(r["kernel"])]), total=t(train))


def report(target: str, combos, passes: float, cache: bool = True, jobs: int = 1, yardstick: bool = True,
           alu: bool = False) -> dict:
    """Rows for every (n, dtype, kind) in combos (and the yardstick at each (n, dtype)), and on every
    (n, dtype, kind) the predicted entmax / flash ratios."""
    from kernel_model import flash_yardstick
    todo = [x for n, dt, kind in combos for x in _launches(kernel_launches, "entmax", n, dt, kind, target)]
    if yardstick:
        for n, dt in dict.fromkeys((n, dt) for n, dt, _ in combos):
            todo += _launches(flash_yardstick.kernel_launches, "flash", n, dt, "softmax", target)
    recs = compile_many([(lp, target, _scalars(lp, lab["n"], lab["n"])) for lab, lp in todo], cache, jobs)
    per = passes if callable(passes) else (lambda n, launch: passes)  # noqa: E731
    kernels = [dict(analyse(lp, rec, lab["n"], lab["n"], per(lab["n"], lp), alu), **lab)
               for (lab, lp), rec in zip(todo, recs)]
    ratios = []
    for n, dt, kind in combos if yardstick else ():
        te, tf = (times([r for r in kernels if (r["impl"], r["n"], r["dtype"], r["kind"]) == (impl, n, dt, k)])
                  for impl, k in (("entmax", kind), ("flash", "softmax")))
        ratios.append(dict(kind=kind, dtype=dt, n=n, entmax_us=te, flash_us=tf, ratio={k: te[k] / tf[k] for k in te}))
    return dict(target=target, module="backbones.triton_plan",
                passes=getattr(passes, "description", passes), alu_in_max=alu,
                fp32_matmul_precision=torch.get_float32_matmul_precision(),
                deterministic=torch.are_deterministic_algorithms_enabled(),  # the backward's path (atomics or not)
                model=dict(sms=cost_model.SMS, clock_hz=cost_model.CLOCK_HZ, tensor_rate=cost_model.TENSOR_RATE,
                           fma_lanes=cost_model.FMA_LANES, mufu_lanes=cost_model.MUFU_LANES,
                           alu_lanes=cost_model.ALU_LANES), head_dim=HEAD_DIM, bh=BH,
                shared_limit=SHARED_LIMIT[target], kernels=kernels, ratios=ratios)


def measured_passes(path: str, source: str, default: float):
    """passes(n, launch) from ``kernel_model.threshold_passes --json``: the mean per 64-row program measured on
    ``source``'s logits at that N on the launch's path (register tile or block-wise); ``default`` where that N
    was not measured."""
    rows = [r for r in json.loads(Path(path).read_text()) if r["source"] == source]
    if not rows:
        raise SystemExit(f"{path}: no rows for source '{source}'")
    means = {(r["n"], r["path"]): r["tile_mean"] for r in rows}

    def passes(n: int, launch) -> float:
        return means.get((n, "single" if launch.constexprs.get("SINGLE") else "block"), default)
    passes.description = f"per 64-row program, measured ({source}: " + ", ".join(
        f"N={n} {p} {v:g}" for (n, p), v in sorted(means.items())) + f"; else {default:g})"
    return passes


def _bound(c: dict) -> str:
    """The binding pipe; flagged when the ALU bound (not in the model's max) would exceed it."""
    return c["bound"] + (f" (alu {c['alu'] / c['cycles']:.1f}x)" if c["alu"] > c["cycles"] > 0 else "")


def _kb(b: int) -> str:
    return f"{b / 1024:.0f}"


def markdown(rep: dict) -> str:
    """The kernel table (train-phase launches; per program, per warp, loop-weighted) and, on sm_90, the ratios."""
    cols = ("HGMMA", "HMMA", "FFMA", "FMUL", "FADD", "MUFU", "ALU", "LDS", "STS", "BAR")
    lines = [f"Static compile report, {rep['target']}, head dim {rep['head_dim']}, B·H = {rep['bh']}, "
             f"threshold passes: {rep['passes']}; model: max(tensor, FMA, MUFU"
             f"{', ALU' if rep.get('alu_in_max') else ''}) cycles", "",
             "| impl | kind | dtype | N | kernel | warps/stages | programs | regs | spill B | smem KB | tensor cores | "
             + " | ".join(cols) + " | bound | µs |", "|" + "---|" * (16 + len(cols))]
    for r in rep["kernels"]:
        if r["phase"] != "train":
            continue
        head = f"| {r['impl']} | {r['kind']} | {r['dtype']} | {r['n']} | {r['kernel']} | "
        if "error" in r:
            lines.append(head + f"compile error: {r['error'].splitlines()[0][:120]} |")
            continue
        tc = "wgmma" if r["ptx_wgmma"] else "mma.sync" if r["ptx_mma_sync"] else "none"
        pp = r["per_program"]
        lines.append(head + f"{r['num_warps']}/{r['num_stages']} | {r['programs']} | {r['registers']} | "
                     f"{r['spill_stores']}/{r['spill_loads']} | {_kb(r['shared'])} | {tc} | "
                     + " | ".join(f"{pp[c]:g}" for c in cols) + f" | {_bound(r['cycles'])} | {r['time_us']:.1f} |")
    if rep["target"] == "sm_90":
        lines += ["", "Predicted time on one H200 (µs) and entmax / flash-yardstick ratio:", "",
                  "| kind | dtype | N | entmax fwd | bwd | fwd+bwd | flash fwd | bwd | fwd+bwd "
                  "| ratio fwd | bwd | fwd+bwd |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for q in rep["ratios"]:
            e, f, x = q["entmax_us"], q["flash_us"], q["ratio"]
            lines.append(f"| {q['kind']} | {q['dtype']} | {q['n']} | {e['fwd']:.1f} | {e['bwd']:.1f} | "
                         f"{e['total']:.1f} | {f['fwd']:.1f} | {f['bwd']:.1f} | {f['total']:.1f} | "
                         f"{x['fwd']:.2f} | {x['bwd']:.2f} | {x['total']:.2f} |")
    return "\n".join(lines)


def problems(rep: dict) -> list[str]:
    """The report's checks: compiles, no 16-bit spill, shared memory within the target's limit, wgmma on sm_90, every
    loop's trip count resolved, and (sm_90, 16-bit, N = 197 and 785) the predicted fwd+bwd ratio to the
    yardstick at most 1.3."""
    out = []
    for r in rep["kernels"]:
        tag = f"{r['impl']} {r['kind']} {r['dtype']} N={r['n']} {r['kernel']}"
        if "error" in r:
            out.append(f"{tag}: does not compile")
            continue
        if r["dtype"] != "fp32" and r["spill_stores"] + r["spill_loads"] > 0:
            out.append(f"{tag}: spills {r['spill_stores']}/{r['spill_loads']} B")
        if r["shared"] > rep["shared_limit"]:
            out.append(f"{tag}: {r['shared']} B shared > {rep['shared_limit']}")
        if rep["target"] == "sm_90" and r["dtype"] != "fp32" and r["static"]["HMMA"]:
            out.append(f"{tag}: mma.sync (HMMA) instead of wgmma")
        # a loop counted once whatever its trips (Triton 3.6's line info has no inlining call sites, so a bound
        # passed into a helper is unknown): its time is not predicted
        for lp in r.get("loops", []):
            if lp["how"].startswith("unresolved"):
                out.append(f"{tag}: loop at {lp['source']} has an unresolved trip count, counted once")
    for q in rep.get("ratios", []):  # the 1.3x target, on the H200 model
        if rep["target"] == "sm_90" and q["dtype"] != "fp32" and q["n"] in RATIO_NS and \
                not q["ratio"]["total"] <= RATIO_TARGET:
            out.append(f"{q['kind']} {q['dtype']} N={q['n']}: predicted fwd+bwd {q['ratio']['total']:.2f}x the flash "
                       f"yardstick > {RATIO_TARGET}")
    return sorted(set(out))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", choices=sorted(TARGETS), default="sm_90")
    ap.add_argument("--json", help="write the whole report (every kernel, loops, counts) here")
    ap.add_argument("--n", type=int, action="append", help=f"token count (repeatable; default {NS})")
    ap.add_argument("--dtype", choices=sorted(DTYPES), action="append", help="repeatable; default all three")
    ap.add_argument("--kind", choices=KINDS, action="append", help="repeatable; default both")
    ap.add_argument("--passes", type=float, default=3.0, help="trip count of data-dependent while loops")
    ap.add_argument("--passes-from", help="kernel_model.threshold_passes --json output: its per-program means instead")
    ap.add_argument("--source", default="vit", help="with --passes-from: whose logits (vit, gauss-1, gauss-3, ...)")
    ap.add_argument("--alu", action="store_true", help="put the ALU pipe (64 lanes/SM/clk) in the model's max too")
    ap.add_argument("--no-cache", action="store_true", help="recompile everything (cache: build/kernel_report)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiler processes (default: all cores)")
    ap.add_argument("--deterministic", action="store_true",
                    help="torch.use_deterministic_algorithms(True) first: the backward without atomics")
    ap.add_argument("--fp32-precision", choices=("highest", "high", "medium"),
                    help="torch.set_float32_matmul_precision first (fp32 kernels use tf32 unless 'highest')")
    a = ap.parse_args(argv)
    import triton  # noqa: F401 (checked before the long loop)
    from kernel_model import flash_yardstick
    if type(flash_yardstick._flash_fwd).__name__ != "JITFunction":
        sys.exit("kernel_model.report compiles kernels: run it without TRITON_INTERPRET=1")
    if a.fp32_precision:
        torch.set_float32_matmul_precision(a.fp32_precision)
    if a.deterministic:
        torch.use_deterministic_algorithms(True)
    combos = [(n, dt, kind) for n in a.n or NS for dt in a.dtype or list(DTYPES) for kind in a.kind or list(KINDS)]
    # the yardstick is for the H200 cost model only (it is tuned for sm_90; on sm_80 its backward spills 24 B)
    passes = measured_passes(a.passes_from, a.source, a.passes) if a.passes_from else a.passes
    rep = report(a.target, combos, passes, cache=not a.no_cache, jobs=a.jobs, alu=a.alu,
                 yardstick=a.target == "sm_90")
    rep["problems"] = problems(rep)
    if a.json:
        Path(a.json).write_text(json.dumps(rep, indent=1))
    print(markdown(rep))
    print("\nproblems:" if rep["problems"] else "\nno problems: every kernel compiles, no 16-bit spill, shared memory "
          "within the limit" + (", wgmma for every 16-bit GEMM, predicted ratios within target"
                                if a.target == "sm_90" else ""))
    for p in rep["problems"]:
        print(" -", p)
    return 1 if rep["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
