"""Compile one planned Triton launch for a GPU target without a GPU, and read what ptxas and the cubin say.

``triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", 90, 32), options=...)``
runs Triton's whole pipeline (TTIR -> TTGIR -> LLVM -> PTX) and the ptxas of the triton wheel on this CPU machine.
Pointer arguments get ``tt.divisibility=16`` and integer arguments whose value is known and a multiple of 16 too,
as Triton's launcher specialises them for 16-byte aligned torch tensors.

Results are cached as JSON under ``build/kernel_report/`` (git-ignored), keyed by the kernel's source hash
(``JITFunction.cache_key``, which covers the helpers it calls), signature, constexprs, attributes, options,
target and Triton version.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
from pathlib import Path

import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernel_model import sass, sass_loops

TARGETS = {"sm_90": GPUTarget("cuda", 90, 32), "sm_80": GPUTarget("cuda", 80, 32)}
CACHE_DIR = Path(__file__).resolve().parents[1] / "build" / "kernel_report"
RECORD_FORMAT = 4  # bump when _record changes: older cache files are then ignored


def _attrs(launch, scalars: dict) -> dict:
    attrs = {}
    for name, ty in launch.signature.items():
        i, value = launch.fn.arg_names.index(name), scalars.get(name)
        if ty.startswith("*") or (ty.startswith("i") and isinstance(value, int) and value % 16 == 0):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return attrs


def _key(launch, target: str, attrs: dict) -> str:
    payload = json.dumps([launch.fn.cache_key, launch.signature, {k: repr(v) for k, v in launch.constexprs.items()},
                          sorted((list(k), v) for k, v in attrs.items()), launch.num_warps, launch.num_stages,
                          target, triton.__version__, RECORD_FORMAT], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def _path(launch, target: str, scalars: dict) -> Path:
    return CACHE_DIR / target / f"{launch.name}-{_key(launch, target, _attrs(launch, scalars))}.json"


def _compile(launch, target: str, attrs: dict):
    signature = {a: launch.signature[a] for a in launch.fn.arg_names}  # the kernel's argument order
    src = ASTSource(launch.fn, signature, dict(launch.constexprs), attrs)
    log = io.StringIO()
    saved = knobs.nvidia.dump_ptxas_log, knobs.compilation.always_compile
    knobs.nvidia.dump_ptxas_log, knobs.compilation.always_compile = True, True  # a fresh ptxas log every time
    try:
        with contextlib.redirect_stdout(log):
            kernel = triton.compile(src, target=TARGETS[target],
                                    options=dict(num_warps=launch.num_warps, num_stages=launch.num_stages))
    finally:
        knobs.nvidia.dump_ptxas_log, knobs.compilation.always_compile = saved
    return kernel, log.getvalue()


def _record(kernel, log: str) -> dict:
    """What the analysis needs, small enough to cache: the SASS [[addr, opcode, branch target, conditional]], the
    source line chains of its branches (loops are found at analysis time), the PTX loops' twin counts."""
    cubin, ptx = kernel.asm["cubin"], kernel.asm["ptx"]
    listing = sass.nvdisasm_lines(cubin)
    instrs = sass.parse_sass(sass.resolve_labels(listing))
    chains = sass.line_chains(listing)
    res = sass.resource_usage(cubin)
    return dict(**sass.parse_ptxas_log(log), shared=int(kernel.metadata.shared), shared_static=res.get("SHARED", 0),
                ptx_wgmma=ptx.count("wgmma.mma_async"), ptx_mma_sync=ptx.count("mma.sync"),
                instrs=[[i.addr, i.op, i.target, i.cond] for i in instrs],
                branch_chains={str(i.addr): chains.get(i.addr, ()) for i in instrs if i.base == "BRA"},
                ptx_loops=sass_loops.ptx_loops(ptx))


def loops_of(rec: dict) -> list[dict]:
    """The record's natural loops with the source chain of their last back edge and ptxas's unroll factor."""
    instrs = [sass.Instr(*x) for x in rec["instrs"]]
    loops = sass_loops.find_loops(instrs)
    for lp, u in zip(loops, sass_loops.unroll_factors(instrs, loops, rec["ptx_loops"])):
        lp["chain"], lp["unroll"] = rec["branch_chains"].get(str(lp["end"]), []), u
    return loops


def compile_launch(launch, target: str, scalars: dict, cache: bool = True) -> dict:
    """The record of one launch: registers, spills, stack, shared memory (dynamic, static), wgmma / mma.sync in the
    PTX, the SASS instructions [[addr, opcode]] and its loops (with the source line chain of their back edge).
    A compile error gives {"error": ...}."""
    path = _path(launch, target, scalars)
    if cache and path.exists():
        return json.loads(path.read_text())
    try:
        rec = _record(*_compile(launch, target, _attrs(launch, scalars)))
    except Exception as e:  # reported per kernel; the report and the tests fail on it
        return dict(error=f"{type(e).__name__}: {str(e)[:2000]}")
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(rec))
        tmp.replace(path)
    return rec


_PENDING: list = []  # (launch, target, scalars) for the forked workers of compile_many


def _compile_pending(i: int) -> dict:
    return compile_launch(*_PENDING[i], cache=True)


def compile_many(items: list, cache: bool = True, jobs: int = 1) -> list[dict]:
    """compile_launch for every (launch, target, scalars); identical ones compile once, ``jobs`` processes
    (forked, so the JIT functions need no pickling) compile what the cache lacks."""
    keys = [_path(*item) for item in items]
    first = {}
    for i, k in enumerate(keys):
        first.setdefault(k, i)
    todo = [i for i in first.values() if not (cache and keys[i].exists())]
    done = {}
    if cache and jobs > 1 and len(todo) > 1:
        import multiprocessing
        _PENDING[:] = items
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            done = dict(zip(todo, pool.map(_compile_pending, todo, chunksize=1)))
        _PENDING.clear()
    recs = {k: done[i] if i in done else compile_launch(*items[i], cache=cache) for k, i in first.items()}
    return [recs[k] for k in keys]
