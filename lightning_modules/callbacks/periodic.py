"""When a periodic check runs (``KNNCheck``, ``DenseProbeCheck``): the start, every N epochs, the end."""
from __future__ import annotations

import lightning.pytorch as pl


def epoch_check_due(trainer: pl.Trainer, every_n_epochs: int) -> bool:
    """At an epoch end: whether a periodic check (``every_n_epochs``, 0 = off) runs now. Never after the last
    epoch, where the check's ``on_train_end`` runs anyway."""
    last = trainer.max_epochs is not None and trainer.current_epoch + 1 >= trainer.max_epochs
    return bool(every_n_epochs) and (trainer.current_epoch + 1) % every_n_epochs == 0 and not last
