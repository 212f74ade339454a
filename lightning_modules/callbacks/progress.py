"""The training progress bar without a host sync per step (``LogStepProgressBar``, always on in ``make pretrain``).

Lightning converts every ``prog_bar=True`` metric to a number whenever a metric dict is read: a ``.item()`` per
step that stops the host's next step overlapping the GPU's. So the modules log the loss without ``prog_bar`` and
this bar shows ``SHOWN`` read on logging steps only; outside training it reads as Lightning's does.
"""
from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import RichProgressBar


SHOWN = ("train/loss", "train/throughput_img_s")


class LogStepProgressBar(RichProgressBar):
    """``RichProgressBar`` whose metrics are read back from the device at most once per logging interval."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._shown: dict[str, float] = {}  # SHOWN as of the last logging step

    def get_metrics(self, trainer, pl_module) -> dict:
        items = super().get_metrics(trainer, pl_module)  # no read-back: nothing is logged with prog_bar in training
        if trainer.training and not trainer.sanity_checking and trainer._logger_connector.should_update_logs:
            logged = trainer.logged_metrics  # (the test LearningRateMonitor uses for its logging steps)
            self._shown = {k.split("/")[-1]: float(logged[k]) for k in SHOWN if k in logged}
        return {**items, **self._shown}
