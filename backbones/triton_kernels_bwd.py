"""The Triton backward kernels behind ``backbones.triton_attention`` (notation: ``backbones.triton_kernels``):
FlashAttention-2's five GEMMs per tile, dQ added atomically in fp32 (``_bwd_delta_kernel``, ``_bwd_kernel``,
``_bwd_dq_cast_kernel``), or under torch's deterministic mode no atomics (``_bwd_kv_kernel``, ``_bwd_q_kernel``:
seven GEMMs per tile pair, delta recomputed per tile).
"""
from __future__ import annotations

from .triton_kernels import triton

if triton is not None:
    import triton.language as tl

    from .triton_kernels import _p_g
    from .triton_tiles import _dot, _rows

    @triton.jit
    def _z_tile(q, k, start, m, coef, zmax, BLOCK_N: tl.constexpr, PREC: tl.constexpr):
        """z = coef * (q k^T) - zmax for one key block; keys past m get -inf."""
        offs_n = start + tl.arange(0, BLOCK_N)
        s = _dot(q, tl.trans(k), PREC) * coef
        return tl.where(offs_n[None, :] < m, s, float("-inf")) - zmax[:, None]

    @triton.jit
    def _bwd_rows(Q, DO, OG, STATS, b, h, bh, start_m, n, heads, sq_b, sq_h, sq_n, sd_b, sd_h, sd_n,
                  D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_DV: tl.constexpr):
        """A query block's q, dO, zmax, tau and delta = rowsum(dO * Og); rows past n are zeros."""
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row = offs_m < n
        q = _rows(Q, b * sq_b + h * sq_h, sq_n, start_m, n, BLOCK_M, BLOCK_D, D)
        do = _rows(DO, b * sd_b + h * sd_h, sd_n, start_m, n, BLOCK_M, BLOCK_DV, DV)
        og = _rows(OG, bh * n * DV, DV, start_m, n, BLOCK_M, BLOCK_DV, DV)
        delta = tl.sum(do.to(tl.float32) * og.to(tl.float32), 1)
        zmax = tl.load(STATS + (bh * n + offs_m) * 2, mask=row, other=0.0)
        tau = tl.load(STATS + (bh * n + offs_m) * 2 + 1, mask=row, other=0.0)
        return q, do, zmax, tau, delta

    @triton.jit
    def _key_block(K, V, scale, m, heads, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, D: tl.constexpr, DV: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, ENTMAX: tl.constexpr):
        """A backward key-block program's (bh, b, h, first key, coef) and its k and v rows."""
        bh = tl.program_id(1)
        b, h = bh // heads, bh % heads
        start_n = tl.program_id(0) * BLOCK_N
        coef = scale * 0.5 if ENTMAX else scale
        k = _rows(K, b * sk_b + h * sk_h, sk_n, start_n, m, BLOCK_N, BLOCK_D, D)
        v = _rows(V, b * sv_b + h * sv_h, sv_n, start_n, m, BLOCK_N, BLOCK_DV, DV)
        return bh, b, h, start_n, coef, k, v

    @triton.jit
    def _bwd_kv_kernel(Q, K, V, DO, OG, STATS, DK, DV_, scale, n, m, heads,
                       sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, sd_b, sd_h, sd_n,
                       D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, ENTMAX: tl.constexpr, PREC: tl.constexpr):
        """dK, dV of one key block: ds = g (dO v^T - delta) * coef over every query block (no atomics)."""
        bh, b, h, start_n, coef, k, v = _key_block(K, V, scale, m, heads, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, D, DV,
                                                   BLOCK_N, BLOCK_D, BLOCK_DV, ENTMAX)
        dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
        for start_m in range(0, n, BLOCK_M):
            q, do, zmax, tau, delta = _bwd_rows(Q, DO, OG, STATS, b, h, bh, start_m, n, heads, sq_b, sq_h, sq_n,
                                                sd_b, sd_h, sd_n, D, DV, BLOCK_M, BLOCK_D, BLOCK_DV)
            p, g = _p_g(_z_tile(q, k, start_n, m, coef, zmax, BLOCK_N, PREC), 1.0, tau, ENTMAX)
            if tl.max(tl.max(g, 1), 0) > 0:  # all-zero tile: no dV, and ds = g * (...) = 0
                dv += _dot(tl.trans(p.to(do.dtype)), do, PREC)
                ds = g * (_dot(do, tl.trans(v), PREC) - delta[:, None])
                dk += _dot(tl.trans(ds.to(q.dtype)), q, PREC)
        _store_dk_dv(DK, DV_, dk, dv, scale, bh, start_n, m, D, DV, BLOCK_N, BLOCK_D, BLOCK_DV)

    @triton.jit
    def _store_dk_dv(DK, DV_, dk, dv, scale, bh, start_n, m, D: tl.constexpr, DV: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
        """A key block's dK (times scale) and dV, contiguous (B*H, M, d), in their dtypes."""
        offs_n = start_n + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        tl.store(DK + (bh * m + offs_n[:, None]) * D + offs_d[None, :], (dk * scale).to(DK.dtype.element_ty),
                 mask=(offs_n[:, None] < m) & (offs_d[None, :] < D))
        tl.store(DV_ + (bh * m + offs_n[:, None]) * DV + offs_dv[None, :], dv.to(DV_.dtype.element_ty),
                 mask=(offs_n[:, None] < m) & (offs_dv[None, :] < DV))

    @triton.jit
    def _bwd_q_kernel(Q, K, V, DO, OG, STATS, DQ, scale, n, m, heads,
                      sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, sd_b, sd_h, sd_n,
                      D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, ENTMAX: tl.constexpr, PREC: tl.constexpr):
        """dQ of one query block over every key block."""
        bh = tl.program_id(1)
        b, h = bh // heads, bh % heads
        start_m = tl.program_id(0) * BLOCK_M
        coef = scale * 0.5 if ENTMAX else scale
        q, do, zmax, tau, delta = _bwd_rows(Q, DO, OG, STATS, b, h, bh, start_m, n, heads, sq_b, sq_h, sq_n,
                                            sd_b, sd_h, sd_n, D, DV, BLOCK_M, BLOCK_D, BLOCK_DV)
        dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        for start_n in range(0, m, BLOCK_N):
            k = _rows(K, b * sk_b + h * sk_h, sk_n, start_n, m, BLOCK_N, BLOCK_D, D)
            v = _rows(V, b * sv_b + h * sv_h, sv_n, start_n, m, BLOCK_N, BLOCK_DV, DV)
            _, g = _p_g(_z_tile(q, k, start_n, m, coef, zmax, BLOCK_N, PREC), 1.0, tau, ENTMAX)
            if tl.max(tl.max(g, 1), 0) > 0:
                ds = g * (_dot(do, tl.trans(v), PREC) - delta[:, None])
                dq += _dot(ds.to(k.dtype), k, PREC)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        tl.store(DQ + (bh * n + offs_m[:, None]) * D + offs_d[None, :], (dq * scale).to(DQ.dtype.element_ty),
                 mask=(offs_m[:, None] < n) & (offs_d[None, :] < D))


    @triton.jit
    def _bwd_delta_kernel(DO, OG, DELTA, n, heads, sd_b, sd_h, sd_n, DV: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_DV: tl.constexpr):
        """delta = rowsum(dO * Og) (fp32, (B*H, N)) once per query row for ``_bwd_kernel``: delta = sum g dp / sum g,
        and unlike softmax g = sqrt(p) != p (sparsemax: [p > 0]), so Og is the forward's own tensor."""
        bh = tl.program_id(1)
        b, h = bh // heads, bh % heads
        start_m = tl.program_id(0) * BLOCK_M
        do = _rows(DO, b * sd_b + h * sd_h, sd_n, start_m, n, BLOCK_M, BLOCK_DV, DV)
        og = _rows(OG, bh * n * DV, DV, start_m, n, BLOCK_M, BLOCK_DV, DV)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        tl.store(DELTA + bh * n + offs_m, tl.sum(do.to(tl.float32) * og.to(tl.float32), 1), mask=offs_m < n)

    @triton.jit
    def _bwd_kernel(Q, K, V, DO, DELTA, STATS, DK, DV_, DQ_ACC, scale, n, m, heads,
                    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, sd_b, sd_h, sd_n,
                    D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, ENTMAX: tl.constexpr, PREC: tl.constexpr):
        """One key block over every query block, FlashAttention-2's five GEMMs per tile: s = q k^T, dV += p^T dO,
        dp = dO v^T, dK += ds^T q, and dQ += scale * ds k atomically into the fp32 DQ_ACC (cast by
        ``_bwd_dq_cast_kernel``); ds = g (dp - delta). Tiles are kept keys x queries, so every product has a 64-row
        wgmma side and the query block can be 32 rows: fewer padded rows (N = 197: 224 rows, not 256)."""
        bh, b, h, start_n, coef, k, v = _key_block(K, V, scale, m, heads, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, D, DV,
                                                   BLOCK_N, BLOCK_D, BLOCK_DV, ENTMAX)
        dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
        offs_d = tl.arange(0, BLOCK_D)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k_bias = tl.where(offs_n < m, 0.0, float("-inf"))  # keys past m, once per program: an add, not a select
        for start_m in range(0, n, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            row = offs_m < n
            q = _rows(Q, b * sq_b + h * sq_h, sq_n, start_m, n, BLOCK_M, BLOCK_D, D)
            do = _rows(DO, b * sd_b + h * sd_h, sd_n, start_m, n, BLOCK_M, BLOCK_DV, DV)
            zmax = tl.load(STATS + (bh * n + offs_m) * 2, mask=row, other=0.0)
            tau = tl.load(STATS + (bh * n + offs_m) * 2 + 1, mask=row, other=0.0)
            delta = tl.load(DELTA + bh * n + offs_m, mask=row, other=0.0)
            z_t = _dot(k, tl.trans(q), PREC) * coef + k_bias[:, None] - zmax[None, :]  # the forward's z, transposed
            d_t = tl.maximum(z_t - tau[None, :], 0.0)
            if ENTMAX:  # p and g (see _p_g), transposed
                p_t, g_t = d_t * d_t, d_t
            else:
                p_t, g_t = d_t, (d_t > 0).to(tl.float32)
            # all-zero tile: no dV, and ds = g * (...) = 0 (no dK, no dQ); g >= 0, so its sum is 0 iff every g is
            # (a sum on the FMA pipe, which has room here, where a max is an ALU op)
            if tl.sum(tl.sum(g_t, 1), 0) > 0:
                dv += _dot(p_t.to(do.dtype), do, PREC)
                ds_t = (g_t * (_dot(v, tl.trans(do), PREC) - delta[None, :])).to(q.dtype)
                dk += _dot(ds_t, q, PREC)
                # relaxed: the adds need no ordering (the cast kernel reads after this launch): REDG without
                # the GPU-scope MEMBAR per atomic of the default acq_rel
                tl.atomic_add(DQ_ACC + (bh * n + offs_m[None, :]) * D + offs_d[:, None],
                              _dot(tl.trans(k), ds_t, PREC) * scale, mask=row[None, :] & (offs_d[:, None] < D),
                              sem="relaxed")
        _store_dk_dv(DK, DV_, dk, dv, scale, bh, start_n, m, D, DV, BLOCK_N, BLOCK_D, BLOCK_DV)

    @triton.jit
    def _bwd_dq_cast_kernel(DQ_ACC, DQ, numel, BLOCK: tl.constexpr):
        """dQ = DQ_ACC in dQ's dtype (both contiguous (B*H, N, d))."""
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        keep = offs < numel
        tl.store(DQ + offs, tl.load(DQ_ACC + offs, mask=keep, other=0.0).to(DQ.dtype.element_ty), mask=keep)
