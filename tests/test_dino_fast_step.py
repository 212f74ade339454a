"""The optimised DINO step (fused AdamW, multi-tensor clip and EMA, no last-layer gradient while frozen,
statistics every N steps) against a plain step written here the way facebookresearch/dino main_dino.py does it:
per-parameter loops, for-loop AdamW. 5 steps in fp32, across the frozen -> trainable last-layer boundary."""
from __future__ import annotations

import copy
import math

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from backbones.linear import FastLinear
from lightning_modules.dino_module import DINOPretrainModule
from lightning_modules.fast_ops import clip_grad_norms_, ema_
from helpers.official_dino_utils import (cancel_gradients_last_layer, clip_gradients, cosine_scheduler,
                                         get_params_groups)

BATCH, NITER, EPOCHS, STEPS = 4, 3, 2, 5


def tiny_module(**kw):
    args = dict(arch="vit_test_patch8", variant="softmax", out_dim=64, head_hidden_dim=32, head_bottleneck_dim=16,
                norm_last_layer=False, epochs=EPOCHS, n_local_crops=2, warmup_epochs=1, lr=0.05,
                momentum_teacher=0.9, momentum_teacher_end=1.0, clip_grad=0.3, freeze_last_layer=1,
                warmup_teacher_temp_epochs=1, teacher_temp=0.07, backbone={"drop_path_rate": 0.1}, stats_every=2)
    args.update(kw)
    return DINOPretrainModule(**args)


def make_batches(n):
    g = torch.Generator().manual_seed(0)
    return [([torch.randn(BATCH, 3, 32, 32, generator=g) for _ in range(2)] +
             [torch.randn(BATCH, 3, 16, 16, generator=g) for _ in range(2)], torch.zeros(BATCH, dtype=torch.long))
            for _ in range(n)]


class FixedData(pl.LightningDataModule):
    def __init__(self, batches):
        super().__init__()
        self.batches, self.batch_size = batches, BATCH

    def train_dataloader(self):
        return DataLoader(self.batches, batch_size=None, shuffle=False)


class Seeder(pl.Callback):
    """Same drop-path draws in both paths: the global generator is re-seeded before every step."""

    def __init__(self):
        self.losses, self.frozen_grad = [], []

    def on_train_batch_start(self, trainer, m, batch, batch_idx):
        torch.manual_seed(1000 + trainer.global_step)

    def on_before_optimizer_step(self, trainer, m, optimizer):
        self.frozen_grad.append(m.student.head.last_layer.weight_v.grad is None)

    def on_train_batch_end(self, trainer, m, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))


# ----------------------------------------------------------------- reference, transcribed from main_dino.py/utils.py
def reference_run(student, teacher, dino_loss, batches, hp):
    lr_schedule = cosine_scheduler(hp.lr * BATCH / 256., hp.min_lr, hp.epochs, NITER, warmup_epochs=hp.warmup_epochs)
    wd_schedule = cosine_scheduler(hp.weight_decay, hp.weight_decay_end, hp.epochs, NITER)
    momentum_schedule = cosine_scheduler(hp.momentum_teacher, 1, hp.epochs, NITER)
    optimizer = torch.optim.AdamW(get_params_groups(student), foreach=False)  # the for-loop AdamW
    student.train()
    losses = []
    for it in range(STEPS):
        epoch = it // NITER
        images = batches[it % NITER][0]
        for i, param_group in enumerate(optimizer.param_groups):
            param_group["lr"] = lr_schedule[it]
            if i == 0:
                param_group["weight_decay"] = wd_schedule[it]
        torch.manual_seed(1000 + it)
        teacher_output = teacher(images[:2])
        student_output = student(images)
        loss = dino_loss(student_output, teacher_output, epoch)
        assert math.isfinite(loss.item())
        optimizer.zero_grad()
        loss.backward()
        clip_gradients(student, hp.clip_grad)
        cancel_gradients_last_layer(epoch, student, hp.freeze_last_layer)
        optimizer.step()
        with torch.no_grad():
            m = momentum_schedule[it]
            for param_q, param_k in zip(student.parameters(), teacher.parameters()):
                param_k.data.mul_(m).add_((1 - m) * param_q.detach().data)
        losses.append(loss.item())
    return losses


def _split_key_bias(name, a, b):
    """(a, b) without the key third of a ``qkv.bias``, and that third of each. Its exact gradient is 0 (a
    constant added to all keys shifts every logit of a row alike, and softmax ignores that), so AdamW moves it
    by lr * g / (sqrt(v) + eps) of a rounding-noise g: two paths that round differently (fused vs for-loop
    AdamW, oneDNN vs MKL GEMMs) move it apart by up to ~7e-6 after 5 steps at this lr (seeds 0-3, measured), whatever the model
    computes. It changes no output; it is held to 1e-5, every other value to 1e-6."""
    if not name.endswith("attn.qkv.bias"):
        return a, b, a[:0], b[:0]
    d = a.shape[0] // 3
    return torch.cat([a[:d], a[2 * d:]]), torch.cat([b[:d], b[2 * d:]]), a[d:2 * d], b[d:2 * d]


# ----------------------------------------------------------------- tests
@pytest.mark.timeout(600)
def test_five_optimised_steps_match_the_main_dino_step(tmp_path):
    torch.manual_seed(0)
    # the module's blocks on oneDNN's GEMM (backbones/linear.py), the reference on torch's default (MKL)
    m = tiny_module(backbone={"drop_path_rate": 0.1, "linear_backend": "onednn"})
    ref_student, ref_teacher, ref_loss = (copy.deepcopy(x) for x in (m.student, m.teacher, m.dino_loss))
    for layer in [*ref_student.modules(), *ref_teacher.modules()]:
        if isinstance(layer, FastLinear):
            layer.backend = "aten"
    start = {"head.last_layer.weight_v": m.student.head.last_layer.weight_v.detach().clone(),
             "backbone.patch_embed.proj.weight": m.student.backbone.patch_embed.proj.weight.detach().clone(),
             "teacher backbone.patch_embed.proj.weight": m.teacher.backbone.patch_embed.proj.weight.detach().clone()}
    batches = make_batches(NITER)
    seeder = Seeder()
    trainer = pl.Trainer(max_epochs=EPOCHS, max_steps=STEPS, accelerator="cpu", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[seeder], default_root_dir=tmp_path)
    trainer.fit(m, datamodule=FixedData(batches))
    assert trainer.global_step == STEPS
    opt = trainer.optimizers[0]
    assert opt.defaults["fused"] is True
    # epoch 0: no last-layer gradient computed at all; epoch 1: trained again
    assert seeder.frozen_grad == [True] * NITER + [False] * (STEPS - NITER)
    assert all(p.requires_grad for p in m.student.head.last_layer.parameters())

    ref_losses = reference_run(ref_student, ref_teacher, ref_loss, batches, m.hparams)
    np.testing.assert_allclose(seeder.losses, ref_losses, rtol=0, atol=1e-6)
    for who, ours, ref in (("student", m.student, ref_student), ("teacher", m.teacher, ref_teacher)):
        for (n, a), b in zip(ours.named_parameters(), ref.parameters()):
            a, b, kb, kb_ref = _split_key_bias(n, a, b)
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=lambda e: f"{who} {n}: {e}")
            torch.testing.assert_close(kb, kb_ref, rtol=0, atol=1e-5, msg=lambda e: f"{who} {n} (key part): {e}")
    torch.testing.assert_close(m.dino_loss.center, ref_loss.center, rtol=1e-6, atol=1e-6)
    # the run really trained: the last layer moved once unfrozen, the backbone and the teacher moved
    for name, p in [("head.last_layer.weight_v", m.student.head.last_layer.weight_v),
                    ("backbone.patch_embed.proj.weight", m.student.backbone.patch_embed.proj.weight),
                    ("teacher backbone.patch_embed.proj.weight", m.teacher.backbone.patch_embed.proj.weight)]:
        assert (p - start[name]).abs().max() > 1e-4, name
    assert m.last_stats["train/loss"] == pytest.approx(seeder.losses[-1])
    assert "collapse/teacher_entropy_frac" in m.last_stats


def test_multi_tensor_clip_and_ema_match_the_per_parameter_loops():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s)) for s in [(5, 7), (3,), (11,), (2, 2, 2)]]
    scales = [10.0, 1e-3, 0.5, 3.0]  # above and below the clip threshold
    for p, s in zip(params, scales):
        p.grad = torch.randn_like(p) * s
    params.append(torch.nn.Parameter(torch.randn(4)))  # no gradient: skipped
    ref = [None if p.grad is None else p.grad.clone() for p in params]
    official_norms = []
    for g in ref:
        if g is not None:
            n = g.norm(2)
            official_norms.append(n.item())
            coef = 1.0 / (n + 1e-6)
            if coef < 1:
                g.mul_(coef)
    norms = clip_grad_norms_(params, clip=1.0)
    np.testing.assert_allclose(norms.numpy(), official_norms, rtol=1e-6)
    for p, g in zip(params, ref):
        if g is None:
            assert p.grad is None
        else:
            torch.testing.assert_close(p.grad, g, rtol=1e-6, atol=0)
    assert torch.equal(params[2].grad, ref[2])  # below the threshold: untouched, bit for bit
    teacher = [torch.randn_like(p) for p in params]
    want = [t.clone().mul_(0.99).add_((1 - 0.99) * p.detach()) for t, p in zip(teacher, params)]
    for multi_tensor in (True, False, None):  # the GPU form, the CPU form, and the one chosen here
        got = [t.clone() for t in teacher]
        ema_(got, [p.detach() for p in params], 0.99, multi_tensor=multi_tensor)
        for t, w in zip(got, want):
            assert torch.equal(t, w), multi_tensor  # the official rounding, bit for bit


def test_fp16_grad_scaler_gets_a_foreach_adamw_so_clipping_sees_unscaled_gradients():
    # Lightning does not un-scale before clipping for optimizers that un-scale in step() (fused ones)
    from types import SimpleNamespace
    m = tiny_module()
    m._trainer = SimpleNamespace(precision="16-mixed")
    opt = m.configure_optimizers()
    assert opt.defaults["foreach"] is True and not opt.defaults["fused"]
    m._trainer = SimpleNamespace(precision="32-true")
    assert m.configure_optimizers().defaults["fused"] is True


class _LastLayerGrads(pl.Callback):
    def on_before_optimizer_step(self, trainer, m, optimizer):
        # under DDP the last layer keeps requires_grad (the reducer expects its gradient) ...
        assert all(p.requires_grad for p in m._last_layer)
        assert m.student.head.last_layer.weight_v.grad is not None

    def on_train_batch_end(self, trainer, m, outputs, batch, batch_idx):
        # ... and the official cancel drops it after clipping in the frozen epoch
        assert (m.student.head.last_layer.weight_v.grad is None) == (trainer.current_epoch < 1)


@pytest.mark.timeout(900)
def test_two_process_ddp_keeps_the_official_frozen_layer_handling(tmp_path):
    torch.manual_seed(0)
    m = tiny_module()
    start = m.student.head.last_layer.weight_v.detach().clone()
    trainer = pl.Trainer(max_epochs=EPOCHS, max_steps=NITER + 1, accelerator="cpu", devices=2,
                         strategy="ddp_spawn", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[_LastLayerGrads()], default_root_dir=tmp_path)
    trainer.fit(m, datamodule=FixedData(make_batches(NITER)))
    # the callback's checks ran in both processes (a failure there fails the fit); rank 0's weights come back:
    # the last layer moved in the one unfrozen step
    assert (m.student.head.last_layer.weight_v - start).abs().max() > 1e-6
