"""Matplotlib figures for the analyses (Agg backend: no display needed). Every function returns a Figure;
``analysis.output.AnalysisRun.save_figure`` writes it as PNG and logs it to TensorBoard."""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from datamodules.transforms.views import IMAGENET_MEAN, IMAGENET_STD  # noqa: E402


def to_display(img: torch.Tensor) -> np.ndarray:
    """(3, H, W) uint8 or ImageNet-normalised float -> (H, W, 3) float in [0, 1]."""
    x = img.detach().cpu()
    if x.dtype == torch.uint8:
        x = x.float() / 255
    else:
        x = x.float() * torch.tensor(IMAGENET_STD)[:, None, None] + torch.tensor(IMAGENET_MEAN)[:, None, None]
    return x.clamp(0, 1).permute(1, 2, 0).numpy()


def _grid(n: int, cols: int, cell: float = 2.2, rows_per_item: int = 1):
    cols = max(1, min(cols, n))
    rows = math.ceil(n / cols) * rows_per_item
    fig, axes = plt.subplots(rows, cols, figsize=(cell * cols, cell * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    return fig, axes


def _box(ax, b, color, lw=1.5, ls="-"):
    x0, y0, x1, y1 = [float(v) for v in b]
    ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, edgecolor=color, linewidth=lw, linestyle=ls))


def heatmap_overlays(images: Sequence[torch.Tensor], maps: Sequence[torch.Tensor], title: str,
                     boxes: Sequence | None = None, pred_boxes: Sequence | None = None,
                     markers: Sequence | None = None, captions: Sequence[str] | None = None,
                     cmap: str = "inferno", cols: int = 4):
    """Each image next to its (h, w) map (upsampled nearest), with GT boxes (green), predicted boxes (red) and a
    marker (cyan square) on one patch index per image."""
    n = len(images)
    fig, axes = _grid(n, cols, rows_per_item=2)
    ncols = axes.shape[1]
    for i in range(n):
        r, c = divmod(i, ncols)
        img = to_display(images[i])
        H, W = img.shape[:2]
        m = maps[i].detach().float().cpu().numpy()
        h, w = m.shape
        a0, a1 = axes[2 * r, c], axes[2 * r + 1, c]
        a0.imshow(img)
        a1.imshow(img)
        a1.imshow(m, cmap=cmap, alpha=0.65, extent=(0, W, H, 0), interpolation="nearest")
        for ax in (a0, a1):
            for b in (boxes[i] if boxes is not None else []):
                _box(ax, b, "lime")
            for b in (pred_boxes[i] if pred_boxes is not None else []):
                _box(ax, b, "red", lw=2, ls="--")
        if markers is not None and markers[i] is not None:
            py, px = divmod(int(markers[i]), w)
            ph, pw = H / h, W / w
            _box(a1, (px * pw, py * ph, (px + 1) * pw, (py + 1) * ph), "cyan", lw=2)
        if captions is not None:
            a0.set_title(captions[i], fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def rgb_maps(images: Sequence[torch.Tensor], rows: Mapping[str, torch.Tensor], title: str):
    """Images in the first row, then one row per named (B, 3, h, w) RGB map set (e.g. PCA joint / per image / fg)."""
    n = len(images)
    fig, axes = plt.subplots(1 + len(rows), n, figsize=(1.8 * n, 1.9 * (1 + len(rows))), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for i in range(n):
        axes[0, i].imshow(to_display(images[i]))
    for r, (name, maps) in enumerate(rows.items(), start=1):
        for i in range(n):
            axes[r, i].imshow(maps[i].permute(1, 2, 0).cpu().numpy(), interpolation="nearest")
        axes[r, 0].set_title(name, fontsize=8, loc="left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def layer_curves(curves: Mapping[str, Sequence[float]], title: str, ylabel: str, xlabel: str = "block",
                 xs: Sequence[int] | None = None, percent: bool = False):
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for name, ys in curves.items():
        y = np.asarray(ys, dtype=float) * (100 if percent else 1)
        x = list(xs) if xs is not None else list(range(len(y)))
        ax.plot(x, y, marker="o", label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.xaxis.get_major_locator().set_params(integer=True)  # blocks are integers
    if len(curves) > 1:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def norm_histograms(stats: Sequence[dict], title: str):
    """One log-x histogram of patch-token norms per layer with the high-norm threshold (if any) as a red line."""
    n = len(stats)
    cols = min(4, n)
    fig, axes = plt.subplots(math.ceil(n / cols), cols, figsize=(3 * cols, 2.3 * math.ceil(n / cols)), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    for ax, s in zip(axes.flat, stats):
        e = np.asarray(s["hist_edges"])
        ax.stairs(s["hist_counts"], e, fill=True, alpha=0.7)
        ax.set_xscale("log")
        if s["high_norm_threshold"] is not None:
            ax.axvline(s["high_norm_threshold"], color="red", lw=1)
        ax.set_title(f"block {s['layer']}: high-norm {100 * s['high_norm_share']:.1f}%", fontsize=8)
        ax.tick_params(labelsize=6)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def layer_head_heatmaps(stats: Mapping[str, torch.Tensor], title: str, layers: Sequence[int] | None = None):
    """One (layers x heads) heatmap per statistic, with values written in the cells."""
    fig, axes = plt.subplots(1, len(stats), figsize=(3.4 * len(stats), 0.5 * next(iter(stats.values())).shape[0] + 1.6),
                             squeeze=False)
    for ax, (name, v) in zip(axes[0], stats.items()):
        a = v.detach().cpu().numpy()
        im = ax.imshow(a, aspect="auto", cmap="viridis")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("head")
        ax.set_ylabel("block")
        ax.set_xticks(range(a.shape[1]))
        ax.set_yticks(range(a.shape[0]), labels=[str(l) for l in (layers or range(a.shape[0]))])
        if a.size <= 64:
            for (i, j), val in np.ndenumerate(a):
                ax.text(j, i, f"{val:.2g}", ha="center", va="center", fontsize=6, color="w")
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def head_maps(images: Sequence[torch.Tensor], maps: torch.Tensor, title: str):
    """Per image: the image, then each head's (h, w) map (e.g. [CLS]->patch attention)."""
    n, H = len(images), maps.shape[1]
    fig, axes = plt.subplots(n, H + 1, figsize=(1.7 * (H + 1), 1.7 * n), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for i in range(n):
        axes[i, 0].imshow(to_display(images[i]))
        for h in range(H):
            axes[i, h + 1].imshow(maps[i, h].cpu().numpy(), cmap="inferno", interpolation="nearest")
            if i == 0:
                axes[i, h + 1].set_title(f"head {h}", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
