"""Patch-token L2 norms per layer and the share of tokens in the high-norm mode.

The mode's definition (log norms, a 2-component Gaussian mixture by EM from Otsu's split, accepted only when
Ashman's D > 2, the high component is the minority, the density has a valley between the means and the centres
differ by ``MIN_MODE_RATIO``) is given in docs/analysis.md, "High-norm tokens". A unimodal layer reports 0;
``share_above_2x_median`` is the model-free companion.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

__all__ = ["patch_norms", "otsu_threshold", "fit_gmm2", "high_norm_mode", "norm_stats", "norm_distribution",
           "norm_stats_per_layer"]

ASHMAN_D_MIN = 2.0
VALLEY_RATIO = 0.5
MIN_MODE_RATIO = 1.5
QUANTILES = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)


def patch_norms(patch: torch.Tensor) -> torch.Tensor:
    """L2 norm of every patch token: (B, N, D) -> (B, N)."""
    if patch.ndim != 3:
        raise ValueError(f"expected patch tokens (B, N, D), got {tuple(patch.shape)}")
    return torch.linalg.vector_norm(patch.detach().to(torch.float64), dim=-1)


def otsu_threshold(x: np.ndarray) -> float:
    """Threshold maximising the between-class variance of a 1-D sample (exact, over all split points)."""
    v = np.sort(np.asarray(x, dtype=np.float64).ravel())
    n = v.size
    if n < 2 or v[0] == v[-1]:
        return float(v[-1]) if n else float("nan")
    c = np.cumsum(v)
    k = np.arange(1, n)  # split after the k-th smallest value
    m0 = c[:-1] / k
    m1 = (c[-1] - c[:-1]) / (n - k)
    between = k * (n - k) * (m0 - m1) ** 2
    between[v[1:] == v[:-1]] = -1  # only split between distinct values
    i = int(np.argmax(between))
    return float((v[i] + v[i + 1]) / 2)


def fit_gmm2(x: np.ndarray, iters: int = 200, tol: float = 1e-10) -> dict[str, float]:
    """2-component 1-D Gaussian mixture by EM. Returns weights/means/stds with component 'hi' the larger mean."""
    x = np.asarray(x, dtype=np.float64).ravel()
    t = otsu_threshold(x)
    lo, hi = x[x <= t], x[x > t]
    if lo.size == 0 or hi.size == 0:
        raise ValueError("fit_gmm2 needs at least two distinct values")
    spread = max(x.std(), 1e-12)
    floor = (1e-3 * spread) ** 2  # variance floor: keeps EM away from single-point degenerate components
    w = np.array([lo.size, hi.size], dtype=np.float64) / x.size
    mu = np.array([lo.mean(), hi.mean()])
    var = np.maximum(np.array([lo.var(), hi.var()]), floor)
    prev = -np.inf
    for _ in range(iters):
        logp = -0.5 * ((x[:, None] - mu) ** 2 / var + np.log(2 * np.pi * var)) + np.log(np.maximum(w, 1e-300))
        m = logp.max(1, keepdims=True)
        ll = float((m[:, 0] + np.log(np.exp(logp - m).sum(1))).sum())
        r = np.exp(logp - m)
        r /= r.sum(1, keepdims=True)
        nk = r.sum(0)
        if np.any(nk < 1e-9):
            break
        w = nk / x.size
        mu = (r * x[:, None]).sum(0) / nk
        var = np.maximum((r * (x[:, None] - mu) ** 2).sum(0) / nk, floor)
        if ll - prev < tol * abs(ll):
            break
        prev = ll
    order = np.argsort(mu)
    w, mu, var = w[order], mu[order], var[order]
    return {"w_lo": float(w[0]), "w_hi": float(w[1]), "mu_lo": float(mu[0]), "mu_hi": float(mu[1]),
            "sd_lo": float(math.sqrt(var[0])), "sd_hi": float(math.sqrt(var[1]))}


def _posterior_hi(x: np.ndarray, g: dict[str, float]) -> np.ndarray:
    def logn(mu, sd):
        return -0.5 * ((x - mu) / sd) ** 2 - np.log(sd)
    a = np.log(g["w_lo"]) + logn(g["mu_lo"], g["sd_lo"])
    b = np.log(g["w_hi"]) + logn(g["mu_hi"], g["sd_hi"])
    return 1.0 / (1.0 + np.exp(np.clip(a - b, -700, 700)))


def _mixture_pdf(x: float, g: dict[str, float]) -> float:
    def n(mu, sd):
        return math.exp(-0.5 * ((x - mu) / sd) ** 2) / (sd * math.sqrt(2 * math.pi))
    return g["w_lo"] * n(g["mu_lo"], g["sd_lo"]) + g["w_hi"] * n(g["mu_hi"], g["sd_hi"])


def high_norm_mode(norms: torch.Tensor | np.ndarray) -> dict:
    """The high-norm mode of token norms (docs/analysis.md): {"bimodal", "share", "threshold" (or None),
    "ashman_d", "gmm", "mask" (bool, shaped like ``norms``)}."""
    n = norms.detach().cpu().numpy() if isinstance(norms, torch.Tensor) else np.asarray(norms)
    shape = n.shape
    n = n.astype(np.float64).ravel()
    if np.any(n <= 0):
        n = np.maximum(n, np.finfo(np.float64).tiny)  # a zero-norm token (rare) goes to the low side
    ln = np.log(n)
    none = {"bimodal": False, "share": 0.0, "threshold": None, "ashman_d": 0.0, "gmm": None,
            "mask": np.zeros(shape, dtype=bool)}
    if ln.size < 4 or np.ptp(ln) == 0:
        return none
    g = fit_gmm2(ln)
    d = math.sqrt(2) * abs(g["mu_hi"] - g["mu_lo"]) / math.sqrt(g["sd_hi"] ** 2 + g["sd_lo"] ** 2)
    if not (d > ASHMAN_D_MIN and g["w_hi"] < 0.5 and g["mu_hi"] - g["mu_lo"] >= math.log(MIN_MODE_RATIO)):
        return {**none, "ashman_d": d, "gmm": g}
    # decision boundary between the means: bisection on the posterior (monotone there)
    a, b = g["mu_lo"], g["mu_hi"]
    for _ in range(100):
        c = (a + b) / 2
        if _posterior_hi(np.array([c]), g)[0] > 0.5:
            b = c
        else:
            a = c
    t = (a + b) / 2
    peaks = min(_mixture_pdf(g["mu_lo"], g), _mixture_pdf(g["mu_hi"], g))
    if not _mixture_pdf(t, g) < VALLEY_RATIO * peaks:
        return {**none, "ashman_d": d, "gmm": g}
    mask = _posterior_hi(ln, g) > 0.5
    return {"bimodal": True, "share": float(mask.mean()), "threshold": float(math.exp(t)),
            "ashman_d": d, "gmm": g, "mask": mask.reshape(shape)}


def norm_stats(patch: torch.Tensor, bins: int = 50) -> dict:
    """Norm distribution of one layer's patch tokens (B, N, D): moments, quantiles, log-spaced histogram, high mode."""
    return norm_distribution(patch_norms(patch), bins)


def norm_distribution(norms: torch.Tensor, bins: int = 50) -> dict:
    """:func:`norm_stats` from the token norms themselves (any shape, e.g. (B, N) of :func:`patch_norms`)."""
    v = norms.flatten().cpu().numpy()
    hm = high_norm_mode(v)
    med = float(np.median(v))
    lo, hi = max(float(v.min()), 1e-12), max(float(v.max()), 1e-12)
    edges = np.geomspace(lo, hi * (1 + 1e-9), bins + 1) if hi > lo else np.array([lo, lo + 1.0])
    counts, _ = np.histogram(v, bins=edges)
    return {
        "count": int(v.size), "mean": float(v.mean()), "std": float(v.std()), "min": float(v.min()),
        "max": float(v.max()), "median": med,
        "quantiles": {str(q): float(np.quantile(v, q)) for q in QUANTILES},
        "high_norm_share": hm["share"], "high_norm_threshold": hm["threshold"], "bimodal": hm["bimodal"],
        "ashman_d": hm["ashman_d"], "gmm": hm["gmm"],
        "share_above_2x_median": float((v > 2 * med).mean()),
        "hist_edges": edges.tolist(), "hist_counts": counts.tolist(),
    }


def norm_stats_per_layer(patches: Sequence[torch.Tensor], layers: Sequence[int] | None = None) -> list[dict]:
    """:func:`norm_stats` for each layer's (B, N, D) patch tokens; ``layers`` labels them (block indices)."""
    layers = list(layers) if layers is not None else list(range(len(patches)))
    return [{"layer": int(l), **norm_stats(p)} for l, p in zip(layers, patches)]
