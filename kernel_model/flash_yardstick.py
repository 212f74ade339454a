"""The yardstick for ``kernel_model.report``: FlashAttention-2's softmax attention, forward and backward, in Triton.

Written here (not copied) from the FlashAttention-2 paper's algorithms 1 and 2 (Dao, 2023), so that the static
cost model prices the entmax kernels against a softmax kernel compiled by the same compiler for the same target:

- forward, one program per (query block, batch*head): online softmax over key blocks in base 2
  (``p = exp2(s*scale*log2e - m)``), one QKᵀ and one P·V per tile, O and the row log-sum-exp stored;
- backward: delta = rowsum(dO ∘ O) (a small pre-kernel, as FA2), then one program per (key block, batch*head)
  with the five GEMMs of FA2 per tile (S = QKᵀ, dV += Pᵀ dO, dP = dO Vᵀ, dK += dSᵀ Q, dQ += dS K), dQ
  accumulated in fp32 with atomic adds and cast by a last small kernel (what SDPA's flash backend does).

``kernel_launches`` describes the kernels a call would launch (same shape as ``backbones.triton_plan``'s), and
``flash_attention`` runs them (CUDA, or CPU under ``TRITON_INTERPRET=1``: that is how the tests check the values
without a GPU). q, k, v are contiguous (BH, N, d); fp32 inputs use TF32 products, as SDPA with TF32 allowed.
"""
from __future__ import annotations

import math
import torch
import triton
import triton.language as tl

from backbones.triton_plan import KernelLaunch  # the launch description kernel_model.report compiles

_LOG2E = 1.4426950408889634


@triton.jit
def _flash_fwd(Q, K, V, O, LSE, qk_scale, N, M, D: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, PREC: tl.constexpr):
    bh = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + bh * N * D + offs_m[:, None] * D + offs_d[None, :], mask=offs_m[:, None] < N, other=0.0)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for start in range(0, M, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        k = tl.load(K + bh * M * D + offs_n[:, None] * D + offs_d[None, :], mask=offs_n[:, None] < M, other=0.0)
        v = tl.load(V + bh * M * D + offs_n[:, None] * D + offs_d[None, :], mask=offs_n[:, None] < M, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale  # log2 units
        s = tl.where(offs_n[None, :] < M, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(O + bh * N * D + offs_m[:, None] * D + offs_d[None, :], acc.to(O.dtype.element_ty),
             mask=offs_m[:, None] < N)
    tl.store(LSE + bh * N + offs_m, m_i + tl.math.log2(l_i), mask=offs_m < N)


@triton.jit
def _flash_bwd_pre(O, DO, DELTA, ROWS, D: tl.constexpr, BLOCK_M: tl.constexpr):
    """delta = rowsum(dO * O) over all BH*N rows."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    ptrs = offs_m[:, None] * D + offs_d[None, :]
    o = tl.load(O + ptrs, mask=offs_m[:, None] < ROWS, other=0.0).to(tl.float32)
    do = tl.load(DO + ptrs, mask=offs_m[:, None] < ROWS, other=0.0).to(tl.float32)
    tl.store(DELTA + offs_m, tl.sum(o * do, 1), mask=offs_m < ROWS)


@triton.jit
def _flash_bwd(Q, K, V, DO, LSE, DELTA, DQ, DK, DV, qk_scale, sm_scale, N, M, D: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr):
    """One key block: dK, dV over every query block; dQ += dS K added atomically (fp32)."""
    bh = tl.program_id(1)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    kv_ptrs = bh * M * D + offs_n[:, None] * D + offs_d[None, :]
    k = tl.load(K + kv_ptrs, mask=offs_n[:, None] < M, other=0.0)
    v = tl.load(V + kv_ptrs, mask=offs_n[:, None] < M, other=0.0)
    dk = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    for start in range(0, N, BLOCK_M):
        offs_m = start + tl.arange(0, BLOCK_M)
        row = offs_m < N
        q_ptrs = bh * N * D + offs_m[:, None] * D + offs_d[None, :]
        q = tl.load(Q + q_ptrs, mask=row[:, None], other=0.0)
        do = tl.load(DO + q_ptrs, mask=row[:, None], other=0.0)
        lse = tl.load(LSE + bh * N + offs_m, mask=row, other=float("inf"))
        delta = tl.load(DELTA + bh * N + offs_m, mask=row, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
        p = tl.math.exp2(s - lse[:, None])
        p = tl.where(offs_n[None, :] < M, p, 0.0)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PREC)
        dp = tl.dot(do, tl.trans(v), input_precision=PREC)
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PREC)
        dq = tl.dot(ds.to(k.dtype), k, input_precision=PREC)
        tl.atomic_add(DQ + q_ptrs, dq * sm_scale, mask=row[:, None], sem="relaxed")  # as FA2: no fence per add
    tl.store(DK + kv_ptrs, (dk * sm_scale).to(DK.dtype.element_ty), mask=offs_n[:, None] < M)
    tl.store(DV + kv_ptrs, dv.to(DV.dtype.element_ty), mask=offs_n[:, None] < M)


@triton.jit
def _flash_dq_cast(DQ_ACC, DQ, NUMEL, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(DQ + offs, tl.load(DQ_ACC + offs, mask=offs < NUMEL).to(DQ.dtype.element_ty), mask=offs < NUMEL)


_TY = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
_CAST_BLOCK = 1024


def _dtype(dtype) -> torch.dtype:
    return getattr(torch, {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}.get(dtype, str(dtype))) \
        if isinstance(dtype, str) else dtype


def _blocks(n: int, m: int) -> dict:
    """Block sizes and options: for head dim 64 on sm_90, the fastest under ``kernel_model.cost_model`` of the Triton
    tutorial's configurations that neither spill nor fall back to mma.sync (tried at N = 197 and 785)."""
    return dict(fwd=dict(BLOCK_M=64, BLOCK_N=128 if m > 64 else 64, num_warps=4, num_stages=2),
                bwd=dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2),
                pre=dict(BLOCK_M=64, num_warps=4, num_stages=1))


def kernel_launches(n, dtype, kind="softmax", head_dim=64, bh=384, need_grad=True, m=None) -> list[KernelLaunch]:
    """The kernels ``flash_attention`` launches for q (bh, n, head_dim), k/v (bh, m, head_dim): forward, then
    (need_grad) the backward's delta, dK/dV/dQ and dQ-cast kernels."""
    if kind != "softmax":
        raise ValueError(f"the flash yardstick is softmax attention, got kind={kind!r}")
    dtype = _dtype(dtype)
    m = n if m is None else m
    # TF32 products for fp32 on a GPU (16-bit inputs ignore it); exact fp32 under the interpreter
    ty, prec = _TY[dtype], "ieee" if dtype == torch.float32 and _interpreted() else "tf32"
    cfg = _blocks(n, m)
    f, b, pre = cfg["fwd"], cfg["bwd"], cfg["pre"]
    ptr = lambda *names, t=ty: {x: f"*{t}" for x in names}  # noqa: E731
    ints = {"N": "i32", "M": "i32"}
    plan = [KernelLaunch("flash_fwd", _flash_fwd,
                         {**ptr("Q", "K", "V", "O"), **ptr("LSE", t="fp32"), "qk_scale": "fp32", **ints,
                          **dict.fromkeys(("D", "BLOCK_M", "BLOCK_N", "PREC"), "constexpr")},
                         dict(D=head_dim, BLOCK_M=f["BLOCK_M"], BLOCK_N=f["BLOCK_N"], PREC=prec),
                         f["num_warps"], f["num_stages"], triton.cdiv(n, f["BLOCK_M"]) * bh)]
    if not need_grad:
        return plan
    plan.append(KernelLaunch("flash_bwd_pre", _flash_bwd_pre,
                             {**ptr("O", "DO"), **ptr("DELTA", t="fp32"), "ROWS": "i32", "D": "constexpr",
                              "BLOCK_M": "constexpr"}, dict(D=head_dim, BLOCK_M=pre["BLOCK_M"]),
                             pre["num_warps"], pre["num_stages"], triton.cdiv(bh * n, pre["BLOCK_M"])))
    plan.append(KernelLaunch("flash_bwd", _flash_bwd,
                             {**ptr("Q", "K", "V", "DO"), **ptr("LSE", "DELTA", "DQ", t="fp32"), **ptr("DK", "DV"),
                              "qk_scale": "fp32", "sm_scale": "fp32", **ints,
                              **dict.fromkeys(("D", "BLOCK_M", "BLOCK_N", "PREC"), "constexpr")},
                             dict(D=head_dim, BLOCK_M=b["BLOCK_M"], BLOCK_N=b["BLOCK_N"], PREC=prec),
                             b["num_warps"], b["num_stages"], triton.cdiv(m, b["BLOCK_N"]) * bh))
    plan.append(KernelLaunch("flash_dq_cast", _flash_dq_cast,
                             {**ptr("DQ_ACC", t="fp32"), **ptr("DQ"), "NUMEL": "i32", "BLOCK": "constexpr"},
                             dict(BLOCK=_CAST_BLOCK), 4, 1, triton.cdiv(bh * n * head_dim, _CAST_BLOCK)))
    return plan


def _interpreted() -> bool:
    return type(_flash_fwd).__name__ == "InterpretedFunction"


def _launch(kl: KernelLaunch, grid, *args):
    opts = {} if _interpreted() else dict(num_warps=kl.num_warps, num_stages=kl.num_stages)
    kl.fn[grid](*args, **kl.constexprs, **opts)


class _FlashFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sm_scale):
        bh, n, d = q.shape
        m = k.shape[1]
        fwd = kernel_launches(n, q.dtype, head_dim=d, bh=bh, need_grad=False, m=m)[0]
        o = torch.empty_like(q)
        lse = torch.empty(bh, n, device=q.device, dtype=torch.float32)
        _launch(fwd, (fwd.programs // bh, bh), q, k, v, o, lse, sm_scale * _LOG2E, n, m)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.sm_scale = sm_scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        do = do.contiguous()
        bh, n, d = q.shape
        m = k.shape[1]
        _, pre, bwd, cast = kernel_launches(n, q.dtype, head_dim=d, bh=bh, m=m)
        delta = torch.empty(bh, n, device=q.device, dtype=torch.float32)
        _launch(pre, (pre.programs,), o, do, delta, bh * n)
        dq_acc = torch.zeros(bh, n, d, device=q.device, dtype=torch.float32)
        dk, dv, dq = torch.empty_like(k), torch.empty_like(v), torch.empty_like(q)
        _launch(bwd, (bwd.programs // bh, bh), q, k, v, do, lse, delta, dq_acc, dk, dv,
                ctx.sm_scale * _LOG2E, ctx.sm_scale, n, m)
        _launch(cast, (cast.programs,), dq_acc, dq, dq.numel())
        return dq, dk, dv, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float | None = None):
    """softmax(q kᵀ · sm_scale) v for contiguous q (BH, N, d), k, v (BH, M, d), through the yardstick's kernels."""
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    return _FlashFn.apply(q.contiguous(), k.contiguous(), v.contiguous(), float(sm_scale))
