"""Checkpoint files of a training run: the Trainer plugin that writes and reads them (``AtomicCheckpointIO``:
temporary file + fsync + rename via tokenmix.io), and the kind a checkpoint file records (``checkpoint_kind``, which
``RESUME=1`` reads to pick the run it continues).

A crash or SIGKILL during a save leaves the previous file untouched; loading refuses truncated files and
checkpoints of another kind, with a message saying what to do. What a complete checkpoint of each kind holds is
``backbones.checkpoint``'s knowledge (``validate_lightning``: RESUME and this plugin both validate with it).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from backbones.checkpoint import DINO, ENTRY, validate_lightning
from tokenmix.io import atomic_torch_save, safe_torch_load


def checkpoint_kind(path: Path) -> Optional[str]:
    """The kind a tokenmix checkpoint file records (``tokenmix.kind``; DINO when absent, as ``validate_lightning``
    reads it), None for a file that cannot be read as one. Memory-mapped: the tensors are not read."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 (unreadable: validate_lightning names the problem when it is used)
        return None
    entry = ckpt.get(ENTRY) if isinstance(ckpt, dict) else None
    return entry.get("kind", DINO) if isinstance(entry, dict) else None


class AtomicCheckpointIO(TorchCheckpointIO):
    """TorchCheckpointIO that writes through ``atomic_torch_save`` and reads with ``weights_only=True``, accepting
    only complete checkpoints of ``kind`` (None: any file torch can read safely)."""

    def __init__(self, kind: Optional[str] = DINO):
        super().__init__()
        self.kind = kind

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Optional[Any] = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options, got {storage_options!r}")
        atomic_torch_save(checkpoint, path)

    def load_checkpoint(self, path, map_location: Optional[Any] = None, weights_only: Optional[bool] = None) -> dict:
        ckpt = safe_torch_load(Path(path))
        return validate_lightning(ckpt, str(path), kind=self.kind) if self.kind else ckpt
