"""Atomic, validated checkpoint files for Lightning (temporary file + fsync + rename via tokenmix.io).

A crash or SIGKILL during a save leaves the previous file untouched; loading refuses truncated files and
checkpoints that are not tokenmix pretraining checkpoints, with a message saying what to do.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Optional

from lightning.pytorch.plugins.io import TorchCheckpointIO

from tokenmix.io import CheckpointError, atomic_torch_save, safe_torch_load


def validate_pretrain_checkpoint(ckpt: Any, path: str | os.PathLike) -> dict:
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise CheckpointError(f"{path}: not a Lightning checkpoint (no 'state_dict'); RESUME expects a .ckpt "
                              "written by `make pretrain` (e.g. runs/<variant>/pretrain/.../checkpoints/last.ckpt)")
    if not isinstance(ckpt.get("tokenmix"), dict):
        raise CheckpointError(f"{path}: a foreign Lightning checkpoint (no 'tokenmix' entry); RESUME only continues "
                              "tokenmix pretraining runs. To start from official DINO weights use "
                              "backbones.load_checkpoint on the backbone instead.")
    keys = ckpt["state_dict"].keys()
    for prefix in ("student.backbone.", "student.head.", "teacher.backbone.", "teacher.head."):
        if not any(k.startswith(prefix) for k in keys):
            raise CheckpointError(f"{path}: no '{prefix}*' tensors in state_dict; the file is not a complete "
                                  "DINO pretraining checkpoint")
    return ckpt


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
