"""No host sync per training step from logging and the progress bar.

Lightning converts metrics logged with ``prog_bar=True`` to Python numbers whenever any of its metric dicts is read
(every batch), and ``self.log`` of a Python number copies it to the device: on a GPU each is a sync that makes the
host wait for the step. This test trains 8 DINO steps on the CPU with the progress bar on and
``log_every_n_steps=4`` and records, per step, every read-back (``Tensor.item``, ``tolist``, ``__float__``,
``__int__``, ``__bool__``, ``numpy``, ``cpu``) made from Lightning or from the progress bar, and every Python number
that ``self.log`` turns into a device tensor. They must happen on logging steps only: at most one step per logging
interval. (Reads of host tensors by design, the data pipeline's sampler and crop plan, and the CPU-only branches
of clipping and the non-finite watch, are not counted: on a GPU those tensors are on the host or those branches
do not run.)
"""
from __future__ import annotations

import collections
import traceback

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.core.module import LightningModule

READS = ("item", "tolist", "__float__", "__int__", "__bool__", "numpy", "cpu")
_trainer = {}


class StepSpy(pl.Callback):
    def on_train_start(self, trainer, pl_module):
        _trainer["t"] = trainer

    def on_train_end(self, trainer, pl_module):
        _trainer.pop("t", None)


def _reader(stack):
    """The frame that asked for the read (the innermost outside torch) when it is Lightning or the bar, else None."""
    where = next(f for f in reversed(stack) if "site-packages/torch/" not in f.filename)
    return where if "/lightning/" in where.filename or where.filename.endswith("callbacks/progress.py") else None


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_logging_and_the_progress_bar_read_back_once_per_logging_interval(monkeypatch, tmp_path):
    from lightning_modules.callbacks.progress import LogStepProgressBar
    from lightning_modules.pretrain import main
    per_step: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)

    def spy(name, orig):
        def wrapper(self, *a, **kw):
            t = _trainer.get("t")
            if t is not None and t.training:
                where = _reader(traceback.extract_stack()[:-1])
                if where is not None:
                    per_step[t.global_step][f"{name} {where.filename.split('/')[-1]}:{where.lineno}"] += 1
            return orig(self, *a, **kw)
        return wrapper
    for name in READS:
        monkeypatch.setattr(torch.Tensor, name, spy(name, getattr(torch.Tensor, name)))
    to_tensor = LightningModule._LightningModule__to_tensor
    monkeypatch.setattr(LightningModule, "_LightningModule__to_tensor", spy("log(number) -> device", to_tensor))
    shown = []
    real_get = LogStepProgressBar.get_metrics
    monkeypatch.setattr(LogStepProgressBar, "get_metrics",
                        lambda self, tr, m: shown.append(real_get(self, tr, m)) or shown[-1])
    code = main(["--variant", "entmax", "--preset", "tiny", "--runs-dir", str(tmp_path), "--trainer.max_steps=8",
                 "--trainer.max_epochs=1", "--trainer.log_every_n_steps=4", "--data.batches_per_epoch=8",
                 f"--trainer.callbacks=[{{class_path: {__name__}.StepSpy}}]", "--model.warmup_epochs=0",
                 "--model.warmup_teacher_temp_epochs=0"])
    assert code == 0
    steps = sorted(per_step)
    assert steps and all(s % 4 == 0 for s in steps), {s: dict(per_step[s]) for s in steps}
    assert len(steps) <= 8 // 4, steps  # one step per interval
    assert any("loss" in m for m in shown) and isinstance(shown[-1]["loss"], float)  # the bar shows the loss


def test_batched_normalisation_constants_are_made_once_per_device(monkeypatch):
    """The batched multi-crop normalises with mean/std tensors made on the device once, not copied from pageable
    host memory every batch (datamodules/transforms/batched.py)."""
    from datamodules.transforms import batched
    from datamodules.transforms.multicrop import make_config
    t = batched.BatchedMultiCrop(make_config())
    copies = []
    real = batched._to
    monkeypatch.setattr(batched, "_to", lambda a, dev: copies.append(a.shape) or real(a, dev))
    first = t._mean_std(torch.device("cpu"))
    assert all(x is y for x, y in zip(first, t._mean_std(torch.device("cpu")))) and copies == [(2, 3)]
    torch.testing.assert_close(first[0].flatten(), torch.tensor(t.cfg.mean, dtype=torch.float32))
    torch.testing.assert_close(first[1].flatten(), torch.tensor(t.cfg.std, dtype=torch.float32))
    assert first[0].shape == first[1].shape == (3, 1, 1)
