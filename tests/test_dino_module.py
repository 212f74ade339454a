"""The DINO LightningModule's wiring: separate gradient-free teacher updated by the official EMA, per-iteration
lr / weight decay from the schedules, last layer frozen in the first epoch, resumable sampler."""
from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch

from datamodules.pretraining import ResumableBatchSampler
from lightning_modules.dino_module import DINOPretrainModule


def tiny_module(**kw):
    args = dict(arch="vit_test_patch8", variant="softmax", out_dim=32, head_hidden_dim=32, head_bottleneck_dim=16,
                norm_last_layer=False, epochs=2, n_local_crops=1, warmup_epochs=1, lr=0.01,
                momentum_teacher=0.9, momentum_teacher_end=1.0, backbone={"drop_path_rate": 0.1})
    args.update(kw)
    return DINOPretrainModule(**args)


def test_teacher_is_a_separate_frozen_copy():
    m = tiny_module()
    assert m.teacher is not m.student and m.teacher.backbone is not m.student.backbone
    s_ptrs = {p.data_ptr() for p in m.student.parameters()}
    assert not s_ptrs & {p.data_ptr() for p in m.teacher.parameters()}
    assert all(not p.requires_grad for p in m.teacher.parameters())
    for (ns, ps), (nt, pt) in zip(m.student.state_dict().items(), m.teacher.state_dict().items()):
        assert ns == nt and torch.equal(ps, pt)  # same starting weights
    m.train()
    assert m.student.training and not m.teacher.backbone.training  # teacher backbone keeps drop-path off


class Probe(pl.Callback):
    def __init__(self):
        self.checked = 0

    def on_train_batch_start(self, trainer, m, batch, batch_idx):
        self.student = [p.detach().clone() for p in m.student.parameters()]
        self.teacher = [p.detach().clone() for p in m.teacher.parameters()]
        self.last = m.student.head.last_layer.weight_v.detach().clone()

    def on_train_batch_end(self, trainer, m, outputs, batch, batch_idx):
        it = trainer.global_step - 1
        mom = float(m.momentum_schedule[it])
        for t_old, s_new, t_new in zip(self.teacher, m.student.parameters(), m.teacher.parameters()):
            assert t_new.grad is None
            assert torch.allclose(t_new, mom * t_old + (1 - mom) * s_new.detach(), atol=1e-7)
        opt = trainer.optimizers[0]
        assert opt.param_groups[0]["lr"] == pytest.approx(m.lr_schedule[it])
        assert opt.param_groups[0]["weight_decay"] == pytest.approx(m.wd_schedule[it])
        assert opt.param_groups[1]["weight_decay"] == 0.0
        moved = [not torch.equal(a, b) for a, b in zip(self.student, m.student.parameters())]
        assert any(moved) == (m.lr_schedule[it] > 0)  # the warm-up starts at lr 0: nothing moves at step 0
        frozen = torch.equal(self.last, m.student.head.last_layer.weight_v)
        assert frozen == (trainer.current_epoch < m.hparams.freeze_last_layer)
        self.checked += 1


@pytest.mark.slow
def test_ema_schedules_and_frozen_last_layer_in_a_real_fit(tmp_path):
    from datamodules.pretraining import DINOPretrainDataModule
    dm = DINOPretrainDataModule(batch_size=4, num_workers=0, n_local_crops=1, multicrop_preset="demo",
                                multicrop={"global_size": 32, "local_size": 16}, batches_per_epoch=2,
                                eval_resize_ratio=1.0)
    m = tiny_module()
    probe = Probe()
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
                         callbacks=[probe], default_root_dir=tmp_path)
    trainer.fit(m, datamodule=dm)
    assert probe.checked == 4
    # lr: linear warm-up over epoch 0 (total batch 4 -> base 0.01 * 4 / 256), then cosine
    base = 0.01 * 4 / 256
    assert m.lr_schedule[0] == 0.0 and m.lr_schedule[1] == pytest.approx(base)


def test_sampler_order_depends_on_seed_and_epoch_and_resumes_mid_epoch():
    pos = {"v": 0}
    s = ResumableBatchSampler(20, 3, seed=5, position=lambda: pos["v"])
    assert len(s) == 6
    epoch0 = list(s)
    assert all(e == 0 for b in epoch0 for e, _ in b) and len({i for b in epoch0 for _, i in b}) == 18
    pos["v"] = 6
    epoch1 = list(s)
    assert epoch1 != epoch0 and all(e == 1 for b in epoch1 for e, _ in b)
    pos["v"] = 6 + 4  # 4 batches of epoch 1 already trained
    assert list(s) == epoch1[4:]
    # two ranks split one epoch without overlap
    r0 = ResumableBatchSampler(20, 3, seed=5, num_replicas=2, rank=0)
    r1 = ResumableBatchSampler(20, 3, seed=5, num_replicas=2, rank=1)
    i0 = {i for b in r0 for _, i in b}
    i1 = {i for b in r1 for _, i in b}
    assert len(r0) == 3 and not i0 & i1 and len(i0 | i1) == 18
