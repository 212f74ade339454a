"""Paired statistics of a measure's change on the same images: the calibration's dosed backbone against the undosed
one, image by image (``analysis/calibration.py``). The study's statistics over training seeds live elsewhere.

- ``paired_bootstrap``: Δ = stat(dosed) - stat(undosed), recomputed on resamples of the images drawn with
  replacement (the same resample for both arms, so the spread between images that both share cancels) and, where
  the measure has probe seeds, on a probe seed drawn per replicate; se = the replicates' sd.
- ``seed_delta``: a measure without per-image terms (overclustering: one k-means over all images) gets a t interval
  from its probe seeds' paired differences.
- The interval is Δ ± z se (z = 1.96, 95 %); with a study's training-seed sd ``s`` (the same measure, two trained
  models of one recipe) it widens to Δ ± z √(se² + 2 s²): a change between two trained models carries both seeds'
  noise.
- Detection: the interval excludes 0 on the expected side. Scaling to N images: se ∝ 1/√n, so a half-width ``h`` at
  n images is ``h √(n / N)`` at N (the seed term does not shrink).

    >>> d = PairedDelta(-3.0, se=1.0, n=100, replicates=200, source="images")
    >>> round(d.half_width, 2), d.detected("down"), d.detected("up"), d.against("up")
    (1.96, True, False, True)
    >>> round(PairedDelta(-3.0, 1.0, 100, 200, "images", seed_sd=1.0).half_width, 3)  # 1.96 * sqrt(1 + 2)
    3.395
    >>> round(d.half_width_at(400), 2)  # 4x the images: half the half-width
    0.98
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Sequence

import torch

Z95 = 1.959964  # two-sided 95 % normal quantile


@dataclass(frozen=True)
class PairedDelta:
    delta: float                    # stat(dosed) - stat(undosed) on all images (mean over probe seeds)
    se: Optional[float]             # its standard error (bootstrap over images and seeds, or over seeds)
    n: int                          # images (0: not resampled)
    replicates: int                 # bootstrap replicates or probe seeds
    source: str                     # "images", "images+seeds" or "seeds"
    seed_sd: Optional[float] = None  # a study's training-seed sd of the measure, if given

    @property
    def half_width(self) -> Optional[float]:
        return self.half_width_at(self.n)

    def half_width_at(self, n: int) -> Optional[float]:
        """The interval's half-width at ``n`` images (se ∝ 1/√n; the seed term stays)."""
        if self.se is None:
            return None
        se = self.se * math.sqrt(self.n / n) if self.n and n else self.se
        return Z95 * math.sqrt(se ** 2 + 2 * (self.seed_sd or 0.0) ** 2)

    def detected(self, direction: str) -> bool:
        """The interval excludes 0 on the side of ``direction`` ("up", "down"; "none": either side)."""
        h = self.half_width
        if h is None or abs(self.delta) <= h:
            return False
        return direction == "none" or (self.delta > 0) == (direction == "up")

    def against(self, direction: str) -> bool:
        """The interval excludes 0 on the side opposite to ``direction``."""
        return direction != "none" and self.detected("down" if direction == "up" else "up")

    def as_dict(self) -> dict:
        h = self.half_width
        lo, hi = (None, None) if h is None else (self.delta - h, self.delta + h)
        return {**asdict(self), "lo": lo, "hi": hi, "half_width": h}


def sample_sd(values: Sequence[float]) -> Optional[float]:
    """Sample standard deviation (ddof = 1) of the finite values; None with fewer than 2."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if len(vals) < 2:
        return None
    mean = math.fsum(vals) / len(vals)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / (len(vals) - 1))


def paired_bootstrap(n: int, dosed: Callable, undosed: Callable, seeds: int = 1, replicates: int = 200,
                     seed: int = 0, seed_sd: Optional[float] = None) -> PairedDelta:
    """Δ of ``dosed(idx, s) - undosed(idx, s)`` (idx: (n,) long image indices or None for all; s: probe seed), its
    se over ``replicates`` paired resamples of the images (and a probe seed each, with ``seeds`` > 1), drawn from a
    generator seeded with ``seed``: the same resamples on every run and for every dose."""
    delta = math.fsum(dosed(None, s) - undosed(None, s) for s in range(seeds)) / seeds
    g = torch.Generator().manual_seed(int(seed))
    reps = []
    for _ in range(int(replicates) if n >= 2 else 0):
        idx, s = torch.randint(0, n, (n,), generator=g), int(torch.randint(0, seeds, (1,), generator=g))
        reps.append(dosed(idx, s) - undosed(idx, s))
    return PairedDelta(delta, sample_sd(reps), n, len(reps), "images+seeds" if seeds > 1 else "images", seed_sd)


def seed_delta(dosed: Sequence[float], undosed: Sequence[float], seed_sd: Optional[float] = None) -> PairedDelta:
    """Δ and se of the probe seeds' paired differences (no per-image terms): sd / √S, times t(S - 1) / z so that
    the interval ``Δ ± z se`` is Student's t interval over the S seeds."""
    from scipy.stats import t
    diffs = [a - b for a, b in zip(dosed, undosed)]
    sd, S = sample_sd(diffs), len(diffs)
    se = None if sd is None else sd / math.sqrt(S) * float(t.ppf(0.975, S - 1)) / Z95
    return PairedDelta(math.fsum(diffs) / S, se, 0, S, "seeds", seed_sd)
