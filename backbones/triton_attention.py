"""Exact entmax-1.5 / sparsemax attention in Triton: ``normaliser((q @ k^T) * scale) @ v`` without an N x N tensor.

Same values and gradients as ``entmax.entmax15`` / ``entmax.sparsemax`` on the unfused scores, and as the CPU
``entmax_fast.sparse_attention``. fp16/bf16/fp32 in, fp32 accumulation and threshold, output in the input's dtype;
fp32 uses tf32 when torch's float32 matmul precision allows (as SDPA does).

Kernels: ``triton_kernels.py`` (forward), ``triton_kernels_bwd.py`` (backward), block sizes in ``triton_plan``;
design and costs: docs/performance.md, "Triton kernel design". Per 64-row program: the row max of s = q k^T, then
tau from t = -1 by passes that solve the closed form on S = {z > t}, exact when no key lies between t and the
root on tau's side (no fixed iteration count: ``threshold_passes`` counts them), then O = sum p v written as
(B, N, H, dv) (plus Og = sum g v / sum g for the backward's delta). The backward recomputes p from the saved
(zmax, tau): FlashAttention-2's five GEMMs, or an atomic-free pair under ``torch.use_deterministic_algorithms``.
q, k, v and dO are read through their strides (the fused qkv's slices: no copies). The ops are ``torch.library``
custom ops with fake kernels, so ``torch.compile`` sees one opaque op each.

On CPU tensors the kernels run only under Triton's interpreter (``TRITON_INTERPRET=1`` before Triton is first
imported), which is how the tests check them; there bf16 products use operands widened to fp32 (the
interpreter's own bf16 ``tl.dot`` is wrong).
"""
from __future__ import annotations

import torch
from torch import Tensor

from . import canary
from . import triton_kernels as tk
from . import triton_plan as tp
from .triton_plan import _DTYPES, KernelLaunch, interpreted, kernel_launches

triton = tk.triton
__all__ = ["sparse_attention", "available", "interpreted", "kernel_launches", "KernelLaunch", "threshold_passes",
           "check_launch_limits"]
_MAX_GRID_Y = 65_535  # CUDA's gridDim.y limit: the kernels' second grid dimension is batch x heads
_MAX_OFFSET = 2 ** 31 - 1  # the kernels compute element offsets (index x stride) in 32-bit integers


def available(x: torch.Tensor) -> bool:
    """Whether :func:`sparse_attention` can run on tensors like ``x`` here (fp16/bf16/fp32)."""
    return x.dtype in _DTYPES and _device_ok(x)


def _device_ok(x: torch.Tensor) -> bool:
    return triton is not None and (x.is_cuda or (interpreted() and x.device.type == "cpu"))


def _opts(opts: dict) -> dict:
    return {} if interpreted() else opts


def _reach(x: Tensor) -> int:
    """The largest element offset the kernels compute into ``x`` (B, H, N, d) through its strides."""
    (b, h, n, d), (sb, sh, sn, sd) = x.shape, x.stride()
    return (b - 1) * abs(sb) + (h - 1) * abs(sh) + (n - 1) * abs(sn) + (d - 1) * abs(sd)


def check_launch_limits(q: Tensor, k: Tensor, v: Tensor) -> None:
    """ValueError, before any launch, where q, k, v (B, H, N, d) exceed what the kernels can address: batch x heads
    programs in the grid's second dimension (at most 65,535), element offsets in 32 bits (q, k, v through their
    strides, and the contiguous outputs and fp32 buffers; for the slices of a ViT's fused qkv (B, N, 3, H, d) that
    is B x N <= 2^31 / (3 H d): 1.86 M images x tokens for ViT-S). A few integer operations per call."""
    b, h, n, d = q.shape
    if b * h > _MAX_GRID_Y:
        raise ValueError(f"sparse_attention (Triton): batch x heads = {b} x {h} = {b * h} exceeds the grid's second "
                         f"dimension ({_MAX_GRID_Y:,} programs, CUDA's gridDim.y): split the batch into parts of at "
                         f"most {_MAX_GRID_Y // h} items")
    reach = (_reach(q), _reach(k), _reach(v), b * h * n * max(d, v.shape[-1], 2))
    if max(reach) > _MAX_OFFSET:
        name, most = max(zip(("q", "k", "v", "the outputs"), reach), key=lambda t: t[1])
        raise ValueError(f"sparse_attention (Triton): offsets into {name} reach {most:,} elements, past the kernels' "
                         f"32-bit offsets ({_MAX_OFFSET:,}); shapes q {tuple(q.shape)}, k {tuple(k.shape)}: split "
                         f"the batch into parts of at most {max(1, b * _MAX_OFFSET // most)} items")


# ------------------------------------------------------------------------------------------- custom ops
def _strides(x: Tensor) -> tuple[int, int, int]:
    return x.stride(0), x.stride(1), x.stride(2)


def _arch(x: Tensor) -> int:
    """The compute capability of x's GPU as 90 / 80 / ...; 90 under the interpreter (the blocks of the H100)."""
    if not x.is_cuda:
        return 90
    major, minor = torch.cuda.get_device_capability(x.device)
    return 10 * major + minor


def _unit_last(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _out(q: Tensor, v: Tensor) -> Tensor:
    """O (B, H, N, dv) laid out as (B, N, H, dv): the layer's transpose(1, 2).reshape is then free."""
    b, h, n = q.shape[:3]
    return q.new_empty(b, n, h, v.shape[-1]).transpose(1, 2)


def _forward(q: Tensor, k: Tensor, v: Tensor, scale: float, entmax: bool, need_grad: bool, count: bool,
             single: bool | None = None):
    b, h, n, d = q.shape
    q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
    o = _out(q, v)
    og = q.new_empty(b, h, n if need_grad else 0, v.shape[-1])
    stats = torch.empty(b, h, n, 2, device=q.device, dtype=torch.float32)
    passes = torch.zeros(b, h, n if count else 0, device=q.device, dtype=torch.int32)
    _, fn, grid, consts, opts = tp._plan(n, k.shape[2], q.dtype, d, v.shape[-1], b * h, entmax, need_grad, count,
                                         arch=_arch(q), single=single)[0]
    fn[grid](q, k, v, o, og, stats, passes, scale, n, k.shape[2], h, *_strides(q), *_strides(k), *_strides(v),
             *_strides(o), **consts, **_opts(opts))
    return o, og, stats, passes


@torch.library.custom_op("tokenmix::triton_sparse_attention", mutates_args=())
def _fwd_op(q: Tensor, k: Tensor, v: Tensor, scale: float, entmax: bool,
            need_grad: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(o, og, stats) for q (B, H, N, d), k (B, H, M, d), v (B, H, M, dv) of one dtype, any strides; og
    (B, H, N, dv) is empty (N = 0) without ``need_grad``; stats (B, H, N, 2) = (zmax, tau) per row."""
    return _forward(q, k, v, scale, entmax, need_grad, False)[:3]


@_fwd_op.register_fake
def _(q, k, v, scale, entmax, need_grad):
    b, h, n, _ = q.shape
    return _out(q, v), q.new_empty(b, h, n if need_grad else 0, v.shape[-1]), \
        q.new_empty(b, h, n, 2, dtype=torch.float32)


@torch.library.custom_op("tokenmix::triton_sparse_attention_bwd", mutates_args=())
def _bwd_op(do: Tensor, q: Tensor, k: Tensor, v: Tensor, og: Tensor, stats: Tensor, scale: float,
            entmax: bool) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv (contiguous) for the forward's saved q, k, v, og, stats."""
    q, k, v, do = _unit_last(q), _unit_last(k), _unit_last(v), _unit_last(do.to(q.dtype))
    b, h, n, d = q.shape
    m = k.shape[2]
    dq, dk, dv = (torch.empty(x.shape, device=x.device, dtype=x.dtype) for x in (q, k, v))
    strides = (*_strides(q), *_strides(k), *_strides(v), *_strides(do))
    det = torch.are_deterministic_algorithms_enabled()
    plan = [(fn, grid, consts, _opts(opts)) for _, fn, grid, consts, opts in
            tp._plan(n, m, q.dtype, d, v.shape[-1], b * h, entmax, True, deterministic=det, arch=_arch(q))[1:]]
    if det:  # no atomics: dK, dV per key block, then dQ per query block
        for (fn, grid, consts, opts), outs in zip(plan, ((dk, dv), (dq,))):
            fn[grid](q, k, v, do, og, stats, *outs, scale, n, m, h, *strides, **consts, **opts)
        return dq, dk, dv
    (f_delta, g_delta, c_delta, o_delta), (f_bwd, g_bwd, c_bwd, o_bwd), (f_cast, g_cast, c_cast, o_cast) = plan
    delta = torch.empty(b, h, n, device=q.device, dtype=torch.float32)
    dq_acc = torch.zeros(b, h, n, d, device=q.device, dtype=torch.float32)
    f_delta[g_delta](do, og, delta, n, h, *_strides(do), **c_delta, **o_delta)
    f_bwd[g_bwd](q, k, v, do, delta, stats, dk, dv, dq_acc, scale, n, m, h, *strides, **c_bwd, **o_bwd)
    f_cast[g_cast](dq_acc, dq, dq.numel(), **c_cast, **o_cast)
    return dq, dk, dv


@_bwd_op.register_fake
def _(do, q, k, v, og, stats, scale, entmax):
    return tuple(torch.empty(x.shape, device=x.device, dtype=x.dtype) for x in (q, k, v))


def _setup_context(ctx, inputs, output):
    q, k, v, scale, entmax, need_grad = inputs
    _, og, stats = output
    ctx.save_for_backward(q, k, v, og, stats)
    ctx.scale, ctx.entmax = scale, entmax
    ctx.mark_non_differentiable(og, stats)


def _backward(ctx, do, _dog, _dstats):
    q, k, v, og, stats = ctx.saved_tensors
    if og.shape[2] != q.shape[2]:
        raise RuntimeError("triton_sparse_attention: the forward ran without gradients enabled")
    dq, dk, dv = _bwd_op(do, q, k, v, og, stats, ctx.scale, ctx.entmax)
    return dq, dk, dv, None, None, None


_fwd_op.register_autograd(_backward, setup_context=_setup_context)


def _four_d(x: Tensor) -> Tensor:
    """(..., N, d) as (B, H, N, d), a view whenever the leading dims allow one."""
    lead = x.shape[:-2]
    if len(lead) == 2:
        return x
    if len(lead) < 2:
        return x.reshape((1,) * (2 - len(lead)) + x.shape)
    return x.reshape(-1, lead[-1], *x.shape[-2:])


def threshold_passes(scores: Tensor, kind: str = "entmax15", single: bool | None = None) -> Tensor:
    """Per-row number of passes the forward kernel's threshold search takes on ``scores`` (..., N, M) (the kernel
    itself, exact fp32 products on q = scores, k = identity). ``single``: count the 16-bit forward's path, register
    tiles up to 272 keys (True) or 64-key blocks (False); default: exact fp32's own path."""
    if single and scores.shape[-1] > tp._SINGLE_MAX:
        raise ValueError(f"threshold_passes: the register-tile path holds at most {tp._SINGLE_MAX} keys, "
                         f"got {scores.shape[-1]}")
    lead, n, m = scores.shape[:-2], scores.shape[-2], scores.shape[-1]
    q = _four_d(scores.float())
    eye = torch.eye(m, device=scores.device).expand(*q.shape[:2], m, m)
    check_launch_limits(q, eye, eye)
    with torch.autocast(device_type=scores.device.type, enabled=False):
        prec = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")  # exact s = q I in fp32
        try:
            passes = _forward(q, eye, eye, 1.0, kind == "entmax15", False, True, single)[3]
        finally:
            torch.set_float32_matmul_precision(prec)
    return passes.reshape(*lead, n)


def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                     kind: str = "entmax15") -> torch.Tensor:
    """``normaliser((q @ k^T) * scale) @ v``, normaliser entmax-1.5 or sparsemax, in Triton: q (..., N, d),
    k (..., M, d), v (..., M, dv) on CUDA (or CPU under ``TRITON_INTERPRET=1``), cast to the autocast dtype when
    autocast is on, else to q's. No mask and no attention dropout."""
    if kind not in ("entmax15", "sparsemax"):
        raise ValueError(f"sparse_attention kind must be 'entmax15' or 'sparsemax', got '{kind}'")
    if q.dim() < 2 or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2] or \
            not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(f"sparse_attention expects q (..., N, d), k (..., M, d), v (..., M, dv); got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    dev = q.device.type
    dt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else q.dtype
    if dt not in _DTYPES:
        raise TypeError(f"sparse_attention (Triton) supports fp16, bf16 and fp32, got {dt}")
    if not _device_ok(q):
        raise RuntimeError("backbones.triton_attention needs Triton and CUDA tensors (or CPU tensors with "
                           f"TRITON_INTERPRET=1 set before import); got {q.device} "
                           f"({'no Triton' if triton is None else 'Triton compiled mode'})")
    lead, n = q.shape[:-2], q.shape[-2]
    need_grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
    q4, k4, v4 = (_four_d(x.to(dt)) for x in (q, k, v))
    check_launch_limits(q4, k4, v4)
    entmax = kind == "entmax15"
    with torch.autocast(device_type=dev, enabled=False):
        if canary.trusted((dt, n, k.shape[-2], entmax, need_grad), q4, k4, v4, float(scale), _forward, _bwd_op,
                          tp._MAX_PASSES):
            out = _fwd_op(q4, k4, v4, float(scale), entmax, need_grad)[0]
        else:  # the canary failed and TOKENMIX_TRITON_CANARY=fallback: the torch path (fp32, as the CPU op)
            from .entmax_fast import sparse_attention as torch_path
            out = torch_path(q4, k4, v4, float(scale), kind).to(dt)
    return out if len(lead) == 2 else out.reshape(*lead, n, v.shape[-1])
