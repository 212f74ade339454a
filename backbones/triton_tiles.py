"""Tile loads and tensor-core products of the Triton attention kernels (``backbones.triton_kernels``,
``triton_kernels_bwd``): the layer below both directions. Rows are read through their strides (the last
dimension contiguous)."""
from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton: backbones.triton_attention.available() is False
    triton = None

if triton is not None:
    @triton.jit
    def _dot(a, b, PREC: tl.constexpr):
        """a @ b, fp32 accumulation. PREC "upcast": in fp32 from bf16 operands (same products; the interpreter's
        bf16 dot is wrong), "ieee": exact fp32, "tf32": tensor cores (16-bit operands: exact products)."""
        if PREC == "upcast":
            return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        return tl.dot(a, b, input_precision=PREC)

    @triton.jit
    def _dot_acc(a, b, acc, PREC: tl.constexpr):
        """acc + a @ b (see _dot)."""
        if PREC == "upcast":
            return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        return tl.dot(a, b, acc, input_precision=PREC)

    @triton.jit
    def _rows(X, off, s_n, start, n, R: tl.constexpr, C: tl.constexpr, c_real):
        """Rows start..start+R of a (rows, c_real) matrix at X + off with row stride s_n; zeros outside."""
        r = start + tl.arange(0, R)
        c = tl.arange(0, C)
        return tl.load(X + off + r[:, None] * s_n + c[None, :], mask=(r[:, None] < n) & (c[None, :] < c_real),
                       other=0.0)

    @triton.jit
    def _block(X, off, s_n, start, n, R: tl.constexpr, C: tl.constexpr, c_real, MASK: tl.constexpr):
        """_rows, or without MASK rows known to lie below n (a block before the last: no per-row compare)."""
        if MASK:
            return _rows(X, off, s_n, start, n, R, C, c_real)
        r = start + tl.arange(0, R)
        c = tl.arange(0, C)
        if C == c_real:
            return tl.load(X + off + r[:, None] * s_n + c[None, :])
        return tl.load(X + off + r[:, None] * s_n + c[None, :], mask=c[None, :] < c_real, other=0.0)

    @triton.jit
    def _scores(q, K, k_off, s_kn, start, m, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, D: tl.constexpr,
                PREC: tl.constexpr, MASK: tl.constexpr):
        """Raw s = q k^T for keys start..start+BLOCK_N; MASK: keys past m get -inf (else the block lies below m)."""
        k = _block(K, k_off, s_kn, start, m, BLOCK_N, BLOCK_D, D, MASK)
        if MASK:  # -inf as the product's initial accumulator: no per-score select
            bias = tl.where(start + tl.arange(0, BLOCK_N) < m, 0.0, float("-inf"))
            return _dot_acc(q, tl.trans(k), tl.zeros([q.shape[0], BLOCK_N], tl.float32) + bias[None, :], PREC)
        return _dot(q, tl.trans(k), PREC)
