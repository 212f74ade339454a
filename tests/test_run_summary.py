"""RunSummary reads only logged metrics (no module attributes, no other callbacks), keeps the losses on the device
during training, and writes the same summary as the losses recorded independently from the step outputs."""
from __future__ import annotations

import json

import lightning.pytorch as pl
import pytest
import torch

from lightning_modules.callbacks.summary import RunSummary
from lightning_modules.dino_module import DINOPretrainModule
from test_dino_fast_step import FixedData, make_batches

pytestmark = pytest.mark.timeout(300)


class NoPeeking(DINOPretrainModule):
    @property
    def last_stats(self):
        raise AssertionError("RunSummary must not read the module's attributes")


class Recorder(pl.Callback):
    """Independent record: the loss each training_step returned."""

    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, m, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))


class FakeKNN(pl.Callback):
    """Publishes k-NN numbers the way KNNCheck does (callback_metrics), at the end of training."""

    def on_train_end(self, trainer, m):
        trainer.callback_metrics.update({"knn/top1": torch.tensor(40.0), "knn/top1_random_init": torch.tensor(10.0),
                                         "knn/gain": torch.tensor(30.0)})


@pytest.mark.slow
def test_summary_from_logged_metrics(tmp_path):
    torch.manual_seed(0)
    m = NoPeeking(arch="vit_test_patch8", variant="softmax", out_dim=64, head_hidden_dim=32, head_bottleneck_dim=16,
                  norm_last_layer=False, epochs=2, n_local_crops=2, warmup_epochs=1, stats_every=2,
                  warmup_teacher_temp_epochs=1, backbone={"drop_path_rate": 0.1})
    rec, summ = Recorder(), RunSummary(window=2)
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                         callbacks=[rec, FakeKNN(), summ], num_sanity_val_steps=0)

    seen = []

    class Peek(pl.Callback):  # after RunSummary: what it holds during training
        def on_train_batch_end(self, trainer, m, outputs, batch, batch_idx):
            seen.append(all(isinstance(x, torch.Tensor) for x in summ.last))
    trainer.callbacks.append(Peek())
    trainer.fit(m, datamodule=FixedData(make_batches(3)))
    assert all(seen) and len(seen) == 6
    s = json.loads((tmp_path / "summary.json").read_text())["metrics"]  # the results schema: numbers under metrics
    assert s["steps"] == 6
    assert s["loss_start"] == pytest.approx(sum(rec.losses[:2]) / 2, rel=1e-7)
    assert s["loss_end"] == pytest.approx(sum(rec.losses[-2:]) / 2, rel=1e-7)
    assert s["train/loss"] == pytest.approx(rec.losses[-1], rel=1e-7)
    assert 0 < s["collapse/teacher_entropy_frac"] <= 1 and s["collapse_healthy"] in (True, False)
    assert (s["knn_top1"], s["knn_top1_random_init"], s["knn_gain"]) == (40.0, 10.0, 30.0)
    # checkpointed state: plain floats equal to the tensors' values (resume keeps loss_start bitwise)
    state = summ.state_dict()
    assert state["first"] == rec.losses[:2] and all(type(x) is float for x in state["first"])
    fresh = RunSummary(window=2)
    fresh.load_state_dict(state)
    assert [float(x) for x in fresh.first] == [float(x) for x in summ.first]


def test_both_summaries_share_the_loss_windows(tmp_path):
    """RunSummary and SupervisedSummary keep the windows on one base: the first ``window`` logged losses and the
    last ``window`` (steps that logged none are skipped), means worked by hand; both windows survive a resume."""
    from types import SimpleNamespace

    from lightning_modules.callbacks.summary import LossSummary, SupervisedSummary
    losses = [5.0, 4.0, None, 3.0, 2.0, 1.0]  # None: a step that logged no loss
    for cls in (RunSummary, SupervisedSummary):
        cb = cls(window=2)
        assert isinstance(cb, LossSummary)
        for loss in losses:
            metrics = {} if loss is None else {"train/loss": torch.tensor(loss)}
            cb.on_train_batch_end(SimpleNamespace(callback_metrics=metrics), None, None, None, 0)
        assert cb.loss_windows() == {"loss_start": (5.0 + 4.0) / 2, "loss_end": (2.0 + 1.0) / 2}, cls
        fresh = cls(window=2)
        fresh.load_state_dict(cb.state_dict())
        assert fresh.loss_windows() == {"loss_start": 4.5, "loss_end": 1.5}  # a resume near the end: same loss_end
