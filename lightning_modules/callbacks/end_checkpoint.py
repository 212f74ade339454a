"""``EndCheckpoint``: the state at the end of fit is in ``last.ckpt``, whatever the checkpoint period.

``ModelCheckpoint(every_n_train_steps=k, save_last=True)`` writes last.ckpt only at multiples of k, so a
``RESUME=1`` after the end would train the last steps again. Every rank calls this hook (the save is a collective).
"""
from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint


class EndCheckpoint(pl.Callback):
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for cb in trainer.checkpoint_callbacks:
            if isinstance(cb, ModelCheckpoint) and cb.save_last and cb._last_global_step_saved != trainer.global_step:
                cb._save_last_checkpoint(trainer, cb._monitor_candidates(trainer))  # Lightning 2.x's own path
