"""Seed statistics on ``scipy.stats``, the one home of the study's verdicts (docs/study.md, "Statistics"):
``compare``: Δ, 95 % CI, p of the paired (same seeds, asked for) or Welch t-test, or why no test; ``adjust``:
Benjamini–Hochberg over one table; ``min_detectable`` / ``seeds_needed``: power 0.8 at α = 0.05 (noncentral t);
``probability_of_improvement``: rliable's, with a stratified percentile bootstrap CI.
"""
from __future__ import annotations

import bisect
import math
import warnings
from dataclasses import dataclass, replace
from typing import Optional, Sequence

import numpy as np
from scipy import stats as st
from scipy.optimize import brentq

ALPHA, POWER = 0.05, 0.8

# The papers' effects (method − baseline) by the study's metric keys, from docs/REFERENCE.md §1: entmax (DINO ViT-S/16)
# top-1 69.50 → 70.06, VOC 42.80 → 48.78, ADE20K 19.85 → 21.97, Cityscapes 36.79 → 37.87, depth RMSE 0.004–0.005
# lower (the smaller); LaSt-ViT PiB ViT-B/16 42.7 → 55.1 (ImageNet; ``pib_voc``: its demo analogue).
PAPER_EFFECTS = {"imagenet_linear": 0.56, "voc_miou": 5.98, "ade20k_miou": 2.12, "cityscapes_miou": 1.08,
                 "nyuv2_rmse": -0.004, "sunrgbd_rmse": -0.004, "kitti_rmse": -0.004, "pib_imagenet": 12.4,
                 "pib_voc": 12.4}


@dataclass(frozen=True)
class Summary:
    values: tuple[float, ...]
    n: int
    mean: float
    std: Optional[float]  # None when n < 2
    se: Optional[float]
    seeds: tuple = ()     # the seed of each value (same order); () when not known


def summarize(values: Sequence[Optional[float]], seeds: Sequence = ()) -> Optional[Summary]:
    keep = [i for i, v in enumerate(values) if v is not None and math.isfinite(float(v))]
    if not keep:
        return None
    vals = tuple(float(values[i]) for i in keep)
    n, mean = len(vals), float(np.mean(vals))
    std = float(np.std(vals, ddof=1)) if n > 1 else None
    return Summary(vals, n, mean, std, None if std is None else std / math.sqrt(n),
                   tuple(seeds[i] for i in keep) if seeds else ())


def summary_from_stats(mean: float, std: float, n: int) -> Summary:
    """A Summary with exactly this mean, sd and n (values mean + sd·z, z standardized): Welch's test of it equals
    ``ttest_ind_from_stats``, for tables that kept only mean ± sd (n); no seeds, so never paired."""
    z = np.linspace(-1.0, 1.0, n)
    z = z / np.std(z, ddof=1) if n > 1 else z
    return summarize(list(mean + std * z))


@dataclass(frozen=True)
class Difference:
    delta: float
    test: str                          # "Welch" | "paired" | "undecided" | "tie" | "no spread"
    p: Optional[float] = None          # two-sided p of `test`; None: no test
    ci: Optional[tuple[float, float]] = None  # 95 % confidence interval of delta
    df: Optional[float] = None
    mde: Optional[float] = None        # smallest |delta| detectable at these n (power 0.8), pooled seed sd
    p_adj: Optional[float] = None      # Benjamini–Hochberg over the table (``adjust``)

    @property
    def significant(self) -> bool:
        return self.p_adj is not None and self.p_adj <= ALPHA


def pooled_sd(cells: Sequence[tuple[int, float]]) -> Optional[float]:
    """sqrt(Σ (n − 1) sd² / Σ (n − 1)) over the (n, sd) cells with n >= 2; None without one."""
    cells = [(n, sd) for n, sd in cells if n > 1 and sd is not None]
    return math.sqrt(sum((n - 1) * sd ** 2 for n, sd in cells) / sum(n - 1 for n, _ in cells)) if cells else None


def compare(a: Summary, b: Summary, paired: bool = False) -> Difference:
    """Δ = a − b. ``paired``: the values come from runs whose seed fixes data order and probe draws."""
    delta = a.mean - b.mean
    if a.n < 2 or b.n < 2:
        return Difference(delta, "undecided")
    mde = min_detectable(pooled_sd([(a.n, a.std), (b.n, b.std)]), a.n, b.n)
    pair = paired and len(a.seeds) == a.n == b.n and sorted(a.seeds) == sorted(b.seeds) == sorted(set(a.seeds))
    x, y = ([v for _, v in sorted(zip(s.seeds, s.values))] if pair else s.values for s in (a, b))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy's precision warning on a constant side: its result is exact
        if pair and np.ptp(np.subtract(x, y)) > 0:
            r, test = st.ttest_rel(x, y), "paired"
        elif a.std > 0 or b.std > 0:
            r, test = st.ttest_ind(x, y, equal_var=False), "Welch"
        else:
            return Difference(delta, "tie" if delta == 0 else "no spread", mde=mde)
    ci = r.confidence_interval(1 - ALPHA)
    return Difference(delta, test, float(r.pvalue), (float(ci.low), float(ci.high)), float(r.df), mde)


def adjust(diffs: dict) -> dict:
    """Benjamini–Hochberg over the rows of one table that have a p: each gets its ``p_adj``."""
    keys = [k for k, d in diffs.items() if d.p is not None]
    q = st.false_discovery_control([diffs[k].p for k in keys], method="bh") if keys else []
    return {**diffs, **{k: replace(diffs[k], p_adj=float(x)) for k, x in zip(keys, q)}}


def power(effect: float, sd: float, n_a: int, n_b: int) -> float:
    """Power of the two-sided two-sample t-test (α = 0.05, df = n_a + n_b − 2) at a true |effect|."""
    df, nc = n_a + n_b - 2, abs(effect) / (sd * math.sqrt(1 / n_a + 1 / n_b))
    tc = st.t.ppf(1 - ALPHA / 2, df)
    return float(st.nct.sf(tc, df, nc) + st.nct.sf(tc, df, -nc))  # sf(-nc): cdf is nan far in its tail


def min_detectable(sd: Optional[float], n_a: int, n_b: int) -> Optional[float]:
    """None without a seed sd (unknown, or 0: constant values give no test, so no detectable effect either)."""
    if not sd or min(n_a, n_b) < 2:
        return None
    end = 30 * sd * math.sqrt(1 / n_a + 1 / n_b)  # nc = 30: power > 0.8 at any df >= 2
    return float(brentq(lambda d: power(d, sd, n_a, n_b) - POWER, 0.0, end))


def seeds_needed(effect: float, sd: Optional[float], cap: int = 10_000) -> Optional[int]:
    """Seeds a side (equal n) for power 0.8 at |effect|; None when sd is unknown (or 0) or more than ``cap``."""
    if not sd or effect == 0 or power(effect, sd, cap, cap) < POWER:
        return None
    return 2 + bisect.bisect_left(range(2, cap + 1), True, key=lambda n: power(effect, sd, n, n) >= POWER)


def _poi(*samples, axis=-1):
    """Mean over tasks of P(X > Y) + ½ P(X = Y); samples = x_1, y_1, x_2, y_2, ... (vectorized on ``axis``)."""
    out = []
    for x, y in zip(samples[::2], samples[1::2]):
        x, y = np.moveaxis(x, axis, -1)[..., :, None], np.moveaxis(y, axis, -1)[..., None, :]
        out.append(((x > y) + 0.5 * (x == y)).mean(axis=(-2, -1)))
    return np.mean(out, axis=0)


def probability_of_improvement(xs: Sequence[Sequence[float]], ys: Sequence[Sequence[float]],
                               resamples: int = 2000, seed: int = 0) -> Optional[tuple[float, float, float]]:
    """(estimate, CI low, CI high); xs[m], ys[m]: task m's seeds, higher = better; tasks with < 2 a side left out."""
    samples = [np.asarray(s, float) for x, y in zip(xs, ys) if len(x) > 1 and len(y) > 1 for s in (x, y)]
    if not samples:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a constant task: a degenerate bootstrap, still a valid percentile CI
        r = st.bootstrap(samples, _poi, n_resamples=resamples, method="percentile", vectorized=True,
                         rng=np.random.default_rng(seed))
    return float(_poi(*samples)), float(r.confidence_interval.low), float(r.confidence_interval.high)
