"""The depth profile of a layer sweep (``--layer all``): one line per series (a memory size, a K) over the blocks,
saved as a PNG next to results.json."""
from __future__ import annotations

from pathlib import Path
from typing import Callable


def plot_depth_profile(layers: dict[str, dict], series: Callable[[dict], dict], path: Path, title: str = "",
                       ylabel: str = "mIoU") -> Path:
    """``layers``: {"block_<i>": metrics}; ``series(metrics) -> {name: value}``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    blocks = sorted(layers, key=lambda k: int(k.rsplit("_", 1)[1]))
    lines: dict[str, list[float]] = {}
    for b in blocks:
        for name, v in series(layers[b]).items():
            lines.setdefault(name, []).append(v)
    x = [int(b.rsplit("_", 1)[1]) for b in blocks]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for name, ys in lines.items():
        ax.plot(x, ys, marker="o", label=str(name))
    ax.set_xlabel("block")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
