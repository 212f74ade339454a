"""The plots of ``make report``: analysis curves per block (PiB, high-norm share, attention zeros) and the probe
layer sweeps (``make probe LAYER=all``), one line per variant (and data set), from ``report.collect``'s results.
"""
from __future__ import annotations

import io
from pathlib import Path

from tokenmix.io import atomic_write

ANALYSIS_CURVES = (("pib", "pib_per_layer", "Point-in-Box per block", "PiB (%)"),
                   ("norms", "high_norm_share_per_layer", "high norm share per layer", "fraction"),
                   ("attention", "zero_share_per_layer", "zero share per layer", "fraction"))


def save_png(fig, path: Path) -> None:
    """A matplotlib figure -> PNG file, written atomically (and the figure closed)."""
    import matplotlib.pyplot as plt
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    with atomic_write(path, "wb") as f:
        f.write(buf.getvalue())


def _label(f, with_data: bool) -> str:
    base = f.variant if f.kind == "real" else f"{f.variant} [{f.kind}]"
    return base if not with_data or f.data == "demo" else f"{base} ({f.data})"


def _newest(found, keep, key) -> dict:
    """The newest result per ``key(f)`` among those ``keep`` accepts, in key order."""
    best: dict = {}
    for f in found:
        if keep(f) and (key(f) not in best or (f.created, str(f.path)) > (best[key(f)].created,
                                                                          str(best[key(f)].path))):
            best[key(f)] = f
    return dict(sorted(best.items()))


def analysis_plots(found, out: Path) -> list[str]:
    from .figures import layer_curves
    written = []
    for task, metric, title, ylabel in ANALYSIS_CURVES:
        latest = _newest(found, lambda f: f.source == "analysis" and f.task == task,
                         lambda f: (f.variant, f.kind, f.data))
        curves = {_label(f, True): [float("nan") if x is None else x for x in f.payload["metrics"][metric]]
                  for f in latest.values() if f.payload["metrics"].get(metric)}
        if curves:
            save_png(layer_curves(curves, title, ylabel), out / f"{metric}.png")
            written.append(f"{metric}.png")
    return written


def sweep_plots(found, out: Path, columns) -> list[str]:
    """One figure per probe task with a layer sweep: its report column's metric against the block."""
    import matplotlib.pyplot as plt
    written = []
    latest = _newest(found, lambda f: f.source == "probe" and f.sweep, lambda f: (f.task, f.variant, f.kind))
    for task in sorted({t for t, _, _ in latest}):
        col = next((c for c in columns if c.source == "probe" and c.task == task), None)
        if col is None:
            continue
        fig, ax = plt.subplots(figsize=(5, 3.2))
        for f in (f for (t, _, _), f in latest.items() if t == task):
            pts = sorted((int(name.split("_")[-1]), col.pick(m, f.payload))
                         for name, m in f.payload["metrics"]["layers"].items() if name.startswith("block_"))
            ax.plot([p[0] for p in pts], [float("nan") if p[1] is None else p[1] for p in pts], marker="o",
                    label=_label(f, False))
        ax.set_xlabel("block")
        ax.set_ylabel(col.title)
        ax.set_title(f"{task}: probe per block", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        save_png(fig, out / f"probe_per_layer_{task}.png")
        written.append(f"probe_per_layer_{task}.png")
    return written


def plots(found, out: Path, columns) -> list[str]:
    return analysis_plots(found, out) + sweep_plots(found, out, columns)
