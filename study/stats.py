"""Seed statistics of the study.

A cell = one variant x one metric over n seeds: mean, sample standard deviation s (ddof=1) and standard
error se = s / sqrt(n). The difference of a variant a to the baseline b is Δ = mean_a - mean_b with the
unpaired (Welch) standard error se_Δ = sqrt(se_a² + se_b²). Δ is *inside seed noise* when
|Δ| <= 2·se_Δ (within two standard errors: ``tokenmix.noise.inside_noise``, the rule the calibration's noise bands
use too), *outside* otherwise; undecided when either side has n < 2.

    >>> a, b = summarize([1.0, 2.0, 3.0]), summarize([0.0, 0.0, 3.0])
    >>> round(a.std, 6), round(a.se, 6)
    (1.0, 0.57735)
    >>> d = compare(a, b); round(d.delta, 6), round(d.se, 6), d.inside_noise
    (1.0, 1.154701, True)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from tokenmix.noise import inside_noise


@dataclass(frozen=True)
class Summary:
    values: tuple[float, ...]
    n: int
    mean: float
    std: Optional[float]  # None when n < 2
    se: Optional[float]


@dataclass(frozen=True)
class Difference:
    delta: float
    se: Optional[float]
    inside_noise: Optional[bool]  # None: undecided (a side has fewer than 2 seeds)


def summarize(values: Sequence[float]) -> Optional[Summary]:
    vals = tuple(float(v) for v in values if v is not None and math.isfinite(float(v)))
    if not vals:
        return None
    n = len(vals)
    mean = math.fsum(vals) / n
    if n < 2:
        return Summary(vals, n, mean, None, None)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / (n - 1))
    return Summary(vals, n, mean, std, std / math.sqrt(n))


def compare(a: Summary, b: Summary) -> Difference:
    delta = a.mean - b.mean
    if a.se is None or b.se is None:
        return Difference(delta, None, None)
    se = math.sqrt(a.se ** 2 + b.se ** 2)
    return Difference(delta, se, inside_noise(delta, se))
