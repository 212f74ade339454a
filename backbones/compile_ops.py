"""``torch.compile`` support: the fused sparse attention as two opaque ``torch.library`` custom ops
(``tokenmix::sparse_attn_fwd`` / ``_bwd``) with shape-only fake kernels. ``entmax_fast`` calls its C++ kernel
through ctypes on raw pointers, which the compiler cannot trace (every attention layer would split the graph).
``backbones.attention`` calls these ops only while ``torch.compile`` traces; eager code never goes through them.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import Tensor

from backbones import entmax_fast as ef


def _dtype(q: Tensor) -> torch.dtype:
    return q.dtype if q.dtype in ef._SUFFIX else torch.float32  # as entmax_fast._logits


@torch.library.custom_op("tokenmix::sparse_attn_fwd", mutates_args=())
def _fwd(q: Tensor, k: Tensor, v: Tensor, scale: float, entmax15: bool, backend: str) -> tuple[Tensor, Tensor]:
    with torch.autocast(device_type=q.device.type, enabled=False):
        out, mt, _ = ef._attention_forward(q, k, v, scale, entmax15, backend)
        return out, mt


@_fwd.register_fake
def _(q, k, v, scale, entmax15, backend):
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    rows = q.shape[-2]
    for b in batch:
        rows = rows * b
    dt = _dtype(q)
    return q.new_empty((*batch, q.shape[-2], v.shape[-1]), dtype=dt), q.new_empty((rows, 2), dtype=dt)


@torch.library.custom_op("tokenmix::sparse_attn_bwd", mutates_args=())
def _bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, mt: Tensor, scale: float,
         entmax15: bool, backend: str) -> tuple[Tensor, Tensor, Tensor]:
    cpp = ef._use_cpp(mt.new_empty(0, 0), backend)  # same choice as the forward (device and dtype decide it)
    ctx = SimpleNamespace(saved_tensors=(q, k, v, mt), scale=scale, entmax15=entmax15, cpp=cpp)
    with torch.autocast(device_type=dout.device.type, enabled=False):
        dq, dk, dv = ef._SparseAttentionFn._backward(ctx, dout)[:3]
    return dq, dk, dv


@_bwd.register_fake
def _(dout, q, k, v, mt, scale, entmax15, backend):
    # the real gradients come from matmuls: contiguous, whatever the inputs' strides
    return (q.new_empty(q.shape, dtype=q.dtype), k.new_empty(k.shape, dtype=k.dtype),
            v.new_empty(v.shape, dtype=v.dtype))


def _setup_context(ctx, inputs, output):
    q, k, v, scale, entmax15, backend = inputs
    ctx.save_for_backward(q, k, v, output[1])
    ctx.scale, ctx.entmax15, ctx.backend = scale, entmax15, backend


def _backward(ctx, dout, _dmt):
    q, k, v, mt = ctx.saved_tensors
    dq, dk, dv = _bwd(dout, q, k, v, mt, ctx.scale, ctx.entmax15, ctx.backend)
    return dq, dk, dv, None, None, None


_fwd.register_autograd(_backward, setup_context=_setup_context)


def sparse_attention_op(q: Tensor, k: Tensor, v: Tensor, scale: float, kind: str = "entmax15",
                        backend: str = ef.DEFAULT_BACKEND) -> Tensor:
    """``entmax_fast.sparse_attention`` through the custom ops (same arguments, checks and values)."""
    if kind not in ("entmax15", "sparsemax"):
        raise ValueError(f"sparse_attention kind must be 'entmax15' or 'sparsemax', got '{kind}'")
    if q.dim() < 2 or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"sparse_attention expects q (..., N, d), k (..., M, d), v (..., M, dv); got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    ef._check_backend(backend)
    return _fwd(q, k, v, float(scale), kind == "entmax15", backend)[0]
