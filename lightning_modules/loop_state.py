"""The loop counters of a checkpoint saved after an epoch's last batch, in the form Lightning resumes right.

``ModelCheckpoint(every_n_train_steps=...)`` saves in ``on_train_batch_end``. After an epoch's last batch that
checkpoint says "epoch e started, not processed; last batch trained". Lightning 2.6's FitLoop restores it as
RESTARTED_MID_EPOCH, bumps the epoch to processed in ``reset`` but stays in that stage, so ``on_advance_start``
then trains epoch e + 1 without counting it ready / started: the resumed run's checkpoints read one epoch
behind, and resuming one of those after the run ended trains an extra epoch. The same training
point saved in ``on_train_epoch_end`` reads "processed = started, completed = processed - 1" (Lightning's
RESUMED_ON_EPOCH_END stage, which then starts the next epoch normally). ``epoch_end_form`` rewrites the first
form into the second; the modules call it on every checkpoint they save and load (files written before the
fix, and those of runs resumed before it, whose counters read ready = started = processed, included).
"""
from __future__ import annotations

from typing import Any

PHASES = ("ready", "started", "processed", "completed")


def _add(progress: dict, phase: str, n: int = 1) -> None:
    for part in ("total", "current"):
        progress[part][phase] += n


def after_last_batch(fit_loop: dict) -> bool:
    """Saved in ``on_train_batch_end`` of an epoch's last batch (the batch trained, its ``completed`` not yet
    counted, the epoch not yet processed)?"""
    batches = fit_loop.get("epoch_loop.batch_progress") or {}
    if not batches.get("is_last_batch") or "total" not in batches:
        return False
    ready, started, processed, completed = (batches["total"][p] for p in PHASES)
    return ready == started == processed == completed + 1


def epoch_end_form(checkpoint: dict[str, Any]) -> bool:
    """Rewrite ``checkpoint``'s loop counters (in place) to the ``on_train_epoch_end`` form when it was saved
    after an epoch's last batch; True if it was. The training state (weights, optimizer, RNG, ``global_step``,
    ``epoch``) is untouched: only where Lightning resumes changes."""
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
