"""Exact entmax-1.5 / sparsemax attention in Triton: ``normaliser((q @ k^T) * scale) @ v`` without an N x N tensor.

```python
from backbones.triton_attention import sparse_attention
out = sparse_attention(q, k, v, scale, kind="entmax15")   # q (..., N, d), k (..., M, d), v (..., M, dv)
```

Same values and gradients as ``entmax.entmax15`` / ``entmax.sparsemax`` on the unfused scores, and as the
CPU ``backbones.entmax_fast.sparse_attention``. Inputs fp16/bf16/fp32; products accumulate in fp32, the
threshold is fp32; the output has the input's dtype (the CPU op returns fp32 for 16-bit inputs).

Structure (FlashAttention-2's tiling; AdaSplash's idea of a per-row threshold search over key blocks):
- forward, one program per (query block, batch*head):
  1. row max m over the key blocks, then z = (s - m)/2 (entmax-1.5) or s - m (sparsemax), tau in [-1, 0);
  2. Newton steps from tau = -1 on ||(z - t)_+|| - 1 (sparsemax: sum - 1), never overshooting, each one pass of
     block-wise sums (count, sum, sum of squares) over the keys; every pass also tests the previous pass's
     closed-form root on its support {z > t} (consistent with it = exact, as in entmax_fast), so a row
     stops one pass after its support settles. No fixed iteration count, no approximate tau;
  3. a last pass accumulates O = sum p v and, for the backward, Og = sum g v / sum g (g = dp/dz); key tiles
     where p = 0 in every row skip their products (the backward kernels too): sparsity saves work.
  For M <= 256 (ViT-S/16: 197 tokens, DINO's local crops: 37) one key block holds the whole row: the scores
  stay in registers and every pass after the first matmul is register arithmetic.
- backward, recomputing p from q, k, m, tau (FlashAttention): ds = g * (dp - delta) * scale with
  dp = dO v^T and delta = sum(g dp)/sum(g) = rowsum(dO * Og); g = sqrt(p) for entmax-1.5, [p > 0] for
  sparsemax. One kernel per key block for dK, dV, one per query block for dQ (no atomics).
Saved for the backward: q, k, v, Og and 2 floats per query row (m, tau), like SDPA's q, k, v, O, lse.

On CPU tensors the kernels run only under Triton's interpreter (``TRITON_INTERPRET=1`` set before Triton is
first imported): that is how the tests check them without a GPU. Under the interpreter bf16 products are
computed from operands widened to fp32 (same values; the interpreter's own bf16 ``tl.dot`` is wrong).
"""
from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton: available() is False and the model uses the PyTorch path
    triton = None

__all__ = ["sparse_attention", "available", "interpreted"]

_MAX_SWEEPS = 64  # a row not settled by then (never seen) keeps the closed-form root on its last support
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_SINGLE_MAX = 256  # keys up to this count (fp16/bf16; fp32: 128): one register block per row


def interpreted() -> bool:
    """True when the kernels were built for Triton's CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return triton is not None and type(_fwd_kernel).__name__ == "InterpretedFunction"


def available(x: torch.Tensor) -> bool:
    """Whether :func:`sparse_attention` can run on tensors like ``x`` here (fp16/bf16/fp32)."""
    return x.dtype in _DTYPES and _device_ok(x)


def _device_ok(x: torch.Tensor) -> bool:
    return triton is not None and (x.is_cuda or (interpreted() and x.device.type == "cpu"))


if triton is not None:

    @triton.jit
    def _dot(a, b, PREC: tl.constexpr):
        """a @ b, fp32 accumulation. PREC "upcast": in fp32 from bf16 operands (same products; the interpreter's
        bf16 dot is wrong), "ieee": exact fp32 (no TF32 for fp32 inputs), "tf32": the 16-bit tensor-core dot."""
        if PREC == "upcast":
            return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        return tl.dot(a, b, input_precision=PREC)

    @triton.jit
    def _z_block(q, K, kv_off, start, m, scale, M, D: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_D: tl.constexpr, ENTMAX: tl.constexpr, PREC: tl.constexpr):
        """Scores s = (q k^T) * scale of one key block, z = (s - m)/2 or s - m; keys past M get -inf."""
        offs_n = start + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        k = tl.load(K + kv_off + offs_n[:, None] * D + offs_d[None, :],
                    mask=(offs_n[:, None] < M) & (offs_d[None, :] < D), other=0.0)
        s = _dot(q, tl.trans(k), PREC) * scale
        s = tl.where(offs_n[None, :] < M, s, float("-inf"))
        z = s - m[:, None]
        if ENTMAX:
            z = z * 0.5
        return z

    @triton.jit
    def _sums(z, t, c):
        """Per row: support size, sum and sum of squares of d = (z - t)_+, and #{z > c}."""
        d = tl.maximum(z - t[:, None], 0.0)
        return (tl.sum((d > 0).to(tl.float32), 1), tl.sum(d, 1), tl.sum(d * d, 1),
                tl.sum((z > c[:, None]).to(tl.float32), 1))

    @triton.jit
    def _p_g(z, tau, ENTMAX: tl.constexpr):
        """Probabilities p and g = dp/dz / (dp/dz scale): sqrt(p) for entmax-1.5, [p > 0] for sparsemax."""
        d = tl.maximum(z - tau[:, None], 0.0)
        if ENTMAX:
            return d * d, d
        return d, (d > 0).to(tl.float32)

    @triton.jit
    def _row_max(q, K, k_off, zero, scale, M, D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                 ENTMAX: tl.constexpr, SINGLE: tl.constexpr, PREC: tl.constexpr):
        """Step 1: row max m of the scores and, with one key block (SINGLE), that block's z kept in registers
        (z's max is then 0 and tau lies in [-1, 0)); without, z is recomputed per pass and ``m`` stands in."""
        if SINGLE:
            z0 = _z_block(q, K, k_off, 0, zero, scale, M, D, BLOCK_N, BLOCK_D, False, PREC)
            m = tl.max(z0, 1)
            z0 = z0 - m[:, None]
            if ENTMAX:
                z0 = z0 * 0.5
        else:
            m = zero + float("-inf")
            for start in range(0, M, BLOCK_N):
                m = tl.maximum(m, tl.max(_z_block(q, K, k_off, start, zero, scale, M, D, BLOCK_N, BLOCK_D,
                                                  False, PREC), 1))
            z0 = m
        return m, z0

    @triton.jit
    def _pass_sums(z0, q, K, k_off, m, t, c, zero, scale, M, D: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_D: tl.constexpr, ENTMAX: tl.constexpr, SINGLE: tl.constexpr, PREC: tl.constexpr):
        """One pass over the keys: ``_sums`` of every key block added up."""
        if SINGLE:
            k_t, s1, s2, n_c = _sums(z0, t, c)
        else:
            k_t, s1, s2, n_c = zero, zero, zero, zero
            for start in range(0, M, BLOCK_N):
                z = _z_block(q, K, k_off, start, m, scale, M, D, BLOCK_N, BLOCK_D, ENTMAX, PREC)
                a, b, e, f = _sums(z, t, c)
                k_t, s1, s2, n_c = k_t + a, s1 + b, s2 + e, n_c + f
        return k_t, s1, s2, n_c

    @triton.jit
    def _newton(k_t, s1, s2, ENTMAX: tl.constexpr):
        """(u, step): the closed-form root offset on the current support and the Newton step from below."""
        if ENTMAX:
            norm = tl.sqrt(s2)
            step = (s2 - norm) / s1
            mean = s1 / k_t
            u = mean - tl.sqrt(tl.maximum((1.0 - (s2 - s1 * mean)) / k_t, 0.0))
        else:
            u = (s1 - 1.0) / k_t
            step = u
        return u, step

    @triton.jit
    def _threshold(z0, q, K, k_off, m, zero, scale, M, D: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, ENTMAX: tl.constexpr, SINGLE: tl.constexpr,
                   MAX_SWEEPS: tl.constexpr, PREC: tl.constexpr):
        """Step 2: tau per row; Newton from below + closed-form root on the support, tested one pass later."""
        t = zero - 1.0
        c = t            # candidate root from the previous pass
        c_sup = zero     # support size it was computed on (-1: none to test)
        c_ok = zero > 1  # candidate >= its t (a root on that support can be accepted)
        tau = zero
        done = zero > 1
        sweep = tl.full([], 0, tl.int32)  # loop-carried: Triton values, not Python ints
        left = tl.full([], BLOCK_M, tl.int32)
        while left > 0:
            k_t, s1, s2, n_c = _pass_sums(z0, q, K, k_off, m, t, c, zero, scale, M, D, BLOCK_N, BLOCK_D, ENTMAX,
                                          SINGLE, PREC)
            hit = ~done & c_ok & (n_c == c_sup)  # {z > c} == {z > t_prev}: c is the exact root
            tau = tl.where(hit, c, tau)
            done = done | hit
            u, step = _newton(k_t, s1, s2, ENTMAX)
            sweep += 1
            # no progress left in floating point, or out of sweeps: the root on the current support
            fin = ~done & (~(step > 0) | (sweep >= MAX_SWEEPS))
            tau = tl.where(fin, t + u, tau)
            done = done | fin
            c, c_sup, c_ok = t + u, k_t, u >= 0
            t = t + step
            left = tl.sum((~done).to(tl.int32), 0)
        return tau

    @triton.jit
    def _weighted_values(z0, q, K, V, k_off, v_off, m, tau, zero, scale, M, D: tl.constexpr, DV: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                         BLOCK_DV: tl.constexpr, ENTMAX: tl.constexpr, SINGLE: tl.constexpr, PREC: tl.constexpr):
        """Step 3: sum p v, sum g v and sum g per row; key tiles outside every row's support are skipped."""
        offs_dv = tl.arange(0, BLOCK_DV)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
        acc_g = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
        g_sum = zero
        for start in range(0, M, BLOCK_N):
            if SINGLE:
                z = z0
            else:
                z = _z_block(q, K, k_off, start, m, scale, M, D, BLOCK_N, BLOCK_D, ENTMAX, PREC)
            p, g = _p_g(z, tau, ENTMAX)
            if tl.max(tl.max(g, 1), 0) > 0:  # sparse: a tile outside every row's support adds nothing
                offs_n = start + tl.arange(0, BLOCK_N)
                v = tl.load(V + v_off + offs_n[:, None] * DV + offs_dv[None, :],
                            mask=(offs_n[:, None] < M) & (offs_dv[None, :] < DV), other=0.0)
                acc += _dot(p.to(v.dtype), v, PREC)
                acc_g += _dot(g.to(v.dtype), v, PREC)
            g_sum += tl.sum(g, 1)
        return acc, acc_g, g_sum

    @triton.jit
    def _fwd_kernel(Q, K, V, O, OG, STATS, scale, N, M,
                    D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, ENTMAX: tl.constexpr,
                    SINGLE: tl.constexpr, MAX_SWEEPS: tl.constexpr, PREC: tl.constexpr):
        """O = sum p v, OG = sum g v / sum g and (m, tau) per query row, for one query block and batch*head."""
        bh = tl.program_id(1)
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        q = tl.load(Q + bh * N * D + offs_m[:, None] * D + offs_d[None, :],
                    mask=(offs_m[:, None] < N) & (offs_d[None, :] < D), other=0.0)
        k_off, v_off = bh * M * D, bh * M * DV
        zero = tl.zeros([BLOCK_M], dtype=tl.float32)
        m, z0 = _row_max(q, K, k_off, zero, scale, M, D, BLOCK_N, BLOCK_D, ENTMAX, SINGLE, PREC)
        tau = _threshold(z0, q, K, k_off, m, zero, scale, M, D, BLOCK_M, BLOCK_N, BLOCK_D, ENTMAX, SINGLE,
                         MAX_SWEEPS, PREC)
        acc, acc_g, g_sum = _weighted_values(z0, q, K, V, k_off, v_off, m, tau, zero, scale, M, D, DV, BLOCK_M,
                                             BLOCK_N, BLOCK_D, BLOCK_DV, ENTMAX, SINGLE, PREC)
        offs_dv = tl.arange(0, BLOCK_DV)
        out_mask = (offs_m[:, None] < N) & (offs_dv[None, :] < DV)
        o_ptrs = bh * N * DV + offs_m[:, None] * DV + offs_dv[None, :]
        tl.store(O + o_ptrs, acc.to(O.dtype.element_ty), mask=out_mask)
        tl.store(OG + o_ptrs, (acc_g / g_sum[:, None]).to(OG.dtype.element_ty), mask=out_mask)
        row = offs_m < N
        tl.store(STATS + (bh * N + offs_m) * 2, m, mask=row)
        tl.store(STATS + (bh * N + offs_m) * 2 + 1, tau, mask=row)

    @triton.jit
    def _bwd_rows(Q, DO, OG, STATS, bh, start_m, N, D: tl.constexpr, DV: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
        """A query block's q, dO, m, tau and delta = rowsum(dO * Og); rows past N are zeros."""
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        row = offs_m < N
        q = tl.load(Q + bh * N * D + offs_m[:, None] * D + offs_d[None, :],
                    mask=row[:, None] & (offs_d[None, :] < D), other=0.0)
        o_ptrs = bh * N * DV + offs_m[:, None] * DV + offs_dv[None, :]
        o_mask = row[:, None] & (offs_dv[None, :] < DV)
        do = tl.load(DO + o_ptrs, mask=o_mask, other=0.0)
        og = tl.load(OG + o_ptrs, mask=o_mask, other=0.0)
        delta = tl.sum(do.to(tl.float32) * og.to(tl.float32), 1)
        m = tl.load(STATS + (bh * N + offs_m) * 2, mask=row, other=0.0)
        tau = tl.load(STATS + (bh * N + offs_m) * 2 + 1, mask=row, other=0.0)
        return q, do, m, tau, delta

    @triton.jit
    def _p_tile(q, k, m, tau, start_n, scale, M, BLOCK_N: tl.constexpr, ENTMAX: tl.constexpr,
                PREC: tl.constexpr):
        """p and g of one (query block, key block) tile, recomputed with the forward's arithmetic."""
        offs_n = start_n + tl.arange(0, BLOCK_N)
        s = _dot(q, tl.trans(k), PREC) * scale
        z = tl.where(offs_n[None, :] < M, s, float("-inf")) - m[:, None]
        if ENTMAX:
            z = z * 0.5
        return _p_g(z, tau, ENTMAX)

    @triton.jit
    def _bwd_kv_kernel(Q, K, V, DO, OG, STATS, DK, DV_, scale, N, M,
                       D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, ENTMAX: tl.constexpr,
                       PREC: tl.constexpr):
        bh = tl.program_id(1)
        start_n = tl.program_id(0) * BLOCK_N
        offs_n = start_n + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        k_ptrs = bh * M * D + offs_n[:, None] * D + offs_d[None, :]
        k_mask = (offs_n[:, None] < M) & (offs_d[None, :] < D)
        v_ptrs = bh * M * DV + offs_n[:, None] * DV + offs_dv[None, :]
        v_mask = (offs_n[:, None] < M) & (offs_dv[None, :] < DV)
        k = tl.load(K + k_ptrs, mask=k_mask, other=0.0)
        v = tl.load(V + v_ptrs, mask=v_mask, other=0.0)
        dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
        for start_m in range(0, N, BLOCK_M):
            q, do, m, tau, delta = _bwd_rows(Q, DO, OG, STATS, bh, start_m, N, D, DV, BLOCK_M, BLOCK_D, BLOCK_DV)
            p, g = _p_tile(q, k, m, tau, start_n, scale, M, BLOCK_N, ENTMAX, PREC)
            if tl.max(tl.max(g, 1), 0) > 0:  # all-zero tile: no dV, and ds = g * (...) = 0
                dv += _dot(tl.trans(p.to(do.dtype)), do, PREC)
                ds = g * (_dot(do, tl.trans(v), PREC) - delta[:, None])
                dk += _dot(tl.trans(ds.to(q.dtype)), q, PREC)
        tl.store(DK + k_ptrs, (dk * scale).to(DK.dtype.element_ty), mask=k_mask)
        tl.store(DV_ + v_ptrs, dv.to(DV_.dtype.element_ty), mask=v_mask)

    @triton.jit
    def _bwd_q_kernel(Q, K, V, DO, OG, STATS, DQ, scale, N, M,
                      D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, ENTMAX: tl.constexpr,
                      PREC: tl.constexpr):
        bh = tl.program_id(1)
        start_m = tl.program_id(0) * BLOCK_M
        q, do, m, tau, delta = _bwd_rows(Q, DO, OG, STATS, bh, start_m, N, D, DV, BLOCK_M, BLOCK_D, BLOCK_DV)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        for start_n in range(0, M, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            k = tl.load(K + bh * M * D + offs_n[:, None] * D + offs_d[None, :],
                        mask=(offs_n[:, None] < M) & (offs_d[None, :] < D), other=0.0)
            v = tl.load(V + bh * M * DV + offs_n[:, None] * DV + offs_dv[None, :],
                        mask=(offs_n[:, None] < M) & (offs_dv[None, :] < DV), other=0.0)
            _, g = _p_tile(q, k, m, tau, start_n, scale, M, BLOCK_N, ENTMAX, PREC)
            if tl.max(tl.max(g, 1), 0) > 0:
                ds = g * (_dot(do, tl.trans(v), PREC) - delta[:, None])
                dq += _dot(ds.to(k.dtype), k, PREC)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        tl.store(DQ + bh * N * D + offs_m[:, None] * D + offs_d[None, :], (dq * scale).to(DQ.dtype.element_ty),
                 mask=(offs_m[:, None] < N) & (offs_d[None, :] < D))


def _meta(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, entmax: bool) -> dict:
    d, dv, m = q.shape[-1], v.shape[-1], k.shape[-2]
    return dict(D=d, DV=dv, BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_DV=max(16, triton.next_power_of_2(dv)),
                ENTMAX=entmax, PREC="ieee" if q.dtype == torch.float32 else
                "upcast" if q.dtype == torch.bfloat16 and interpreted() else "tf32")


def _launch_cfg(q: torch.Tensor) -> dict:
    return {} if interpreted() else dict(num_warps=4 if q.shape[-1] <= 64 else 8, num_stages=1)


class _TritonSparseAttentionFn(torch.autograd.Function):
    """q (BH, N, d), k (BH, M, d), v (BH, M, dv): contiguous, one dtype."""

    @staticmethod
    def forward(ctx, q, k, v, scale: float, entmax: bool):
        bh, n, _ = q.shape
        m_keys = k.shape[1]
        meta = _meta(q, k, v, entmax)
        single = m_keys <= _SINGLE_MAX // (1 if q.element_size() == 2 else 2)  # fp32: half the shared memory
        block_n = max(16, triton.next_power_of_2(m_keys)) if single else 64
        block_m = 32 if single and block_n > 128 else 64
        o = q.new_empty(bh, n, v.shape[-1])
        og = torch.empty_like(o)
        stats = torch.empty(bh, n, 2, device=q.device, dtype=torch.float32)
        grid = (triton.cdiv(n, block_m), bh)
        _fwd_kernel[grid](q, k, v, o, og, stats, scale, n, m_keys, BLOCK_M=block_m, BLOCK_N=block_n,
                          SINGLE=single, MAX_SWEEPS=_MAX_SWEEPS, **meta, **_launch_cfg(q))
        ctx.save_for_backward(q, k, v, og, stats)
        ctx.scale, ctx.entmax = scale, entmax
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, og, stats = ctx.saved_tensors
        do = do.to(q.dtype).contiguous()
        bh, n, _ = q.shape
        m_keys = k.shape[1]
        meta = _meta(q, k, v, ctx.entmax)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        block_m, block_n = 64, 64
        args = (q, k, v, do, og, stats)
        _bwd_kv_kernel[(triton.cdiv(m_keys, block_n), bh)](*args, dk, dv, ctx.scale, n, m_keys, BLOCK_M=block_m,
                                                            BLOCK_N=block_n, **meta, **_launch_cfg(q))
        _bwd_q_kernel[(triton.cdiv(n, block_m), bh)](*args, dq, ctx.scale, n, m_keys, BLOCK_M=block_m,
                                                      BLOCK_N=block_n, **meta, **_launch_cfg(q))
        return dq, dk, dv, None, None


def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                     kind: str = "entmax15") -> torch.Tensor:
    """``normaliser((q @ k^T) * scale) @ v`` over the keys, normaliser entmax-1.5 or sparsemax, in Triton.

    q (..., N, d), k (..., M, d), v (..., M, dv), same leading dims, on CUDA (or CPU under
    ``TRITON_INTERPRET=1``). Mixed dtypes are cast to the autocast dtype when autocast is on, else to
    q's dtype. No mask and no attention dropout (the attention layer's unfused path covers those).
    """
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
    lead, n, m = q.shape[:-2], q.shape[-2], k.shape[-2]
    q3, k3, v3 = (x.to(dt).reshape(-1, x.shape[-2], x.shape[-1]).contiguous() for x in (q, k, v))
    with torch.autocast(device_type=dev, enabled=False):
        out = _TritonSparseAttentionFn.apply(q3, k3, v3, float(scale), kind == "entmax15")
    return out.view(*lead, n, v.shape[-1])
