"""summary.json of a training run: ``RunSummary`` (DINO) and ``SupervisedSummary`` on ``LossSummary``, which keeps
the loss windows (tensors on their device until the end: no host sync per step) and writes the file. Reads only
logged metrics. ``trainer.log_dir`` is a broadcast every rank reaches; rank 0 then writes, calling no collective."""
from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import Any, Optional

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from backbones import canary
from backbones.checkpoint import SUPERVISED
from tokenmix.results import write_summary


def _as_float(v: Any) -> Optional[float]:
    return None if v is None else float(v)


def _mean(xs) -> Optional[float]:
    xs = [float(x) for x in xs]
    return sum(xs) / len(xs) if xs else None


class LossSummary(pl.Callback):
    """The mean ``train/loss`` of the first and last ``window`` steps, and summary.json at the end of training.
    Subclasses name their ``objective`` and write ``summary``; ``observe`` sees each loss step's logged metrics."""

    objective = ""

    def __init__(self, window: int = 20):
        self.window = window
        self.first: list[Any] = []  # tensors, or floats after a resume
        self.last: deque = deque(maxlen=window)

    def state_dict(self) -> dict[str, Any]:
        # both windows: a run resumed near its end reports the same loss_end as the uninterrupted run
        return {"first": [float(x) for x in self.first], "last": [float(x) for x in self.last]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.first = list(state_dict.get("first", []))
        self.last = deque(state_dict.get("last", []), maxlen=self.window)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = trainer.callback_metrics.get("train/loss")  # what the module logged this step
        if loss is None:
            return
        if len(self.first) < self.window:
            self.first.append(loss)
        self.last.append(loss)
        self.observe(trainer.callback_metrics, loss)

    def observe(self, metrics: dict[str, Any], loss: Any) -> None:
        """Per-step hook (no host sync: keep tensors)."""

    def loss_windows(self) -> dict[str, Optional[float]]:
        return {"loss_start": _mean(self.first), "loss_end": _mean(self.last)}

    def summary(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        raise NotImplementedError

    def on_train_end(self, trainer, pl_module):
        log_dir = trainer.log_dir or trainer.default_root_dir  # a broadcast: every rank must ask
        if trainer.global_rank != 0:
            return
        summary = self.summary(trainer, pl_module)
        path = write_summary(log_dir, objective=self.objective, variant=pl_module.hparams.variant,
                             data=getattr(trainer.datamodule, "data", None), metrics=summary,
                             backbone_config=dict(pl_module.backbone.config), config=dict(pl_module.hparams),
                             checkpoint=getattr(trainer.checkpoint_callback, "last_model_path", None))
        self.report(summary)
        rank_zero_info(f"summary written to {Path(path)}")

    def report(self, summary: dict[str, Any]) -> None:
        """The summary's line in the log (rank 0)."""


class RunSummary(LossSummary):
    """DINO: loss at the start vs the end, the collapse verdict (per-image teacher entropy near ln K, or batch-mean
    entropy near 0) and the k-NN numbers, from ``collapse/*``, ``knn/*`` (``KNNCheck`` runs before this callback)
    and other callbacks' ``summary_entries``."""

    objective = "dino"

    def __init__(self, window: int = 20, uniform_frac: float = 0.98, one_hot_frac: float = 0.05):
        super().__init__(window)
        self.uniform_frac, self.one_hot_frac = uniform_frac, one_hot_frac
        self.last_stats: dict[str, Any] = {}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "last_stats": {k: float(v) for k, v in self.last_stats.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.last_stats = dict(state_dict.get("last_stats", {}))

    def observe(self, metrics: dict[str, Any], loss: Any) -> None:
        self.last_stats.update((k, v) for k, v in metrics.items() if k.startswith("collapse/"))
        self.last_stats["train/loss"] = loss

    def collapse_verdict(self) -> tuple[bool, str]:
        ent = _as_float(self.last_stats.get("collapse/teacher_entropy_frac"))
        bent = _as_float(self.last_stats.get("collapse/batch_mean_entropy_frac"))
        if ent is None or bent is None:
            return True, "no statistics"
        if ent > self.uniform_frac:
            return False, f"uniform collapse: teacher entropy {ent:.3f} x ln K"
        if bent < self.one_hot_frac:
            return False, f"one-prototype collapse: batch-mean entropy {bent:.3f} x ln K"
        return True, f"healthy (teacher entropy {ent:.3f} x ln K, batch-mean entropy {bent:.3f} x ln K)"

    def summary(self, trainer, pl_module) -> dict[str, Any]:
        """The summary.json dict (plain python values)."""
        healthy, why = self.collapse_verdict()
        knn = {k: _as_float(trainer.callback_metrics.get(f"knn/{k}")) for k in ("top1_random_init", "top1", "gain")}
        return {"variant": pl_module.hparams.variant, "arch": pl_module.hparams.arch, "steps": trainer.global_step,
                "epochs": trainer.current_epoch, **self.loss_windows(),
                "collapse_healthy": healthy, "collapse": why,
                **{k: _as_float(v) for k, v in self.last_stats.items()},
                **({f"knn_{k}": v for k, v in knn.items()} if knn["top1"] is not None else {}),
                **getattr(trainer.datamodule, "data_report", dict)(),  # DATA=folder: index, unreadable files
                **({"triton_canary": canary.outcomes()} if canary.outcomes() else {}),  # backbones/canary.py
                **{k: v for cb in trainer.callbacks if callable(getattr(cb, "summary_entries", None))
                   for k, v in cb.summary_entries().items()}}  # DenseProbeCheck: its series

    def report(self, summary: dict[str, Any]) -> None:
        if not summary["collapse_healthy"]:
            rank_zero_warn(f"collapse watch: {summary['collapse']}")
        fmt = {k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in summary.items()
               if not k.startswith("collapse/") and not isinstance(v, list)}  # series: in the file only
        rank_zero_info("pretraining summary: " + ", ".join(f"{k}={v}" for k, v in fmt.items()))


class SupervisedSummary(LossSummary):
    """Label-supervised: final val top-1/top-5, the same at random init, loss at the start vs the end and the
    wall time (the val metrics were already synced over the ranks by the module)."""

    objective = SUPERVISED

    def __init__(self, window: int = 20):
        super().__init__(window)
        self._t0: Optional[float] = None

    def on_fit_start(self, trainer, pl_module):
        self._t0 = time.perf_counter()

    def summary(self, trainer, pl_module) -> dict[str, Any]:
        init, final = pl_module.random_init, pl_module.last_val
        return {"objective": SUPERVISED, "variant": pl_module.hparams.variant, "arch": pl_module.hparams.arch,
                "data": getattr(trainer.datamodule, "data", None),
                "steps": trainer.global_step, "epochs": trainer.current_epoch, **self.loss_windows(),
                "val_top1": final.get("val_top1"), "val_top5": final.get("val_top5"),
                "val_top1_random_init": init.get("val_top1"), "val_top5_random_init": init.get("val_top5"),
                "val_top1_gain": None if not init or not final else final["val_top1"] - init["val_top1"],
                "fit_wall_s": None if self._t0 is None else round(time.perf_counter() - self._t0, 1)}

    def report(self, summary: dict[str, Any]) -> None:
        rank_zero_info("supervised summary: " + ", ".join(
            f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in summary.items()))
