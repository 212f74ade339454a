"""Atomic, validated checkpoint files for Lightning (temporary file + fsync + rename via tokenmix.io).

A crash or SIGKILL during a save leaves the previous file untouched; loading refuses truncated files and
checkpoints that are not tokenmix pretraining checkpoints, with a message saying what to do. What a complete
checkpoint holds is ``backbones.checkpoint``'s knowledge (``validate_lightning``).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Optional

from lightning.pytorch.plugins.io import TorchCheckpointIO

from backbones.checkpoint import DINO, validate_lightning
from tokenmix.io import atomic_torch_save, safe_torch_load


def validate_pretrain_checkpoint(ckpt: Any, path: str | os.PathLike) -> dict:
    """A complete DINO pretraining checkpoint (``CheckpointError`` saying what it is instead)."""
    return validate_lightning(ckpt, str(path), kind=DINO)


class AtomicCheckpointIO(TorchCheckpointIO):
    """TorchCheckpointIO that writes through ``atomic_torch_save`` and reads with ``weights_only=True``."""

    def __init__(self, validate: Optional[Callable[[Any, str], Any]] = validate_pretrain_checkpoint):
        super().__init__()
        self.validate = validate

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Optional[Any] = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options, got {storage_options!r}")
        atomic_torch_save(checkpoint, path)

    def load_checkpoint(self, path, map_location: Optional[Any] = None, weights_only: Optional[bool] = None) -> dict:
        ckpt = safe_torch_load(Path(path))
        return self.validate(ckpt, str(path)) if self.validate else ckpt
