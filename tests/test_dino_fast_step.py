"""The optimised DINO step (fused AdamW, multi-tensor clip and EMA, no last-layer gradient while frozen,
statistics every N steps, [CLS]-only last block, drop-path on kept samples only, oneDNN linears) against
facebookresearch/dino's own step: ``official/main_dino.py``'s ``train_step`` on ``official/vit.py``'s
``vit_small`` (transcriptions that import nothing of the project), fp32, 5 steps across the frozen -> trainable
last-layer boundary, the project on both GEMM backends."""
from __future__ import annotations

from functools import partial

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_modules.dino_module import DINOPretrainModule
from lightning_modules.fast_ops import clip_grad_norms_, ema_
from official import main_dino as official
from official import vit as vits

BATCH, NITER, EPOCHS, STEPS = 4, 3, 2, 5
# fp32, independent code (the official attention and loss order their sums otherwise): measured up to 1.4e-6
# (losses) and 1.2e-7 (parameters) after 5 steps
LOSS_TOL, PARAM_TOL = 5e-6, 1e-6


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


# ----------------------------------------------------------------- reference: the official step (official/)
def official_models(m: DINOPretrainModule):
    """``train_dino``'s student / teacher / DINOLoss for ``m``'s shapes, holding ``m``'s initial weights (strict
    loads: the official keys). The ViT is the official ``VisionTransformer`` built as ``vit_small`` builds it
    (mlp_ratio 4, qkv_bias, LayerNorm eps 1e-6) at vit_test_patch8's size (32 px, patch 8, width 32, depth 2,
    2 heads): ViT-S itself is checked in fp32 in tests/test_block_shortcuts.py, and 5 steps of it on 2 shared
    cores would cost minutes."""
    hp = m.hparams
    student, teacher = official.build_student_teacher(
        "custom", patch_size=8, img_size=[32], embed_dim=32, depth=2, num_heads=2, mlp_ratio=4, qkv_bias=True,
        norm_layer=partial(torch.nn.LayerNorm, eps=1e-6), out_dim=hp.out_dim, drop_path_rate=0.1,
        norm_last_layer=hp.norm_last_layer, head_kwargs=dict(hidden_dim=hp.head_hidden_dim,
                                                             bottleneck_dim=hp.head_bottleneck_dim))
    student.load_state_dict(m.student.state_dict())
    teacher.load_state_dict(m.teacher.state_dict())
    loss = official.DINOLoss(hp.out_dim, 2 + hp.n_local_crops, hp.warmup_teacher_temp, hp.teacher_temp,
                             hp.warmup_teacher_temp_epochs, hp.epochs)
    return student, teacher, loss


def reference_run(student, teacher, dino_loss, batches, hp):
    """main_dino.py's schedules and optimizer, then ``train_step`` per iteration (seeded as ``Seeder``)."""
    lr_schedule = vits.cosine_scheduler(hp.lr * BATCH / 256., hp.min_lr, hp.epochs, NITER,
                                        warmup_epochs=hp.warmup_epochs)
    wd_schedule = vits.cosine_scheduler(hp.weight_decay, hp.weight_decay_end, hp.epochs, NITER)
    momentum_schedule = vits.cosine_scheduler(hp.momentum_teacher, 1, hp.epochs, NITER)
    optimizer = torch.optim.AdamW(vits.get_params_groups(student), foreach=False)  # the for-loop AdamW
    student.train()
    losses = []
    for it in range(STEPS):
        torch.manual_seed(1000 + it)
        losses.append(official.train_step(student, teacher, dino_loss, batches[it % NITER][0], optimizer,
                                          lr_schedule[it], wd_schedule[it], momentum_schedule[it], it // NITER,
                                          clip_grad=hp.clip_grad, freeze_last_layer=hp.freeze_last_layer))
    return losses


def _split_key_bias(name, a, b):
    """(a, b) without the key third of a ``qkv.bias``, and that third of each. Its exact gradient is 0 (a
    constant added to all keys shifts every logit of a row alike, and softmax ignores that), so AdamW moves it
    by lr * g / (sqrt(v) + eps) of a rounding-noise g: two codes that round differently (fused vs for-loop
    AdamW, oneDNN vs MKL GEMMs, timm's vs the official attention) move it apart by up to ~1.4e-5 after 5 steps at
    this lr (measured against the official step), whatever the model computes. It changes no output; it is held
    to 5e-5, every other value to ``PARAM_TOL``."""
    if not name.endswith("attn.qkv.bias"):
        return a, b, a[:0], b[:0]
    d = a.shape[0] // 3
    return torch.cat([a[:d], a[2 * d:]]), torch.cat([b[:d], b[2 * d:]]), a[d:2 * d], b[d:2 * d]


# ----------------------------------------------------------------- tests
@pytest.mark.timeout(600)
@pytest.mark.parametrize("backend", ["aten", "onednn"])  # the same two on every host (backbones/linear.py)
@pytest.mark.slow
def test_five_optimised_steps_match_the_official_main_dino_step(tmp_path, backend, monkeypatch):
    torch.manual_seed(0)
    m = tiny_module(backbone={"drop_path_rate": 0.1, "linear_backend": backend})
    ref_student, ref_teacher, ref_loss = official_models(m)
    monkeypatch.setattr(vits, "drop_path", vits.timm_drawn_drop_path)
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
    np.testing.assert_allclose(seeder.losses, ref_losses, rtol=0, atol=LOSS_TOL)
    ref_params = {"student": dict(ref_student.named_parameters()), "teacher": dict(ref_teacher.named_parameters())}
    for who, ours in (("student", m.student), ("teacher", m.teacher)):
        for n, a in ours.named_parameters():
            a, b, kb, kb_ref = _split_key_bias(n, a, ref_params[who][n])
            torch.testing.assert_close(a, b, rtol=PARAM_TOL, atol=PARAM_TOL, msg=lambda e: f"{who} {n}: {e}")
            torch.testing.assert_close(kb, kb_ref, rtol=0, atol=5e-5, msg=lambda e: f"{who} {n} (key part): {e}")
    torch.testing.assert_close(m.dino_loss.center, ref_loss.center, rtol=PARAM_TOL, atol=PARAM_TOL)
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
    """Runs in every process of the 2-process fit (a failed assert fails the fit). Checks the frozen-layer
    handling, and the first update of the last layer against AdamW's first step written out: with the
    bias-corrected moments m = g and v = g^2 it is w <- w (1 - lr wd) - lr g / (|g| + eps), on the
    all-reduced, clipped gradient the update used (still in ``.grad`` after the step)."""

    def __init__(self):
        self.checked = 0

    def on_train_start(self, trainer, m):
        w = m.student.head.last_layer.weight_v
        opt = trainer.optimizers[0]
        group = next(g for g in opt.param_groups if any(p is w for p in g["params"]))
        before = {}

        def pre(optimizer, args, kwargs):  # before the closure: the weights the update starts from
            before["w"] = w.detach().double().clone()

        def post(optimizer, args, kwargs):
            if w.grad is None or int(optimizer.state[w]["step"]) != 1:  # frozen, or not the first update
                return
            lr, wd, eps, g = group["lr"], group["weight_decay"], group["eps"], w.grad.double()
            want = before["w"] * (1 - lr * wd) - lr * g / (g.abs() + eps)
            assert (g != 0).float().mean() > 0.5 and lr > 0  # a real update: most entries move by ~lr
            torch.testing.assert_close(w.detach().double(), want, rtol=0, atol=1e-6 * lr + 1e-7)
            self.checked += 1
        opt.register_step_pre_hook(pre)
        opt.register_step_post_hook(post)

    def on_before_optimizer_step(self, trainer, m, optimizer):
        # under DDP the last layer keeps requires_grad (the reducer expects its gradient) ...
        assert all(p.requires_grad for p in m._last_layer)
        assert m.student.head.last_layer.weight_v.grad is not None

    def on_train_batch_end(self, trainer, m, outputs, batch, batch_idx):
        # ... and the official cancel drops it after clipping in the frozen epoch
        assert (m.student.head.last_layer.weight_v.grad is None) == (trainer.current_epoch < 1)

    def on_train_end(self, trainer, m):
        assert self.checked == 1, self.checked  # exactly one first update, in the first unfrozen step


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_two_process_ddp_keeps_the_official_frozen_layer_handling(tmp_path):
    torch.manual_seed(0)
    m = tiny_module()
    start = m.student.head.last_layer.weight_v.detach().clone()
    trainer = pl.Trainer(max_epochs=EPOCHS, max_steps=NITER + 1, accelerator="cpu", devices=2,
                         strategy="ddp_spawn", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[_LastLayerGrads()], default_root_dir=tmp_path)
    trainer.fit(m, datamodule=FixedData(make_batches(NITER)))
    # the callback's checks ran in both processes (a failure there fails the fit), the first update of the last
    # layer equal to AdamW's first step written out; rank 0's weights come back: moved from the start
    assert not torch.equal(m.student.head.last_layer.weight_v, start)
