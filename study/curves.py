"""The study over training time (``AT``): each metric against training progress, and the "degradation" table.

Curve: mean ± std over seeds at every evaluated point. Degradation: the drop from the *best* point (best mean) to
the *last*, per seed (sign flipped for ↓ metrics: positive is "got worse"), as mean ± std with the p of the
one-sided one-sample t-test of drop > 0 (scipy). Picking the best point on the same seeds biases the drop
upwards; the report says so.

    >>> d = degradation({"e1": [(0, 50.0), (1, 52.0)], "": [(0, 46.0), (1, 47.0)]}, ["e1", ""], False)
    >>> d.best, d.last, d.drop.mean, d.drop.values
    ('e1', '', 4.5, (4.0, 5.0))
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from scipy import stats as st

from tokenmix.stats import Summary, summarize

from .points import FINAL


@dataclass(frozen=True)
class Degradation:
    best: str           # point label with the best mean
    last: str           # the last evaluated point
    best_mean: float
    last_mean: float
    drop: Summary       # per-seed drops (positive = worse at the last point)

    @property
    def p(self) -> Optional[float]:
        """One-sided one-sample t-test of drop > 0; None with < 2 seeds or no spread (0/0)."""
        return float(st.ttest_1samp(self.drop.values, 0.0, alternative="greater").pvalue) if self.drop.std else None


def point_summaries(curve: dict, points: Sequence[str]) -> dict[str, Summary]:
    """{point: Summary over seeds} for the points (in order) that have a value."""
    out = {}
    for p in points:
        s = summarize([v for _, v in curve.get(p, [])])
        if s is not None:
            out[p] = s
    return out


def degradation(curve: dict, points: Sequence[str], lower_is_better: bool) -> Optional[Degradation]:
    """``curve``: {point: [(seed, value)]}. None with fewer than two evaluated points."""
    sums = point_summaries(curve, points)
    if len(sums) < 2:
        return None
    order = list(sums)
    sign = -1.0 if lower_is_better else 1.0
    best = max(order, key=lambda p: (sign * sums[p].mean, -order.index(p)))  # ties: the earliest point
    last = order[-1]
    at_best, at_last = dict(curve[best]), dict(curve[last])
    drops = [sign * (at_best[s] - at_last[s]) for s in sorted(at_best) if s in at_last]
    drop = summarize(drops) or Summary((), 0, 0.0, None, None)
    return Degradation(best, last, sums[best].mean, sums[last].mean, drop)


def point_label(point: str) -> str:
    return "end" if point == FINAL else ("epoch " + point[1:] if point.startswith("e") else "step " + point[1:])


def plot_task(task: str, columns: list, variants: list[str], baseline: Optional[str], curves: dict,
              points: Sequence[str], progress: dict, path: Path) -> bool:
    """One PNG per task: one panel per metric, metric vs % of the schedule, a line per variant (mean) with a
    ±std band over seeds; the baseline is drawn black and dashed. False when nothing could be drawn."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from analysis.report_plots import save_png
    cols = [c for c in columns if any(curves.get((v, c.key)) for v in variants)]
    xs = [p for p in points if progress.get(p) is not None]
    if not cols or not xs:
        return False
    fig, axes = plt.subplots(1, len(cols), figsize=(4.2 * len(cols), 3.3), squeeze=False)
    for ax, col in zip(axes[0], cols):
        for i, v in enumerate(variants):
            sums = point_summaries(curves.get((v, col.key), {}), xs)
            if not sums:
                continue
            x = [progress[p] for p in sums]
            m = [s.mean for s in sums.values()]
            sd = [s.std or 0.0 for s in sums.values()]
            base = v == baseline
            ax.plot(x, m, "--" if base else "-", marker="o", ms=4, color="k" if base else f"C{i}",
                    lw=2.2 if base else 1.5, label=f"{v} (baseline)" if base else v, zorder=3 if base else 2)
            ax.fill_between(x, [a - b for a, b in zip(m, sd)], [a + b for a, b in zip(m, sd)],
                            color="k" if base else f"C{i}", alpha=0.12 if base else 0.18, lw=0)
        ax.set_xlabel("training progress (% of the schedule)", fontsize=8)
        ax.set_ylabel(col.title + (" ↓" if col.lower_is_better else ""), fontsize=8)
        ax.set_title(f"{col.title}: mean ± std over seeds", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path)
    return True
