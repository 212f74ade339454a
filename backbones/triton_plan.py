"""The launch plan of the Triton attention kernels: which kernels a call launches, their block sizes, warps, stages
and grids (``_plan``), read by the launcher (``backbones.triton_attention``) and, as :class:`KernelLaunch` records
(``kernel_launches``), by the static kernel model (``kernel_model``) and the tests. One block-size choice for both."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from . import triton_kernels as tk
from . import triton_kernels_bwd as tkb

triton = tk.triton

_MAX_PASSES = 64  # a row not settled by then (never seen) keeps the closed-form root on its last support
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_SINGLE_MAX = 272  # keys up to this count: the whole row in one register tile (q k^T once)
_TYPE = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def interpreted() -> bool:
    """True when the kernels were built for Triton's CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return triton is not None and type(tk._fwd_kernel).__name__ == "InterpretedFunction"


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel launch as the launcher makes it (``kernel_model.report`` compiles these for sm_90)."""
    name: str                    # "fwd"; "bwd_delta", "bwd", "bwd_dq_cast"; deterministic: "bwd_dkdv", "bwd_dq"
    fn: object                   # the triton.JITFunction
    signature: dict[str, str]    # triton.compiler.ASTSource signature: arg -> "*bf16" / "i32" / "fp32" / "constexpr"
    constexprs: dict[str, object]
    num_warps: int
    num_stages: int
    programs: int                # grid size for these sizes
    scalars: dict[str, int] = field(default_factory=dict)  # integer args for a ViT's layout (strides of q/k/v
    # slices of the fused qkv tensor, O as (B, N, H, dv)): give tt.divisibility=16 to those divisible by 16,
    # as Triton's launcher specialises them (without it the strided loads do not vectorise)


def _tf32_allowed() -> bool:
    try:
        return torch.get_float32_matmul_precision() != "highest"
    except RuntimeError:  # the per-backend API (torch.backends.cuda.matmul.fp32_precision) was used
        return torch.backends.cuda.matmul.fp32_precision == "tf32"


def _prec(dtype: torch.dtype) -> str:
    """tl.dot precision: 16-bit tensor cores for fp16/bf16 ("upcast" in the interpreter, whose bf16 dot is
    wrong); fp32 uses tf32 tensor cores when torch allows them for fp32 matmuls (as SDPA does), else exact."""
    if dtype == torch.float32:
        return "tf32" if _tf32_allowed() else "ieee"
    return "upcast" if dtype == torch.bfloat16 and interpreted() else "tf32"


def _blocks(m: int, dtype: torch.dtype, prec: str, need_grad: bool, arch: int = 90, entmax: bool = True) -> dict:
    """Block sizes and warps, each measured by compiling for sm_90 (docs/performance.md, "Triton kernel design").
    ``tiles``: the forward's register tiles (see _tiles), None for block-wise rows (``block_n`` keys per block);
    ``bwd_*``: the deterministic backward's (1 stage); ``fa2``: the 5-GEMM backward's (query block, key block,
    warps, stages)."""
    one = (max(16, triton.next_power_of_2(m)), 0, 0) if m <= 64 else None  # fp32: one register tile
    if prec == "ieee":  # exact fp32 on CUDA cores: 16-row blocks, or it spills (one tile: inference only)
        return dict(tiles=None if need_grad else one, block_m=16, block_n=32, fwd_warps=4, bwd_m=16, bwd_n=32,
                    bwd_warps=4, fa2=(16, 32, 4, 1))
    if dtype == torch.float32:  # tf32: fp32 operands take twice the registers of 16-bit ones
        return dict(tiles=one, block_m=64, block_n=64, fwd_warps=4, bwd_m=64, bwd_n=64, bwd_warps=8,
                    fa2=(32, 64, 4, 1))
    # register tiles (_tiles) up to 272 keys on sm_90; these spilled, so they go block-wise: sm_80's mma.sync
    # layout from 129 keys (16 B), fp16 sparsemax from 225 keys in inference (two 128-key tiles: 92 B) and from 257
    # in training (the third tile: 4 B)
    single = m <= (_SINGLE_MAX if arch >= 90 else 128)
    if dtype == torch.float16 and not entmax:
        single = single and m <= (256 if need_grad else 224)
    # 5-GEMM backward: 32 query rows per step x 64 keys (its products keep a 64-row wgmma side), 1 stage (2
    # stages staged q and dO through shared memory: 4x the LDS); no spill on sm_90 nor sm_80
    return dict(tiles=_tiles(m) if single else None, block_m=64, block_n=64, fwd_warps=4, bwd_m=64, bwd_n=64,
                bwd_warps=4, fa2=(32, 64, 4, 1))


@functools.lru_cache(maxsize=None)
def _tiles(m: int) -> tuple[int, int, int]:
    """Widths (a, b, c) of the 16-bit forward's register tiles for m <= 272 keys (0: none), powers of two >= 16,
    c <= b <= a <= 128, c < a: the fewest padded keys, then the fewest tiles (197: 128 + 64 + 16; 37: 32 + 16)."""
    widths = (16, 32, 64, 128)
    fits = [(a, b, c) for a in widths for b in (0, *widths) if b <= a for c in (0, *widths)
            if c <= b and c < a and a + b + c >= m]
    return min(fits, key=lambda t: (sum(t), sum(map(bool, t))))


def _plan(n: int, m: int, dtype: torch.dtype, d: int, dv: int, bh: int, entmax: bool, need_grad: bool,
          count: bool = False, deterministic: bool = False, arch: int = 90, single: bool | None = None):
    """(name, kernel, grid, constexprs, launch options) of every launch: the one block-size choice, for the launcher
    and :func:`kernel_launches`; the backward's 5-GEMM atomic kernels, or (``deterministic``) the atomic-free pair."""
    prec = _prec(dtype)
    cfg = _blocks(m, dtype, prec, need_grad, arch, entmax)
    if single is not None:  # threshold_passes: the 16-bit forward's register tiles or key blocks, on exact fp32
        cfg.update(tiles=_tiles(m) if single else None, block_n=64)
    meta = dict(D=d, DV=dv, BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_DV=max(16, triton.next_power_of_2(dv)),
                ENTMAX=entmax, PREC=prec)
    cdiv = triton.cdiv
    tiles = cfg["tiles"]
    if tiles is not None:
        block_n, mid_n, last_n = tiles
    else:  # block-wise: the last key block only as wide as its keys need
        block_n, mid_n = cfg["block_n"], 0
        last_n = max(16, triton.next_power_of_2(m - (m - 1) // block_n * block_n))
    plan = [("fwd", tk._fwd_kernel, (cdiv(n, cfg["block_m"]), bh),
             dict(meta, BLOCK_M=cfg["block_m"], BLOCK_N=block_n, MID_N=mid_n or block_n, LAST_N=last_n or block_n,
                  SINGLE=tiles is not None, TWO=mid_n > 0,
                  NEED_OG=need_grad, COUNT=count, MAX_PASSES=_MAX_PASSES, FUSED=not interpreted()),
             dict(num_warps=cfg["fwd_warps"], num_stages=1))]
    if not need_grad:
        return plan
    if deterministic:
        bwd = dict(meta, BLOCK_M=cfg["bwd_m"], BLOCK_N=cfg["bwd_n"])
        opts = dict(num_warps=cfg["bwd_warps"], num_stages=1)
        return plan + [("bwd_dkdv", tkb._bwd_kv_kernel, (cdiv(m, cfg["bwd_n"]), bh), bwd, opts),
                       ("bwd_dq", tkb._bwd_q_kernel, (cdiv(n, cfg["bwd_m"]), bh), bwd, opts)]
    block_m, block_n, warps, stages = cfg["fa2"]
    return plan + [
        ("bwd_delta", tkb._bwd_delta_kernel, (cdiv(n, _DELTA_BLOCK), bh),
         dict(DV=dv, BLOCK_M=_DELTA_BLOCK, BLOCK_DV=meta["BLOCK_DV"]), dict(num_warps=4, num_stages=1)),
        ("bwd", tkb._bwd_kernel, (cdiv(m, block_n), bh), dict(meta, BLOCK_M=block_m, BLOCK_N=block_n),
         dict(num_warps=warps, num_stages=stages)),
        ("bwd_dq_cast", tkb._bwd_dq_cast_kernel, (cdiv(bh * n * d, _CAST_BLOCK),), dict(BLOCK=_CAST_BLOCK),
         dict(num_warps=4, num_stages=1))]


_DELTA_BLOCK, _CAST_BLOCK = 64, 1024  # rows per delta program, elements per dQ cast program
_FP32_ARGS = {"STATS": "fp32", "PASSES": "i32", "DELTA": "fp32", "DQ_ACC": "fp32"}  # pointers of a fixed type;
# the others have the input dtype


def _signature(fn, dtype: torch.dtype, constexprs: dict) -> dict[str, str]:
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name == "scale":
            sig[name] = "fp32"
        elif name in ("N", "M") or name[0].islower():  # sizes and strides; tensors are upper case
            sig[name] = "i32"
        else:
            sig[name] = "*" + _FP32_ARGS.get(name, _TYPE[dtype])
    return sig


def kernel_launches(n: int, dtype: torch.dtype, kind: str = "entmax15", head_dim: int = 64, bh: int = 384,
                need_grad: bool = True, m: int | None = None, deterministic: bool | None = None,
                arch: int = 90) -> list[KernelLaunch]:
    """The kernels the launcher runs for ``n`` query rows and ``m`` (default n) keys, with the block sizes it picks
    (fp32: by torch's float32 matmul precision) for compute capability ``arch``; ``deterministic`` (default: torch's
    current setting) picks the atomic-free backward."""
    if triton is None:
        raise RuntimeError("kernel_launches needs Triton")
    m = n if m is None else m
    det = torch.are_deterministic_algorithms_enabled() if deterministic is None else deterministic
    plan = _plan(n, m, dtype, head_dim, head_dim, bh, kind == "entmax15", need_grad, deterministic=det, arch=arch)
    scalars = dict(_vit_scalars(n, m, head_dim), numel=bh * n * head_dim)
    return [KernelLaunch(name, fn, _signature(fn, dtype, consts), dict(consts), opts["num_warps"],
                         opts["num_stages"], grid[0] * (grid[1] if len(grid) > 1 else 1),
                         {a: v for a, v in scalars.items() if a in fn.arg_names})
            for name, fn, grid, consts, opts in plan]


def _vit_scalars(n: int, m: int, d: int, heads: int = 6) -> dict[str, int]:
    """Integer arguments of a ViT layer: q, k, v slices of qkv (B, M, 3, H, d), O and dO as (B, N, H, d)."""
    qkv = dict(b=m * 3 * heads * d, h=d, n=3 * heads * d)
    out = dict(b=n * heads * d, h=d, n=heads * d)
    strides = {f"s{t}_{a}": v for t, lay in (("q", qkv), ("k", qkv), ("v", qkv), ("o", out), ("d", out))
               for a, v in lay.items()}
    return dict(n=n, m=m, heads=heads, **strides)
