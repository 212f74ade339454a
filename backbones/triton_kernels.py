"""The Triton forward kernel behind ``backbones.triton_attention`` and the helpers both directions share (tile
loads and products: ``triton_tiles``; backward kernels: ``triton_kernels_bwd``).

Notation (per query row): s = q k^T, z = c s - zmax with c = scale/2 (entmax-1.5) or scale (sparsemax), so
max z = 0 and p = (z - tau)_+^2 (entmax-1.5) or (z - tau)_+ (sparsemax), tau in [-1, 0) (p <= 1 bounds it).
Tensors are upper case, sizes and strides lower case (``triton_plan._signature`` relies on it).
"""
from __future__ import annotations

from .triton_tiles import triton

if triton is not None:
    import triton.language as tl

    from .triton_tiles import _block, _dot, _rows, _scores

    EPS = tl.constexpr(1e-6)  # a closed-form root this far below the pass's threshold is that threshold (fp32
    # rounding of u at the settled support)

    @triton.jit
    def _support_sums(x, a, w, sgn, FUSED: tl.constexpr):
        """Per row: sum and sum of squares of d = a x - w over S = {d > 0} (register tiles: x = z, a = 1, w = t;
        block-wise: x = s, a = coef, w = zmax + t, so z is never formed), and on sgn's side of t (+1: above, -1:
        below) the count of keys and the nearest one's distance, as the int32 bits of minus it. nd = sgn (w - a x)
        is one FFMA whose sign bit marks that side's keys; as int32 the negative nd order by magnitude below every
        non-negative one: one integer min, no select. Padded keys (x = -inf) are infinitely far below."""
        nd = (w * sgn)[:, None] - x * (a * sgn)[:, None]
        dp = tl.clamp(x * a - w[:, None], 0.0, 1.0)  # = max(d, 0) as d <= -t <= 1: one saturating FFMA / FADD
        bits = nd.to(tl.int32, bitcast=True)
        on = (bits.to(tl.uint32, bitcast=True) >> 31).to(tl.int32)  # nd < 0 (nd is never -0)
        if FUSED:  # one reduction over four inputs: each score's terms are consumed at once (no spill)
            return tl.reduce((on, dp, dp * dp, bits), 1, _combine)
        # the interpreter runs a custom combine per element in Python: four vectorised reductions there
        return tl.sum(on, 1), tl.sum(dp, 1), tl.sum(dp * dp, 1), tl.min(bits, 1)

    @triton.jit
    def _combine(k1, a1, b1, m1, k2, a2, b2, m2):
        return k1 + k2, a1 + a2, b1 + b2, tl.minimum(m1, m2)

    @triton.jit
    def _gauss_root(k, s1, s2, t):
        """tau of k normal scores with the mean and variance of the d = z - t given by their sums (k E[(x - tau)_+^2]
        = 1): 4 Newton steps in a = (tau - mean) / sd on G(a) = (1 + a^2) Phi(-a) - a phi(a), Phi by Abramowitz &
        Stegun 26.2.17 (|error| < 7.5e-8). The block-wise first sweep's start: on near-uniform rows (a ViT at
        random init) the closed form on the running superset has no real root."""
        mean = s1 / k
        var = tl.maximum(s2 / k - mean * mean, 1e-20)
        r = 1.0 / (k * var)
        a = mean * 0
        for _ in tl.static_range(4):
            x = tl.abs(a)
            phi = 0.3989422804014327 * tl.exp(-0.5 * a * a)
            w = 1.0 / (1.0 + 0.2316419 * x)  # A&S 26.2.17: Phi(-|a|) = phi(a) w P(w)
            upper = phi * w * (0.319381530 + w * (-0.356563782 + w * (1.781477937 + w * (-1.821255978
                                                                                       + w * 1.330274429))))
            tail = tl.where(a >= 0, upper, 1.0 - upper)
            a = tl.clamp(a - ((1.0 + a * a) * tail - a * phi - r) / (2.0 * (a * tail - phi)), -4.0, 4.0)
        return t + mean + a * tl.sqrt(var)

    @triton.jit
    def _disc(k, s1, s2):
        """Entmax-1.5's closed form on S, |S| u^2 - 2 u sum d + sum d^2 = 1, has a real root iff this is >= 0."""
        return s1 * s1 - k * (s2 - 1.0)

    @triton.jit
    def _update(t, k, s1, s2, mn, below, ENTMAX: tl.constexpr):
        """One threshold step from the support sums at t (mn: min d over S; below: t minus the nearest z outside S):
        (exact, tau, next t, sum of g at tau, next sgn).

        The closed form on S: u with sum_S (d - u)^2 = 1 (sparsemax: sum_S (d - u) = 1) is tau exactly when
        -below <= u < mn (no key crosses between t and t + u). Otherwise (entmax-1.5) the next support lies on the
        other side of tau and the bounds close in monotonically; with no real root, a Newton step from below on
        ||d_+|| - 1. Sparsemax: u is Michelot's step, always from below. Sum of g = dp/dz at tau (up to the row
        constant): sum_S (d - u) (entmax-1.5) or |S| (sparsemax), for the backward's Og. Next sgn: -1 after a root
        from a superset (sum_S d^2 >= 1 at t), else +1."""
        k = k.to(tl.float32)
        if ENTMAX:
            disc = _disc(k, s1, s2)
            has = disc >= 0
            u = (s2 - 1.0) / (s1 + tl.sqrt(tl.maximum(disc, 0.0)))  # the smaller root, without cancellation
            nxt = tl.where(has, t + u, t + (s2 - tl.sqrt(s2)) / s1)
        else:
            u = (s1 - 1.0) / k
            has = k > 0
            nxt = t + u
        step = tl.where(u >= -below, u, tl.maximum(u, 0.0))  # a root within EPS below t (rounding): t itself
        exact = has & (u < mn) & ((u >= -below) | (u >= -EPS))
        if ENTMAX:
            g_sum = s1 - k * step
            side = tl.where(has & (s2 >= 1.0), -1.0, 1.0)
        else:
            g_sum = k
            side = t * 0 + 1.0
        return exact, t + step, nxt, g_sum, side

    @triton.jit
    def _fold(zc, t, PREC: tl.constexpr):
        """(w, the t it stands for) of a block-wise pass at t, d = coef s - w. 16-bit and tf32: w = zmax + t below
        zmax, t snapped to w's rounding (zmax's ulp is far below the products' rounding). Exact fp32 forms z first
        (w = t): zmax + t would round t to zmax's ulp (5e-4 at |s| ~ 1e4)."""
        if PREC == "ieee":
            return t, t
        w = tl.minimum(zc + t, zc - (tl.abs(zc) * 2.4e-7 + 1e-30))
        return w, w - zc

    @triton.jit
    def _pass_scores(q, K, k_off, s_kn, start, m, coef, zc, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                     D: tl.constexpr, PREC: tl.constexpr, MASK: tl.constexpr):
        """(x, a) of one key block of a block-wise row, d = a x - w (w: _fold): the raw scores and coef, or
        exact fp32 z = coef s - zmax and 1 (q k^T recomputed; MASK: see _scores)."""
        s = _scores(q, K, k_off, s_kn, start, m, BLOCK_N, BLOCK_D, D, PREC, MASK)
        if PREC == "ieee":
            return s * coef - zc[:, None], coef * 0 + 1.0
        return s, coef

    @triton.jit
    def _row_sums(z_a, z_b, z_c, t, sgn, q, K, k_off, s_kn, m, last, stop, coef, zc, BLOCK_N: tl.constexpr,
                  MID_N: tl.constexpr, LAST_N: tl.constexpr, BLOCK_D: tl.constexpr, D: tl.constexpr,
                  PREC: tl.constexpr, SINGLE: tl.constexpr, TWO: tl.constexpr, FUSED: tl.constexpr):
        """_support_sums over the whole row (register tiles, or z recomputed block by block, the last block masked) as
        |S|, sum d, sum d^2, min d over S and the distance down to the nearest key outside S; only sgn's side is
        measured, the other taken as EPS or 0. Below t the keys equal to t count in S with d = 0 (they are in the
        support of any root u < 0). Last, the t these sums are at (block-wise: snapped, see _fold)."""
        if SINGLE:
            k, s1, s2, nb = _support_sums(z_a, 1.0, t, sgn, FUSED)
            slots = BLOCK_N
            if TWO:
                k, s1, s2, nb = _combine(k, s1, s2, nb, *_support_sums(z_b, 1.0, t, sgn, FUSED))
                slots = BLOCK_N + MID_N
                if LAST_N < BLOCK_N:  # a third, narrow tile: the keys past BLOCK_N + MID_N
                    k, s1, s2, nb = _combine(k, s1, s2, nb, *_support_sums(z_c, 1.0, t, sgn, FUSED))
                    slots = BLOCK_N + MID_N + LAST_N
        else:
            zi = (t * 0).to(tl.int32)
            k, s1, s2, nb = zi, t * 0, t * 0, zi + 2147483647
            w, t = _fold(zc, t, PREC)
            for start in range(0, stop, BLOCK_N):
                x, a = _pass_scores(q, K, k_off, s_kn, start, m, coef, zc, BLOCK_N, BLOCK_D, D, PREC, PREC == "ieee")
                k, s1, s2, nb = _combine(k, s1, s2, nb, *_support_sums(x, a, w, sgn, FUSED))
            slots = (stop + BLOCK_N - 1) // BLOCK_N * BLOCK_N  # key columns summed, padded ones too
            if PREC != "ieee":
                x, a = _pass_scores(q, K, k_off, s_kn, last, m, coef, zc, LAST_N, BLOCK_D, D, PREC, True)
                k, s1, s2, nb = _combine(k, s1, s2, nb, *_support_sums(x, a, w, sgn, FUSED))
                slots = stop + LAST_N
        dist = tl.where(k > 0, -(nb.to(tl.float32, bitcast=True)), float("inf"))  # k: that side's keys
        above = sgn > 0
        return tl.where(above, k, slots - k), s1, s2, tl.where(above, dist, EPS), tl.where(above, 0.0, dist), t

    @triton.jit
    def _superset_sums(s, ref_c, smax, coef, MASK: tl.constexpr):
        """Of one key block, y = coef s - ref_c: |S'|, sum y and sum y^2 over S' = {s > smax - 1/coef}, and over
        every key (MASK: leaving out the padded ones, s = -inf)."""
        y = s * coef - ref_c[:, None]
        on = y > (smax * coef - ref_c - 1.0)[:, None]
        yp = tl.where(on, y, 0.0)
        ya = y
        if MASK:
            ya = tl.where(y > float("-inf"), y, 0.0)
        return tl.sum(on.to(tl.int32), 1), tl.sum(yp, 1), tl.sum(yp * yp, 1), tl.sum(ya, 1), tl.sum(ya * ya, 1)

    @triton.jit
    def _superset_step(s, ref_c, smax, coef, k, sy, syy, ay, ayy, MASK: tl.constexpr):
        """The running max and the first pass's sums after one more key block of scores s."""
        smax = tl.maximum(smax, tl.max(s, 1))
        a, b, c, d, e = _superset_sums(s, ref_c, smax, coef, MASK)
        return smax, k + a, sy + b, syy + c, ay + d, ayy + e

    @triton.jit
    def _first_pass(q, K, k_off, s_kn, m, last, stop, coef, zero, BLOCK_N: tl.constexpr, LAST_N: tl.constexpr,
                    BLOCK_D: tl.constexpr, D: tl.constexpr, ENTMAX: tl.constexpr, PREC: tl.constexpr):
        """(coef * row max of s, a first t, its sgn) in one sweep over a block-wise row's key blocks: with the row max,
        the closed form on S' = the keys above the running max minus 1/coef when read. The running max only grows,
        so S' holds the support and the root bounds tau from above (sparsemax: Michelot's step, from below); S' need
        not be a level set, so this sweep settles no row. Entmax-1.5 starts from the normal model (_gauss_root),
        kept below that root. Sums are of y = coef (s - ref), ref = the first block's max."""
        s = _scores(q, K, k_off, s_kn, 0, m, BLOCK_N, BLOCK_D, D, PREC, True)  # m may end in the first block
        smax = tl.max(s, 1)
        ref_c = smax * coef
        k, sy, syy, ay, ayy = _superset_sums(s, ref_c, smax, coef, True)
        for start in range(BLOCK_N, stop, BLOCK_N):  # the blocks between the first and the last: unmasked
            s = _scores(q, K, k_off, s_kn, start, m, BLOCK_N, BLOCK_D, D, PREC, PREC == "ieee")
            smax, k, sy, syy, ay, ayy = _superset_step(s, ref_c, smax, coef, k, sy, syy, ay, ayy, PREC == "ieee")
        if PREC != "ieee":
            if last > 0:
                s_l = _scores(q, K, k_off, s_kn, last, m, LAST_N, BLOCK_D, D, PREC, True)  # (its own shape)
                smax, k, sy, syy, ay, ayy = _superset_step(s_l, ref_c, smax, coef, k, sy, syy, ay, ayy, True)
        zc = smax * coef
        y0 = zc - ref_c - 1.0  # t = -1 in y; d = y - y0
        kf = k.to(tl.float32)
        s1 = sy - kf * y0
        s2 = syy - 2.0 * y0 * sy + kf * y0 * y0
        _, _, nxt, _, sgn = _update(zero - 1.0, k, s1, s2, zero, zero, ENTMAX)  # never exact: S' is no level set
        if ENTMAX:  # sgn: -1 where the root (an upper bound) is kept, +1 where the normal model's start, unknown
            mf = zero + m
            g = _gauss_root(mf, ay - mf * y0, ayy - 2.0 * y0 * ay + mf * y0 * y0, zero - 1.0)
            has = _disc(kf, s1, s2) >= 0
            sgn = tl.where(has & (nxt <= g), -1.0, 1.0)
            nxt = tl.where(has, tl.minimum(nxt, g), g)
        return zc, tl.minimum(tl.maximum(nxt, -1.0), -1e-30), sgn

    @triton.jit
    def _threshold(z_a, z_b, z_c, t, sgn, q, K, k_off, s_kn, m, last, stop, coef, zc, zero,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MID_N: tl.constexpr, LAST_N: tl.constexpr,
                   BLOCK_D: tl.constexpr, D: tl.constexpr, ENTMAX: tl.constexpr, SINGLE: tl.constexpr,
                   TWO: tl.constexpr, MAX_PASSES: tl.constexpr, PREC: tl.constexpr, FUSED: tl.constexpr,
                   PASSES_BEFORE: tl.constexpr):
        """(tau, sum of g at tau, passes) per row, from t (-1 = zmax/2 - 1, as p <= 1, or _first_pass's, which
        counts as PASSES_BEFORE = 1 pass; ``kernel_model.loop_trips`` runs this loop the assumed passes minus that) and
        sgn (the side of tau t lies on, see _update). The register tiles' first pass (t = -1) stays in the loop:
        peeled, with a _gauss_root start, it cost more than it saved (docs/performance.md)."""
        tau = zero
        g_sum = zero
        done = zero > 1
        passes = tl.zeros([BLOCK_M], dtype=tl.int32)
        it = tl.full([], PASSES_BEFORE, tl.int32)  # loop-carried: Triton values, not Python ints
        left = tl.full([], BLOCK_M, tl.int32)
        while left > 0:
            k, s1, s2, mn, below, t = _row_sums(z_a, z_b, z_c, t, sgn, q, K, k_off, s_kn, m, last, stop, coef, zc,
                                                BLOCK_N, MID_N, LAST_N, BLOCK_D, D, PREC, SINGLE, TWO, FUSED)
            exact, cand, nxt, gs, sgn = _update(t, k, s1, s2, mn, below, ENTMAX)
            it += 1
            passes = tl.where(done, passes, it)
            fin = ~done & (exact | (it >= MAX_PASSES))  # out of passes (never seen): the last root
            tau = tl.where(fin, tl.where(exact, cand, nxt), tau)
            if SINGLE:  # block-wise: summed with g v instead (carried here, it took an 8 B stack frame, ieee fp32)
                g_sum = tl.where(fin, gs, g_sum)
            done = done | fin
            t = nxt
            left = tl.sum((~done).to(tl.int32), 0)
        return tau, g_sum, passes

    @triton.jit
    def _p_g(x, a, w, ENTMAX: tl.constexpr):
        """p and g = dp/dz up to a row constant (sqrt(p) for entmax-1.5, [p > 0] for sparsemax) from d = a x - w
        (x = z, a = 1, w = tau; or x = the raw s, a = coef, w = zmax + tau: see _support_sums)."""
        d = tl.clamp(x * a - w[:, None], 0.0, 1.0)  # = max(z - tau, 0) as z <= 0 and tau >= -1: saturating
        if ENTMAX:
            return d * d, d
        return d, (d > 0).to(tl.float32)

    @triton.jit
    def _add_values(x, a, w, v, acc, acc_g, g_sum, NEED_OG: tl.constexpr, ENTMAX: tl.constexpr,
                    PREC: tl.constexpr, G_SUM: tl.constexpr):
        """acc += p v and (NEED_OG) acc_g += g v for one key tile, p and g from one d = a x - w (see _p_g) in v's
        dtype (via fp32: the interpreter cannot cast bool to bf16); with G_SUM also g_sum += sum of g."""
        p, g = _p_g(x, a, w, ENTMAX)
        acc += _dot(p.to(v.dtype), v, PREC)
        if NEED_OG:
            acc_g += _dot(g.to(v.dtype), v, PREC)
            if G_SUM:
                g_sum += tl.sum(g, 1)
        return acc, acc_g, g_sum

    @triton.jit
    def _block_values(q, K, V, k_off, sk_n, v_off, sv_n, start, m, coef, zc, w, acc, acc_g, g_sum,
                      BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, D: tl.constexpr,
                      DV: tl.constexpr, NEED_OG: tl.constexpr, ENTMAX: tl.constexpr, PREC: tl.constexpr,
                      MASK: tl.constexpr):
        """_add_values for one key block of a block-wise row (q k^T recomputed; d = a x - w: _pass_scores, _fold),
        skipped when it lies outside every row's support (the test is d of each row's largest x, rounded as d)."""
        x, a = _pass_scores(q, K, k_off, sk_n, start, m, coef, zc, BLOCK_N, BLOCK_D, D, PREC, MASK)
        if tl.max(tl.max(x, 1) * a - w, 0) > 0:  # sparse: a tile outside every row's support adds nothing
            acc, acc_g, g_sum = _add_values(x, a, w, _block(V, v_off, sv_n, start, m, BLOCK_N, BLOCK_DV, DV, MASK),
                                            acc, acc_g, g_sum, NEED_OG, ENTMAX, PREC, True)
        return acc, acc_g, g_sum

    @triton.jit
    def _tile_z(q, K, k_off, sk_n, m, coef, BLOCK_N: tl.constexpr, MID_N: tl.constexpr, LAST_N: tl.constexpr,
                BLOCK_D: tl.constexpr, D: tl.constexpr, TWO: tl.constexpr, PREC: tl.constexpr):
        """(z_a, z_b, z_c, coef max) of the register tiles (see _fwd_kernel): the raw row max first, then
        z = coef s - coef max in one FMA per score; tiles a row lacks repeat z_a (never read)."""
        s_a = _scores(q, K, k_off, sk_n, 0, m, BLOCK_N, BLOCK_D, D, PREC, not TWO)  # with TWO: m > BLOCK_N
        smax = tl.max(s_a, 1)
        if TWO:
            s_b = _scores(q, K, k_off, sk_n, BLOCK_N, m, MID_N, BLOCK_D, D, PREC, LAST_N == BLOCK_N)
            smax = tl.maximum(smax, tl.max(s_b, 1))
            if LAST_N < BLOCK_N:
                s_c = _scores(q, K, k_off, sk_n, BLOCK_N + MID_N, m, LAST_N, BLOCK_D, D, PREC, True)
                smax = tl.maximum(smax, tl.max(s_c, 1))
        zc = smax * coef
        z_a = s_a * coef - zc[:, None]
        z_b, z_c = z_a, z_a
        if TWO:
            z_b = s_b * coef - zc[:, None]
            if LAST_N < BLOCK_N:
                z_c = s_c * coef - zc[:, None]
        return z_a, z_b, z_c, zc

    @triton.jit
    def _tile_values(z_a, z_b, z_c, tau, V, v_off, sv_n, m, acc, acc_g, g_sum, BLOCK_N: tl.constexpr,
                     MID_N: tl.constexpr, LAST_N: tl.constexpr, BLOCK_DV: tl.constexpr, DV: tl.constexpr,
                     TWO: tl.constexpr, NEED_OG: tl.constexpr, ENTMAX: tl.constexpr, PREC: tl.constexpr):
        """acc, acc_g, g_sum with the register tiles' sum p v (and sum g v) added."""
        acc, acc_g, g_sum = _add_values(z_a, 1.0, tau, _rows(V, v_off, sv_n, 0, m, BLOCK_N, BLOCK_DV, DV), acc,
                                        acc_g, g_sum, NEED_OG, ENTMAX, PREC, False)
        if TWO:
            v_b = _rows(V, v_off, sv_n, BLOCK_N, m, MID_N, BLOCK_DV, DV)
            acc, acc_g, g_sum = _add_values(z_b, 1.0, tau, v_b, acc, acc_g, g_sum, NEED_OG, ENTMAX, PREC, False)
            if LAST_N < BLOCK_N:
                v_c = _rows(V, v_off, sv_n, BLOCK_N + MID_N, m, LAST_N, BLOCK_DV, DV)
                acc, acc_g, g_sum = _add_values(z_c, 1.0, tau, v_c, acc, acc_g, g_sum, NEED_OG, ENTMAX, PREC, False)
        return acc, acc_g, g_sum

    @triton.jit
    def _blockwise_values(q, K, V, k_off, sk_n, v_off, sv_n, m, last, stop, coef, zc, tau, acc, acc_g, g_sum,
                          BLOCK_N: tl.constexpr, LAST_N: tl.constexpr, BLOCK_D: tl.constexpr,
                          BLOCK_DV: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, NEED_OG: tl.constexpr,
                          ENTMAX: tl.constexpr, PREC: tl.constexpr):
        """acc, acc_g, g_sum with the key blocks' sum p v (sum g v) added, q k^T recomputed (the blocks before the
        last unmasked, then the last); and tau as these blocks use it (as each pass's, for the backward)."""
        w, tau = _fold(zc, tau, PREC)
        for start in range(0, stop, BLOCK_N):
            acc, acc_g, g_sum = _block_values(q, K, V, k_off, sk_n, v_off, sv_n, start, m, coef, zc, w, acc,
                                              acc_g, g_sum, BLOCK_N, BLOCK_D, BLOCK_DV, D, DV, NEED_OG, ENTMAX,
                                              PREC, PREC == "ieee")
        if PREC != "ieee":
            acc, acc_g, g_sum = _block_values(q, K, V, k_off, sk_n, v_off, sv_n, last, m, coef, zc, w, acc,
                                              acc_g, g_sum, LAST_N, BLOCK_D, BLOCK_DV, D, DV, NEED_OG, ENTMAX,
                                              PREC, True)
        return acc, acc_g, g_sum, tau

    @triton.jit
    def _store_rows(O, OG, STATS, PASSES, b, h, bh, n, so_b, so_h, so_n, start_m, acc, acc_g, g_sum, zc, tau,
                    passes, BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr, DV: tl.constexpr,
                    NEED_OG: tl.constexpr, COUNT: tl.constexpr):
        """O (and OG = acc_g / g_sum), the rows' (zmax, tau) and (COUNT) their passes."""
        offs_m, offs_dv = start_m + tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_DV)
        out_mask = (offs_m[:, None] < n) & (offs_dv[None, :] < DV)
        tl.store(O + b * so_b + h * so_h + offs_m[:, None] * so_n + offs_dv[None, :], acc.to(O.dtype.element_ty),
                 mask=out_mask)
        if NEED_OG:
            tl.store(OG + (bh * n + offs_m[:, None]) * DV + offs_dv[None, :],
                     (acc_g * (1.0 / g_sum)[:, None]).to(OG.dtype.element_ty), mask=out_mask)
        row = offs_m < n
        tl.store(STATS + (bh * n + offs_m) * 2, zc, mask=row)
        tl.store(STATS + (bh * n + offs_m) * 2 + 1, tau, mask=row)
        if COUNT:
            tl.store(PASSES + bh * n + offs_m, passes, mask=row)

    @triton.jit
    def _fwd_kernel(Q, K, V, O, OG, STATS, PASSES, scale, n, m, heads,
                    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n,
                    D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    MID_N: tl.constexpr, LAST_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                    ENTMAX: tl.constexpr, SINGLE: tl.constexpr, TWO: tl.constexpr, NEED_OG: tl.constexpr,
                    COUNT: tl.constexpr, MAX_PASSES: tl.constexpr, PREC: tl.constexpr, FUSED: tl.constexpr):
        """O = sum p v per query row of one (query block, batch*head); (zmax, tau) to STATS; with NEED_OG also
        OG = sum g v / sum g (the backward's delta); with COUNT the passes per row to PASSES. SINGLE: the row's
        scores stay in registers (q k^T once) in up to three tiles (BLOCK_N, MID_N with TWO, LAST_N; widths:
        ``triton_plan._tiles``); else every pass recomputes q k^T block by block, the last block LAST_N keys wide."""
        bh = tl.program_id(1)
        b, h = bh // heads, bh % heads
        start_m = tl.program_id(0) * BLOCK_M
        q = _rows(Q, b * sq_b + h * sq_h, sq_n, start_m, n, BLOCK_M, BLOCK_D, D)
        k_off, v_off = b * sk_b + h * sk_h, b * sv_b + h * sv_h
        coef = scale * 0.5 if ENTMAX else scale
        zero = tl.zeros([BLOCK_M], dtype=tl.float32)
        # block-wise rows: the blocks before ``stop`` run unmasked in the loops, then the one at ``last`` masked
        # (exact fp32: every block masked in the loop, which then ends at m: peeled, it took a stack frame)
        last = (m - 1) // BLOCK_N * BLOCK_N
        stop = m if PREC == "ieee" else last
        if SINGLE:
            z_a, z_b, z_c, zc = _tile_z(q, K, k_off, sk_n, m, coef, BLOCK_N, MID_N, LAST_N, BLOCK_D, D, TWO, PREC)
            t, sgn = zero - 1.0, zero + 1.0
        else:  # the row max and a first threshold pass in one sweep
            zc, t, sgn = _first_pass(q, K, k_off, sk_n, m, last, stop, coef, zero, BLOCK_N, LAST_N, BLOCK_D,
                                     D, ENTMAX, PREC)
            z_a, z_b, z_c = zc, zc, zc
        tau, g_sum, passes = _threshold(z_a, z_b, z_c, t, sgn, q, K, k_off, sk_n, m, last, stop, coef, zc, zero,
                                        BLOCK_M, BLOCK_N, MID_N, LAST_N, BLOCK_D, D, ENTMAX, SINGLE, TWO, MAX_PASSES,
                                        PREC, FUSED, 0 if SINGLE else 1)
        acc, acc_g = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32), tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
        if SINGLE:  # g_sum: from the threshold's last pass
            acc, acc_g, g_sum = _tile_values(z_a, z_b, z_c, tau, V, v_off, sv_n, m, acc, acc_g, g_sum, BLOCK_N,
                                             MID_N, LAST_N, BLOCK_DV, DV, TWO, NEED_OG, ENTMAX, PREC)
        else:
            acc, acc_g, g_sum, tau = _blockwise_values(q, K, V, k_off, sk_n, v_off, sv_n, m, last, stop, coef, zc,
                                                       tau, acc, acc_g, g_sum, BLOCK_N, LAST_N, BLOCK_D, BLOCK_DV,
                                                       D, DV, NEED_OG, ENTMAX, PREC)
        _store_rows(O, OG, STATS, PASSES, b, h, bh, n, so_b, so_h, so_n, start_m, acc, acc_g, g_sum, zc, tau, passes,
                    BLOCK_M, BLOCK_DV, DV, NEED_OG, COUNT)
