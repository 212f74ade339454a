"""Checkpoint files of a training run: the atomic Trainer plugin (``AtomicCheckpointIO``), the kind a file
records (``checkpoint_kind``), the RESUME point (``resume_point``) and ``epoch_end_form``. Loading refuses
truncated files and checkpoints of another kind (``backbones.checkpoint.validate_lightning``).

Why ``epoch_end_form``: a step checkpoint saved after an epoch's last batch reads "epoch e started, not
processed"; Lightning 2.6 resumes it by training epoch e + 1 uncounted, so later checkpoints read one epoch
behind. The modules rewrite every checkpoint they save and load into the ``on_train_epoch_end`` form.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from backbones.checkpoint import DINO, ENTRY, validate_lightning
from tokenmix import paths
from tokenmix.io import CheckpointError, atomic_torch_save, safe_torch_load

PHASES = ("ready", "started", "processed", "completed")


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


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a run continues: where it is, how far it trained, its version folder, and, when that run
    already reached this run's end, the line saying so (such a fit would train nothing but rewrite the summary)."""
    path: str
    step: int
    epochs: int
    version: Optional[str]
    finished: Optional[str] = None


def resume_point(run: Any) -> Optional[ResumePoint]:
    """The RESUME checkpoint of ``run`` (a ``launch_checks.RunSettings``), validated as one of the run's objective
    before the Trainer sees it, with its counters as Lightning resumes them."""
    path = resume_path(run.resume, run.variant, run.runs, run.kind, run.objective)
    if path is None:
        return None
    ckpt = AtomicCheckpointIO(run.kind).load_checkpoint(path)
    epoch_end_form(ckpt)
    where = Path(path).resolve()  # a checkpoint in <version>/checkpoints/: the resumed run keeps logging there
    in_version = where.parent.name == "checkpoints" and re.fullmatch(r"version_\d+", where.parent.parent.name)
    step, epochs = int(ckpt.get("global_step", 0)), epochs_trained(ckpt)
    return ResumePoint(path, step, epochs, where.parent.parent.name if in_version else None,
                       finished_line(path, step, epochs, run.max_epochs, run.max_steps))


def resume_path(resume: str, variant: str, runs: Path, kind: str = DINO, objective: str = "dino") -> Optional[str]:
    """'' -> None; '1' / 'last' / 'true' -> the newest last.ckpt of the variant whose checkpoint is of ``kind``
    (read from the file: unreadable ones are kept, for the validation to name); otherwise a path."""
    if not resume or resume.lower() in ("0", "false", "no"):
        return None
    if resume.lower() in ("1", "true", "yes", "last"):
        try:
            return str(paths.latest_checkpoint(variant, runs, accept=lambda p: checkpoint_kind(p) in (None, kind),
                                               objective=objective))
        except FileNotFoundError as e:
            raise CheckpointError(f"RESUME={resume}: {e}") from None
    if not Path(resume).is_file():
        raise CheckpointError(f"RESUME={resume}: no such checkpoint file")
    return resume


def finished_line(path: str, step: int, epochs: int, max_epochs: Optional[int], max_steps: int) -> Optional[str]:
    """The line saying a checkpoint at ``step`` after ``epochs`` epochs already reached ``max_epochs`` or
    ``max_steps`` (Lightning's limits: no max_epochs and no max_steps means 1000 epochs), or None."""
    if max_epochs is None:
        max_epochs = 1000 if max_steps == -1 else -1
    if not (0 <= max_steps <= step or max_epochs != -1 and epochs >= max_epochs):
        return None
    return (f"run already finished: step {step}, epoch {epochs} of max_epochs={max_epochs}, checkpoint "
            f"{path}; nothing to train (raise --trainer.max_epochs to extend it)")


def _add(progress: dict, phase: str, n: int = 1) -> None:
    for part in ("total", "current"):
        progress[part][phase] += n


def after_last_batch(fit_loop: dict) -> bool:
    """Saved in ``on_train_batch_end`` of an epoch's last batch (its epoch and batch not yet counted)?"""
    batches = fit_loop.get("epoch_loop.batch_progress") or {}
    if not batches.get("is_last_batch") or "total" not in batches:
        return False
    ready, started, processed, completed = (batches["total"][p] for p in PHASES)
    return ready == started == processed == completed + 1


def epoch_end_form(checkpoint: dict[str, Any]) -> bool:
    """Rewrite ``checkpoint``'s loop counters (in place) to the ``on_train_epoch_end`` form when it was saved
    after an epoch's last batch; True if it was. Only where Lightning resumes changes, not the training state."""
    fit_loop = (checkpoint.get("loops") or {}).get("fit_loop")
    if not fit_loop or not after_last_batch(fit_loop):
        return False
    epochs = fit_loop["epoch_progress"]
    ready, started, processed, completed = (epochs["total"][p] for p in PHASES)
    if ready == started == processed == completed:  # a run resumed before the fix: epoch e trained uncounted
        _add(epochs, "ready")
        _add(epochs, "started")
    elif not (ready == started == processed + 1 and completed == processed):
        return False  # not a batch-end state Lightning writes: leave it to Lightning
    _add(epochs, "processed")  # the epoch's batches are all trained; completed follows in FitLoop.reset
    _add(fit_loop["epoch_loop.batch_progress"], "completed")  # as after the batch's own hooks
    state = fit_loop.get("epoch_loop.state_dict")
    if isinstance(state, dict) and "_batches_that_stepped" in state:
        state["_batches_that_stepped"] += 1  # counted after on_train_batch_end (the logger's step)
    return True


def epochs_trained(checkpoint: dict[str, Any]) -> int:
    """Epochs whose every batch is trained, as Lightning reads it on resuming (after ``epoch_end_form``)."""
    epochs = ((checkpoint.get("loops") or {}).get("fit_loop") or {}).get("epoch_progress") or {}
    return int((epochs.get("current") or {}).get("processed", 0))
