"""kernel_model.report: the attention kernels compiled for sm_90 and sm_80 without a GPU (registers, spills, the
1.3x-yardstick target), the SASS counter and the cost model against hand-worked cases, the flash yardstick
against softmax attention.

Compiling needs Triton in compiled mode. If this process imported Triton under TRITON_INTERPRET=1, those tests
are deselected (``runs_elsewhere``, not skipped) and ``test_in_compiled_mode`` reruns the file in a fresh process without it.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

import triton  # noqa: E402  (a dependency of torch on Linux x86_64: missing = an error, not a skip)
import triton.language as tl  # noqa: E402

from kernel_model import cost_model, report as kr, sass, sass_loops  # noqa: E402
from kernel_model import flash_yardstick as fy  # noqa: E402
from kernel_model.compiler import compile_launch, loops_of  # noqa: E402
from backbones.triton_plan import KernelLaunch  # noqa: E402
from helpers.procs import run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
_INTERPRETED = type(fy._flash_fwd).__name__ != "JITFunction"
compiled = pytest.mark.runs_elsewhere(_INTERPRETED, reason="Triton imported under TRITON_INTERPRET=1: "
                              "test_in_compiled_mode reruns this file without it")


# ------------------------------------------------------------------ hand-worked kernels
@triton.jit
def _one_dot(A, B, C, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    a = tl.load(A + offs[:, None] * BLOCK + offs[None, :])
    b = tl.load(B + offs[:, None] * BLOCK + offs[None, :])
    tl.store(C + offs[:, None] * BLOCK + offs[None, :], tl.dot(a, b))


@triton.jit
def _exp_sum(X, n_items, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_items, BLOCK):
        acc += tl.exp(tl.load(X + start + offs, mask=start + offs < n_items, other=0.0))
    return acc


@triton.jit
def _exp_loop(X, Y, N, BLOCK: tl.constexpr):
    tl.store(Y + tl.arange(0, BLOCK), _exp_sum(X, N, BLOCK))  # the loop sits in an inlined helper


def _launch(fn, sig, consts, warps=4):
    return KernelLaunch(fn.__name__, fn, {**sig, **dict.fromkeys(consts, "constexpr")}, consts, warps, 1, 1)


def test_an_unresolved_loop_trip_count_is_a_problem():
    """Triton 3.6's line info has no inlining call sites: a key-block loop whose bound is a helper's argument
    was counted once, and the report said "no problems" (785-token forward predicted 34 µs, 165 µs resolved)."""
    loop = {"source": "triton_kernels.py:150", "trips": 1.0,
            "how": "unresolved: range(0, stop, BLOCK_N) (NameError: name 'stop' is not defined)"}
    row = dict(impl="entmax", kind="entmax15", dtype="bf16", n=785, kernel="fwd", spill_stores=0, spill_loads=0,
               shared=0, static={"HMMA": 0}, loops=[loop])
    rep = dict(target="sm_90", shared_limit=1, kernels=[row], ratios=[])
    assert kr.problems(rep) == ["entmax entmax15 bf16 N=785 fwd: loop at triton_kernels.py:150 has an unresolved "
                                "trip count, counted once"]
    loop.update(trips=12.0, how="range(0, stop, BLOCK_N) = 12")
    assert kr.problems(rep) == []


def test_cost_model_hand_worked():
    # 8 warps = 2 warpgroups, each 2 HGMMA.64x64x16 (65536 MACs): 2*65536*2 / 2048 = 128 tensor cycles;
    # 16 FMA-pipe warp instructions x 256 lanes / 128 = 32; no MUFU
    c = cost_model.program_cycles({"FFMA": 10, "FMUL": 6, "ALU": 4}, {"HGMMA.BF16": 2 * 64 * 64 * 16}, 8)
    assert (c["tensor"], c["fma"], c["mufu"], c["alu"], c["cycles"], c["bound"]) == (128, 32, 0, 16, 128, "tensor")
    # 300 ALU warp instructions x 256 lanes / 64 = 1200 cycles: the bound only when the ALU pipe is in the max
    c = cost_model.program_cycles({"ALU": 300}, {"HGMMA.BF16": 2 * 64 * 64 * 16}, 8, alu=True)
    assert (c["cycles"], c["bound"]) == (1200, "alu")
    # 4 warps: 5 MUFU x 128 lanes / 16 = 40; 3 HMMA.16816 per warp: 3 * 2048 * 4 / 1024 = 24; FADD 7 -> 7
    c = cost_model.program_cycles({"MUFU": 5, "FADD": 7}, {"HMMA.BF16": 3 * 2048}, 4)
    assert (c["tensor"], c["fma"], c["mufu"], c["bound"]) == (24, 7, 40, "mufu")
    # 1320 programs of 183 cycles on 132 SMs at 1.83 GHz: 10 * 183 / 1.83e9 s = 1 µs
    assert cost_model.kernel_time_us(183, 1320) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no tensor-core rate"):
        cost_model.program_cycles({}, {"HGMMA.E4M3": 1}, 4)


def test_mma_shapes_hand_worked():
    assert sass.mma_macs("HGMMA.64x128x16.F32.BF16") == ("HGMMA.BF16", 64 * 128 * 16)
    assert sass.mma_macs("HGMMA.64x64x8.F32.TF32") == ("HGMMA.TF32", 64 * 64 * 8)
    assert sass.mma_macs("HMMA.16816.F32.BF16") == ("HMMA.BF16", 16 * 8 * 16)
    assert sass.mma_macs("HMMA.1688.F32.TF32") == ("HMMA.TF32", 16 * 8 * 8)
    assert sass.mma_macs("HMMA.16816.F32") == ("HMMA.F16", 2048)
    assert sass.category("BAR.SYNC.DEFER_BLOCKING") == "BAR" and sass.category("LDGDEPBAR") is None
    # a loop 0x10-0x30 whose body jumps forward to a block laid out after EXIT (0x50) and back: one loop of
    # 4 blocks; the trailing BRA-to-itself after EXIT is not a loop
    ins = sass.parse_sass("""
        /*0000*/                   MOV R1, R2 ;
        /*0010*/                   MUFU.EX2 R35, R49 ;
        /*0020*/               @P1 BRA 0x50 ;
        /*0030*/              @!P0 BRA 0x10 ;
        /*0040*/                   EXIT ;
        /*0050*/                   FADD R1, R1, R2 ;
        /*0060*/                   BRA 0x30 ;
        /*0070*/                   BRA 0x70 ;""")
    assert ins[2] == sass.Instr(0x20, "BRA", 0x50, True) and ins[6] == sass.Instr(0x60, "BRA", 0x30, False)
    assert sass_loops.find_loops(ins) == [dict(start=0x10, end=0x30, ranges=[[0x10, 0x20], [0x30, 0x30],
                                                                             [0x50, 0x60]])]
    # a one-block loop after straight code: the loop is that block alone
    ins = sass.parse_sass("""
        /*0000*/                   MOV R1, R2 ;
        /*0010*/                   FADD R1, R1, R2 ;
        /*0020*/              @!P0 BRA 0x10 ;
        /*0030*/                   EXIT ;""")
    assert sass_loops.find_loops(ins) == [dict(start=0x10, end=0x20, ranges=[[0x10, 0x20]])]
    # BRA.DIV: to a diverged-warp fallback (0x50-0x70) that rejoins the loop. Never taken in Triton's uniform
    # control flow: the loop is 0x10-0x30 alone, the fallback and the trailing branch-to-self count zero times
    ins = sass.parse_sass("""
        /*0000*/                   MOV R1, R2 ;
        /*0010*/                   BRA.DIV UR4, 0x50 ;
        /*0020*/                   SHFL.BFLY PT, R3, R1, 0x1, 0x1f ;
        /*0030*/              @!P0 BRA 0x10 ;
        /*0040*/                   EXIT ;
        /*0050*/                   WARPSYNC.COLLECTIVE R5, 0x60 ;
        /*0060*/                   FADD R1, R1, R2 ;
        /*0070*/                   BRA 0x30 ;
        /*0080*/                   BRA 0x80 ;""")
    assert sass_loops.find_loops(ins) == [dict(start=0x10, end=0x30, ranges=[[0x10, 0x10], [0x20, 0x20], [0x30, 0x30]])]
    assert sass_loops.unreachable(ins) == {0x50, 0x60, 0x70, 0x80}
    rec = dict(instrs=[[i.addr, i.op, i.target, i.cond] for i in ins], ptx_loops=[], branch_chains={})
    weights, _ = kr.loop_weights(rec, {}, 3)
    assert sass.weighted_counts(ins, weights)[0]["FADD"] == 0


@compiled
@pytest.mark.parametrize("target", ["sm_90", "sm_80"])
@pytest.mark.slow
def test_sass_counts_one_dot(target):
    """One 64x64x64 bf16 product in 4 warps = 262144 multiply-adds: on sm_90 wgmma (HGMMA, one warpgroup), on
    sm_80 mma.sync m16n8k16 (HMMA, 2048 each) = 32 per warp."""
    kl = _launch(_one_dot, {"A": "*bf16", "B": "*bf16", "C": "*fp32"}, {"BLOCK": 64})
    rec = compile_launch(kl, target, {}, cache=False)
    row = kr.analyse(kl, rec, 1, 1, passes=1)
    if target == "sm_90":
        assert rec["ptx_wgmma"] > 0 and row["static"]["HMMA"] == 0
        assert row["macs_per_program"] == {"HGMMA.BF16": 64 ** 3}
    else:
        assert rec["ptx_wgmma"] == 0 and row["static"]["HGMMA"] == 0
        assert row["static"]["HMMA"] == 32 and row["macs_per_program"] == {"HMMA.BF16": 32 * 2048}
    assert row["loops"] == [] and row["static"]["MUFU"] == 0 and rec["spill_stores"] == 0


@compiled
@pytest.mark.slow
def test_sass_counts_exp_loop():
    """128 fp32 elements over 4 warps: one tl.exp = one MUFU.EX2 per thread per iteration, cdiv(1000, 128) = 8
    iterations for N = 1000 (N bound through the helper's call site). ptxas unrolls this small loop 4 times
    (PTX: one ex2 in the loop; SASS: 4 in the loop + 3 in the remainder code): the loop runs 8 / 4 = 2 times,
    the remainder copies are counted once each, as all code outside loops."""
    kl = _launch(_exp_loop, {"X": "*fp32", "Y": "*fp32", "N": "i32"}, {"BLOCK": 128})
    rec = compile_launch(kl, "sm_90", {"N": 1000}, cache=False)
    (loop,) = loops_of(rec)
    in_loop = [op for a, op, *_ in rec["instrs"] if sass_loops.in_loop(a, loop)]
    u = loop["unroll"]
    assert in_loop.count("MUFU.EX2") == u  # one per unrolled copy of the body
    row = kr.analyse(kl, rec, 1000, 1000, passes=1)
    assert [(lp["trips"], lp["source"]) for lp in row["loops"]] == [(8 / u, f"test_kernel_report.py:{_LOOP_LINE}")]
    outside = [x[1] for x in rec["instrs"]].count("MUFU.EX2") - u
    assert row["per_program"]["MUFU"] == 8 + outside  # the loop's 8 exactly, plus the static remainder
    assert row["cycles"]["mufu"] == (8 + outside) * 128 / 16


@compiled
@pytest.mark.slow
def test_one_listing_reads_as_cuobjdump_prints_it():
    """The records read instructions from nvdisasm's listing (the one with source lines), its branch labels
    resolved to addresses. Reference: ``cuobjdump -sass`` of the same cubin (it prints the addresses itself), on a
    kernel with a loop (a conditional back edge and the exit branch)."""
    from kernel_model.compiler import _attrs, _compile
    kl = _launch(_exp_loop, {"X": "*fp32", "Y": "*fp32", "N": "i32"}, {"BLOCK": 128})
    cubin = _compile(kl, "sm_90", _attrs(kl, {"N": 1000}))[0].asm["cubin"]
    listing = sass.nvdisasm_lines(cubin)
    assert "`(.L_x_" in listing  # labels, not addresses
    ref = sass.parse_sass(sass._run_on_cubin(cubin, [str(sass.tool("cuobjdump")), "-sass"]))
    got = sass.parse_sass(sass.resolve_labels(listing))
    assert got == ref and any(i.base == "BRA" and i.target >= 0 and i.cond for i in ref)


_LOOP_LINE = next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1)
                  if "for start in range(0, n_items, BLOCK)" in line)


# ------------------------------------------------------------------ the attention kernels
_SUBSET = {  # (n, dtype, kind); the CLI covers the full grid
    "sm_90": [(n, dt, "entmax15") for n in (37, 197, 785) for dt in ("bf16", "fp32")] + [(197, "bf16", "sparsemax")]
    + [(197, "fp16", "entmax15")],  # 16-mixed (the paper preset): fp16 at its global-crop N
    "sm_80": [(n, "bf16", "entmax15") for n in (37, 197, 785)] + [(197, "fp32", "entmax15")],
}


@pytest.fixture(scope="module")
def reports():
    """Both targets' reports on the subset (the yardstick in bf16 on sm_90); compiled results are cached in
    build/kernel_report by source hash, so only a changed kernel compiles again."""
    out = {}
    for target, combos in _SUBSET.items():
        rep = kr.report(target, combos, passes=3, jobs=os.cpu_count() or 1, yardstick=False)
        if target == "sm_90":
            rep["kernels"] += kr.report(target, [(n, "bf16", "entmax15") for n in (37, 197, 785)], passes=3,
                                        jobs=os.cpu_count() or 1)["kernels"]
        out[target] = rep
    return out


def _check(reports, what):
    bad = [p for rep in reports.values() for p in kr.problems(rep) if what in p]
    assert not bad, "\n".join(bad)


@compiled
@pytest.mark.timeout(600)
def test_every_kernel_compiles_for_sm90_and_sm80(reports):
    for rep in reports.values():
        assert {r["impl"] for r in rep["kernels"]} == ({"entmax", "flash"} if rep["target"] == "sm_90" else {"entmax"})
        assert {r["kernel"] for r in rep["kernels"] if r["impl"] == "entmax"} == \
            {"fwd", "bwd_delta", "bwd", "bwd_dq_cast"}  # the 5-GEMM backward (not in deterministic mode)
    _check(reports, "does not compile")


@compiled
def test_no_16bit_kernel_spills(reports):
    _check(reports, "spills")


@compiled
def test_shared_memory_within_the_limit(reports):
    assert kr.SHARED_LIMIT["sm_90"] == 227 * 1024
    _check(reports, "shared >")


@compiled
def test_every_16bit_gemm_on_sm90_uses_wgmma(reports):
    _check(reports, "mma.sync")
    for r in reports["sm_90"]["kernels"]:
        if r["dtype"] != "fp32" and "error" not in r and r["static"]["HGMMA"] + r["static"]["HMMA"]:
            assert r["ptx_wgmma"] > 0 and r["ptx_mma_sync"] == 0, (r["impl"], r["kernel"], r["n"])


@compiled
def test_fp16_kernels_compile_as_the_bf16_ones(reports):
    """16-mixed (the paper preset) runs the fp16 kernels: at 197 tokens the same launch plan as bf16, so the same
    kernels and the same number of tensor-core multiply-adds, on wgmma, without spilling."""
    def rows(dt):
        return {(r["kernel"], r["phase"]): r for r in reports["sm_90"]["kernels"]
                if (r["impl"], r["dtype"], r["kind"], r["n"]) == ("entmax", dt, "entmax15", 197)}
    half, bf = rows("fp16"), rows("bf16")
    assert half and set(half) == set(bf)
    for key, r in half.items():
        assert "error" not in r and r["spill_stores"] == r["spill_loads"] == 0, key
        assert sum(r["macs_per_program"].values()) == sum(bf[key]["macs_per_program"].values()), key
        assert all(k.startswith("HGMMA") for k in r["macs_per_program"]), (key, r["macs_per_program"])


@compiled
def test_five_gemm_backward_on_sm90(reports):
    """The 5-GEMM backward's product kernel, 16-bit on sm_90: wgmma, no spill, and exactly FlashAttention-2's
    five products per (64-key block, 32-query block) tile, each 64 x 64 x 32 multiply-adds (d = 64), times
    cdiv(N, 32) query blocks per program (one warpgroup); its delta and dQ-cast kernels have no products."""
    rows = [r for r in reports["sm_90"]["kernels"] if r["impl"] == "entmax" and r["dtype"] == "bf16"
            and r["phase"] == "train" and r["kernel"].startswith("bwd")]
    assert {r["n"] for r in rows if r["kernel"] == "bwd"} == {37, 197, 785}
    for r in rows:
        assert r["spill_stores"] == r["spill_loads"] == 0, (r["kernel"], r["n"])
        if r["kernel"] == "bwd":
            assert r["ptx_wgmma"] > 0 and r["static"]["HMMA"] == 0, r["n"]
            assert r["constexprs"]["BLOCK_M"] == "32" and r["constexprs"]["BLOCK_N"] == "64"
            assert r["macs_per_program"] == {"HGMMA.BF16": 5 * 64 * 64 * 32 * -(-r["n"] // 32)}, r["n"]
        else:
            assert r["macs_per_program"] == {} and r["ptx_wgmma"] == 0, r["kernel"]


@compiled
def test_every_loop_trip_count_is_resolved(reports):
    loops = [(r["impl"], r["kernel"], r["n"], lp) for r in reports["sm_90"]["kernels"] for lp in r.get("loops", [])]
    assert loops, "the attention kernels have loops: none found"
    assert all(not lp["how"].startswith("unresolved") for *_, lp in loops), loops
    # the yardstick forward loops over key blocks: cdiv(N, BLOCK_N) times
    fwd = [lp for impl, k, n, lp in loops if impl == "flash" and k == "flash_fwd" and n == 785]
    assert fwd and fwd[0]["trips"] == -(-785 // 128)
    # the threshold loop runs the assumed 3 passes with the row in registers (197), and 2 after the block-wise
    # path's first sweep, which finds the row max and makes the first pass (785)
    for n, trips in ((197, 3), (785, 2)):
        whiles = [lp for r in reports["sm_90"]["kernels"] for lp in r.get("loops", []) if "while" in lp["how"]
                  and (r["impl"], r["kernel"], r["n"], r["dtype"]) == ("entmax", "fwd", n, "bf16")]
        assert whiles and {lp["trips"] for lp in whiles} == {trips}, (n, whiles)
    # so the block-wise training forward at 785 makes six q k^T-sized products per key block: the fused first
    # sweep, 2 passes, then q k^T, p v and g v; each 64 queries x d = 64 x the block's keys: 12 blocks of 64 and
    # the last one 32 wide (785 - 768 = 17 keys)
    key = ("entmax", "fwd", 785, "bf16", "train", "entmax15")
    rows = [r for r in reports["sm_90"]["kernels"]
            if (r["impl"], r["kernel"], r["n"], r["dtype"], r["phase"], r["kind"]) == key]
    assert rows and all(r["macs_per_program"] == {"HGMMA.BF16": 6 * 64 * 64 * (12 * 64 + 32)} for r in rows), \
        rows[0]["loops"]


class _Launch:
    def __init__(self, single):
        self.constexprs = {"SINGLE": single}


def test_measured_passes_per_n_and_path(tmp_path):
    """--passes-from: the per-program mean of kernel_model.threshold_passes' record for that N, path and source; the
    default where none was measured."""
    f = tmp_path / "p.json"
    f.write_text(json.dumps([dict(source="vit", n=197, path="single", tile_mean=4.0),
                             dict(source="vit", n=197, path="block", tile_mean=3.33),
                             dict(source="gauss-3", n=197, path="single", tile_mean=3.0)]))
    passes = kr.measured_passes(str(f), "vit", 3.0)
    assert (passes(197, _Launch(True)), passes(197, _Launch(False)), passes(785, _Launch(False))) == (4.0, 3.33, 3.0)
    assert kr.measured_passes(str(f), "gauss-3", 3.0)(197, _Launch(True)) == 3.0
    with pytest.raises(SystemExit, match="no rows"):
        kr.measured_passes(str(f), "gauss-9", 3.0)


@compiled
@pytest.mark.timeout(300)
@pytest.mark.slow
def test_measured_passes_set_the_threshold_loop(tmp_path):
    """The block-wise forward's while loop runs the measured per-program mean minus the fused first sweep."""
    f = tmp_path / "p.json"
    f.write_text(json.dumps([dict(source="vit", n=785, path="block", tile_mean=4.17)]))
    rep = kr.report("sm_90", [(785, "bf16", "entmax15")], kr.measured_passes(str(f), "vit", 3.0),
                    yardstick=False)
    whiles = [lp["trips"] for r in rep["kernels"] if r["kernel"] == "fwd" for lp in r["loops"] if "while" in lp["how"]]
    assert whiles and all(t == pytest.approx(3.17) for t in whiles), whiles
    assert rep["passes"].startswith("per 64-row program, measured (vit: N=785 block 4.17")


@compiled
@pytest.mark.slow
def test_cli_table_and_json(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = kr.main(["--n", "37", "--dtype", "bf16", "--kind", "sparsemax", "--json", str(out)])
    rep = json.loads(out.read_text())
    assert rc == (1 if rep["problems"] else 0)
    text = capsys.readouterr().out
    assert "| sparsemax | bf16 | 37 |" in text and "ratio fwd" in text
    (q,) = rep["ratios"]
    assert q["ratio"]["total"] == pytest.approx(q["entmax_us"]["total"] / q["flash_us"]["total"])
    assert q["entmax_us"]["total"] > q["entmax_us"]["fwd"] > 0 and q["flash_us"]["bwd"] > 0


# ------------------------------------------------------------------ the yardstick's values
_YARDSTICK_CHECK = """
import torch
from kernel_model.flash_yardstick import flash_attention
torch.manual_seed(0)
for n, m in ((37, 37), (100, 130)):
    q, k, v = (torch.randn(3, x, 64).requires_grad_(True) for x in (n, m, m))
    do = torch.randn(3, n, 64)
    o = flash_attention(q, k, v, 0.125)
    o.backward(do)
    q2, k2, v2 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    o2 = torch.softmax(q2 @ k2.transpose(1, 2) * 0.125, -1) @ v2
    o2.backward(do.double())
    for a, b in ((o, o2), (q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad)):
        err = (a.double() - b).abs().max().item()
        assert err < 1e-5, (n, m, err)
print("ok")
"""


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_yardstick_is_softmax_attention():
    """The flash yardstick's forward and backward kernels (interpreter, fp32) against float64 softmax attention."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    r = run([sys.executable, "-c", _YARDSTICK_CHECK], timeout=200, cwd=ROOT, env=env)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


@pytest.mark.runs_elsewhere(not _INTERPRETED, reason="Triton is in compiled mode here: the tests ran directly")
@pytest.mark.timeout(900)
@pytest.mark.slow
def test_in_compiled_mode():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    r = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__], timeout=850, cwd=ROOT,
            env=env)
    assert r.returncode == 0, r.stdout[-5000:]
