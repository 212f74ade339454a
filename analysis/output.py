"""Where an analysis writes: ``runs/<variant>/analysis/<task>/version_N/`` with PNG figures, ``results.json`` and
TensorBoard event files (the same figures as images, headline numbers as scalars), all in one folder so
``make tensorboard`` (``--logdir runs``) shows them next to the pretraining and probe runs. results.json follows
the one schema of ``tokenmix.results``; the PNG file names are listed under ``metrics["figures"]``."""
from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import numpy as np

from tokenmix import paths
from tokenmix.io import atomic_write
from tokenmix.results import write_results


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+=-]", "_", name)


class AnalysisRun:
    def __init__(self, variant: str, task: str, runs_root: Path | None = None, tensorboard: bool = True):
        root = Path(runs_root) if runs_root is not None else paths.RUNS
        self.dir = paths.claim_version_dir(root / _safe(variant) / "analysis" / _safe(task))
        self.figures: list[str] = []
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            self._tb = SummaryWriter(log_dir=str(self.dir))

    def save_figure(self, name: str, fig) -> Path:
        import matplotlib.pyplot as plt
        from PIL import Image

        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        plt.close(fig)
        png = buf.getvalue()
        path = self.dir / f"{_safe(name)}.png"
        with atomic_write(path, "wb") as f:
            f.write(png)
        self.figures.append(path.name)
        if self._tb is not None:
            arr = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
            self._tb.add_image(name, arr, dataformats="HWC")
        return path

    def log_scalar(self, tag: str, value: float, step: int = 0) -> None:
        if self._tb is not None and value is not None:
            self._tb.add_scalar(tag, float(value), step)

    def write_results(self, *, metrics: dict[str, Any], **fields: Any) -> Path:
        """results.json (``tokenmix.results`` schema) with the figures written so far under metrics["figures"]."""
        return write_results(self.dir, metrics={**metrics, "figures": list(self.figures)}, **fields)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
            self._tb = None
