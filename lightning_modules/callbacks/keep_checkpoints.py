"""Keep the checkpoints of chosen training points (``make study ... AT="25% 50% 100%"`` evaluates each).

``at_epoch0003.ckpt`` at the end of epoch 3 (``epochs``: 1-based) and ``at_step000100.ckpt`` after optimizer step
100 (``steps``): ``ModelCheckpoint`` keeps only a period. Saving reads no RNG (the training is bit for bit the one
without this callback); a point already on disk is not written again.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import lightning.pytorch as pl


def epoch_file(epoch: int) -> str:
    return f"at_epoch{int(epoch):04d}.ckpt"


def step_file(step: int) -> str:
    return f"at_step{int(step):06d}.ckpt"


class KeepCheckpoints(pl.Callback):
    def __init__(self, epochs: Sequence[int] = (), steps: Sequence[int] = (), dirpath: Optional[str] = None):
        self.epochs, self.steps = {int(e) for e in epochs}, {int(s) for s in steps}
        self.dirpath = dirpath

    def _folder(self, trainer: pl.Trainer) -> Path:
        if self.dirpath:
            return Path(self.dirpath)
        ckpt = trainer.checkpoint_callback
        if ckpt is not None and getattr(ckpt, "dirpath", None):
            return Path(ckpt.dirpath)
        return Path(trainer.log_dir or trainer.default_root_dir) / "checkpoints"  # a broadcast: every rank asks

    def _save(self, trainer: pl.Trainer, name: str) -> None:
        path = self._folder(trainer) / name
        # rank 0 decides for all (save_checkpoint is a collective; rank 0 writes): a resumed run keeps its file
        if not trainer.strategy.broadcast(path.is_file()):
            trainer.save_checkpoint(str(path))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step in self.steps:
            self._save(trainer, step_file(trainer.global_step))

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch + 1 in self.epochs:
            self._save(trainer, epoch_file(trainer.current_epoch + 1))
