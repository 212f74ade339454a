"""Noise of a measure, and the one rule that says whether a difference is beyond it. Shared by the study's seed
verdict (``study/stats.py``: Δ between variants against the standard error of Δ over training seeds) and the
calibration (``analysis/calibration.py``: a measure's response to the diffusion dial against the spread of one
evaluation of the same checkpoint over probe seeds and over images).

- A difference ``delta`` is *inside noise* when ``|delta| <= NOISE_SIGMAS * sd`` (two standard deviations of the
  difference's noise, about a 95 % band for a normal error).
- ``NoiseBand``: the standard deviation of one evaluation of a measure, estimated from replicates of it: the same
  checkpoint evaluated with different probe seeds (a probe that draws: retrieval memory, k-means init) and/or a
  bootstrap over the evaluated images (resampled with replacement; any probe, seeded or not). Independent sources
  add in variance (``combine``).
- ``verdict``: how a measure answered a change whose sign is known (the dial): it *moves* (beyond the band, in the
  expected direction), is *blind* (inside the band) or moves the *wrong way*.

    >>> inside_noise(0.3, 0.2), inside_noise(0.5, 0.2), inside_noise(1.0, None)
    (True, False, None)
    >>> b = noise_band([1.0, 2.0, 3.0], "seeds"); b.sd, b.half_width
    (1.0, 2.0)
    >>> verdict(-3.0, b, Direction.DOWN).value, verdict(1.5, b, Direction.UP).value, verdict(3.0, b, Direction.DOWN).value
    ('moves', 'blind', 'wrong way')
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Optional, Sequence

import torch

NOISE_SIGMAS = 2.0  # a difference within 2 standard deviations of its noise is not evidence


class Direction(str, Enum):
    """Which way a measure is expected to go as the effect grows."""
    UP = "up"
    DOWN = "down"
    NONE = "none"  # reported beside the others, no expectation (e.g. the [CLS] k-NN)


class Verdict(str, Enum):
    MOVES = "moves"          # beyond its noise band, in the expected direction
    BLIND = "blind"          # inside its noise band: it cannot see the effect at this size
    WRONG_WAY = "wrong way"  # beyond its noise band, against the expected direction
    REPORTED = "reported"    # no expected direction


def inside_noise(delta: float, sd: Optional[float]) -> Optional[bool]:
    """``|delta| <= NOISE_SIGMAS * sd``; None when the noise is unknown (``sd`` None)."""
    if sd is None:
        return None
    return abs(delta) <= NOISE_SIGMAS * sd


def sample_sd(values: Sequence[float]) -> Optional[float]:
    """Sample standard deviation (ddof = 1) of the finite values; None with fewer than 2."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if len(vals) < 2:
        return None
    mean = math.fsum(vals) / len(vals)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / (len(vals) - 1))


@dataclass(frozen=True)
class NoiseBand:
    sd: Optional[float]  # standard deviation of one evaluation; None: not estimable (< 2 replicates)
    n: int               # replicates it was estimated from
    source: str          # "seeds", "bootstrap" or "seeds+bootstrap"

    @property
    def half_width(self) -> Optional[float]:
        return None if self.sd is None else NOISE_SIGMAS * self.sd

    def as_dict(self) -> dict:
        return {"sd": self.sd, "half_width": self.half_width, "sigmas": NOISE_SIGMAS, "replicates": self.n,
                "source": self.source}


def noise_band(values: Sequence[float], source: str) -> NoiseBand:
    """The band of replicates ``values`` of one evaluation (probe seeds or bootstrap resamples)."""
    return NoiseBand(sample_sd(values), len(values), source)


def combine(*bands: NoiseBand) -> NoiseBand:
    """Independent noise sources add in variance; unknown ones are left out (None if all are)."""
    known = [b for b in bands if b.sd is not None]
    sd = math.sqrt(math.fsum(b.sd ** 2 for b in known)) if known else None
    return NoiseBand(sd, min((b.n for b in bands), default=0), "+".join(b.source for b in bands))


def bootstrap(n_items: int, stat: Callable[[torch.Tensor], float], replicates: int = 200,
              seed: int = 0) -> list[float]:
    """``stat(idx)`` on ``replicates`` resamples of ``range(n_items)`` with replacement (``idx``: (n_items,) long),
    drawn from a generator seeded with ``seed``: the same resamples on every run."""
    if n_items < 2:
        return []
    g = torch.Generator().manual_seed(int(seed))
    return [float(stat(torch.randint(0, n_items, (n_items,), generator=g))) for _ in range(int(replicates))]


def verdict(delta: float, band: NoiseBand, direction: Direction) -> Verdict:
    """How a measure answered a change of known sign: ``delta`` = value with the effect - value without."""
    direction = Direction(direction)
    if direction is Direction.NONE:
        return Verdict.REPORTED
    if band.sd is None or inside_noise(delta, band.sd):
        return Verdict.BLIND  # unknown noise cannot vouch for a response either
    return Verdict.MOVES if (delta > 0) == (direction is Direction.UP) else Verdict.WRONG_WAY
