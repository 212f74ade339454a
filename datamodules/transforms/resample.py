"""Crop + antialiased bicubic resize of many crops at once, as batched matrix products, on any device.

Torch's uint8 ``interpolate(mode="bicubic", antialias=True)`` (PIL's filter: Keys cubic, a = -0.5, support scaled
by the downscale factor) is separable, each pass a fixed-point dot product rounded to uint8, so every crop of one
output size goes through the same two ``matmul`` calls with its own weights:

    out = round(W_h · round(crop · W_wᵀ))        W_w: (size, crop width), W_h: (size, crop height)

The weights are torch's own (``_compute_index_ranges_int16_weights``, aten's UpSampleKernel.cpp, rebuilt in
float64 and rounded to int16 as there); q / 2**p and the pixel products are exact in float32, so each pass rounds
like torch's integer code except at float32 near-ties (~1e-5). A flip reverses W_w's rows. Crops of a chunk are
padded to its largest (zero-weight taps) and cut from one flat uint8 buffer by one ``index_select``.
"""
from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np
import torch

_A = -0.5  # PIL's / torch's antialiased bicubic (torch's non-antialiased bicubic uses -0.75)
_MAX_PRECISION = 22


def _cubic(x: torch.Tensor) -> torch.Tensor:
    """torch ``HelperInterpCubic::aa_filter``: cubic_convolution1 / 2 of UpSample.h, in their evaluation order."""
    x = x.abs()
    near = ((_A + 2) * x - (_A + 3)) * x * x + 1
    far = ((_A * x - 5 * _A) * x + 8 * _A) * x - 4 * _A
    return torch.where(x < 1.0, near, torch.where(x < 2.0, far, torch.zeros_like(x)))


def max_taps(in_size: int, out_size: int) -> int:
    """Taps per output sample for the largest input of a chunk (torch's ``max_interp_size``)."""
    scale = in_size / out_size
    support = 2.0 * scale if scale >= 1.0 else 2.0
    return int(math.ceil(support)) * 2 + 1


def tap_table(in_sizes: torch.Tensor, out_size: int, taps: int,
              flip: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Torch's uint8 antialiased bicubic weights of n resizes of one axis: (weights (n, out, taps) float32 =
    q / 2**p, first input sample (n, out, 1), tap count (n, out, 1)). ``in_sizes``: (n,) int64; ``taps`` >=
    :func:`max_taps` of the largest; ``flip``: (n,) bool, reverse the outputs (a horizontal flip)."""
    dev = in_sizes.device
    size = in_sizes.to(torch.float64)[:, None, None]
    scale = size / out_size
    big = scale >= 1.0
    support = torch.where(big, 2.0 * scale, torch.full_like(scale, 2.0))
    invscale = torch.where(big, 1.0 / scale, torch.ones_like(scale))
    center = scale * (torch.arange(out_size, device=dev, dtype=torch.float64)[None, :, None] + 0.5)
    xmin = torch.trunc(center - support + 0.5).clamp_(min=0)  # static_cast<int64_t>: truncation
    n_interp = torch.ceil(support) * 2 + 1
    xsize = (torch.minimum(torch.trunc(center + support + 0.5), size) - xmin)
    xsize = torch.minimum(xsize.clamp_(min=0), n_interp)
    j = torch.arange(taps, device=dev, dtype=torch.float64)[None, None, :]
    w = torch.where(j < xsize, _cubic((j + xmin - center + 0.5) * invscale), torch.zeros((), device=dev,
                                                                                       dtype=torch.float64))
    total = w.sum(-1, keepdim=True)
    w = torch.where(total != 0, w / torch.where(total != 0, total, torch.ones_like(total)), w)
    wt_max = w.amax(dim=(1, 2))
    # precision: the first p whose doubled scale would overflow int16 for the largest weight (else 22)
    p2 = torch.pow(2.0, torch.arange(1, _MAX_PRECISION + 1, device=dev, dtype=torch.float64))
    over = torch.trunc(0.5 + wt_max[:, None] * p2[None, :]) >= 2 ** 15
    prec = torch.where(over.any(1), over.to(torch.int64).argmax(1), torch.full_like(wt_max, _MAX_PRECISION,
                                                                                    dtype=torch.int64))
    unit = torch.pow(2.0, prec.to(torch.float64))[:, None, None]
    v = w * unit
    q = torch.where(v < 0, torch.trunc(v - 0.5), torch.trunc(v + 0.5))
    qf = (q / unit).to(torch.float32)  # int16 / 2**p: exact in float32
    first, count = xmin.to(torch.int64), xsize.to(torch.int64)
    if flip is not None:  # output i of a flipped crop is output size-1-i: reverse the (small) tap tables
        f = flip[:, None, None]
        qf, first, count = (torch.where(f, t.flip(1), t) for t in (qf, first, count))
    return qf, first, count


def dense_weights(table: tuple[torch.Tensor, torch.Tensor, torch.Tensor], pad_to: int) -> torch.Tensor:
    """Tap tables -> resampling matrices (n, out, pad_to): row i holds output i's weights over the input samples
    (zero beyond the input). A gather: deterministic on every device, unlike a scatter."""
    qf, first, count = table
    tap = torch.arange(pad_to, device=qf.device)[None, None, :] - first
    picked = qf.gather(2, tap.clamp(0, qf.shape[2] - 1).expand(*qf.shape[:2], pad_to))
    return torch.where((tap >= 0) & (tap < count), picked, torch.zeros((), device=qf.device))


@contextmanager
def ieee_fp32():
    """Full float32 matmuls (no TF32) inside: the passes round to whole levels, TF32's 10-bit mantissa would
    move ~0.1 level and change the rounding of many pixels."""
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(prev)


def _round_u8(x: torch.Tensor) -> torch.Tensor:
    """torch's ``(acc + 2**(p-1)) >> p`` then the uint8 clamp, on values already divided by 2**p."""
    return x.add_(0.5).floor_().clamp_(0.0, 255.0)


def crop_rows(flat: torch.Tensor, starts: torch.Tensor, width: int) -> torch.Tensor:
    """Rows of ``width`` bytes starting at each of ``starts`` (any shape) of the flat uint8 buffer, one gather
    on its sliding-window view: (*starts.shape, width) uint8. The buffer must hold ``width`` bytes past the
    last start (the collate pads it)."""
    windows = flat.unfold(0, width, 1)  # (len - width + 1, width), strides (1, 1): a view, no copy
    return windows.index_select(0, starts.reshape(-1)).view(*starts.shape, width)


def _gather(flat: torch.Tensor, geom: torch.Tensor, pad_h: int, pad_w: int) -> torch.Tensor:
    """The crops of ``geom`` rows, padded to (pad_h, pad_w): float32 (n, 3 * pad_h, pad_w). Padded rows repeat a
    crop's last row and padded columns read on (finite values): both meet zero weights."""
    off, H, W, top, left, h = geom[:, :6].unbind(1)
    ch = torch.arange(3, device=flat.device)
    r = torch.arange(pad_h, device=flat.device)
    row = torch.minimum(top[:, None] + r[None, :], (top + h - 1)[:, None])
    starts = (off[:, None, None] + ch[None, :, None] * (H * W)[:, None, None] + (row * W[:, None])[:, None, :]
              + left[:, None, None])
    return crop_rows(flat, starts, pad_w).to(torch.float32).view(len(geom), 3 * pad_h, pad_w)


def resize_crops(flat: torch.Tensor, geom: torch.Tensor, out_size: int,
                 chunks: list[tuple[int, int, int, int]]) -> torch.Tensor:
    """Crop + resize + flip of n crops: float32 (n, 3, out_size, out_size) holding uint8 levels 0..255.
    ``geom``: (n, 8) int64 per crop (offset in ``flat``, H, W, top, left, h, w, flip). ``chunks``: host-known
    (start, stop, pad_h, pad_w) row ranges covering ``geom`` (see :func:`chunk_rows`); each is one gather and
    two matmuls."""
    n = len(geom)
    taps = max_taps(max(max(c[2], c[3]) for c in chunks), out_size)
    flip = torch.cat([geom[:, 7].bool(), torch.zeros_like(geom[:, 7], dtype=torch.bool)])
    both = tap_table(torch.cat([geom[:, 6], geom[:, 5]]), out_size, taps, flip=flip)  # widths, then heights
    wtab, htab = [t[:n] for t in both], [t[n:] for t in both]
    parts = []
    for a, b, pad_h, pad_w in chunks:
        x = _gather(flat, geom[a:b], pad_h, pad_w)
        ww = dense_weights([t[a:b] for t in wtab], pad_w)  # (n, S, pad_w)
        wh = dense_weights([t[a:b] for t in htab], pad_h)  # (n, S, pad_h)
        with ieee_fp32():
            t = _round_u8(torch.bmm(x, ww.transpose(1, 2)))  # (n, 3 * pad_h, S): horizontal pass first, as torch
            t = t.view(b - a, 3, pad_h, out_size)
            parts.append(_round_u8(torch.matmul(wh[:, None], t)))  # (n, 3, S, S)
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def chunk_rows(h: np.ndarray, w: np.ndarray, waste: float = 1.5, max_chunks: int = 8,
               max_elems: int = 1 << 26) -> list[np.ndarray]:
    """Crop indices of one output size cut into chunks, in ascending area. A chunk closes when the next crop would
    make its padded pixels exceed ``waste`` x its real ones (once it holds 1/``max_chunks`` of the crops) or its
    padded elements exceed ``max_elems``."""
    order = np.argsort(h.astype(np.int64) * w, kind="stable")
    least = -(-len(order) // max_chunks)
    chunks, cur, real, mh, mw = [], [], 0, 0, 0
    for i in order.tolist():
        hi, wi = int(h[i]), int(w[i])
        nh, nw, nreal = max(mh, hi), max(mw, wi), real + hi * wi
        padded = (len(cur) + 1) * nh * nw
        if cur and ((len(cur) >= least and padded > waste * nreal) or 3 * padded > max_elems):
            chunks.append(np.asarray(cur, dtype=np.int64))
            cur, nh, nw, nreal = [], hi, wi, hi * wi
        cur.append(i)
        real, mh, mw = nreal, nh, nw
    if cur:
        chunks.append(np.asarray(cur, dtype=np.int64))
    return chunks
