"""16-mixed, the paper preset's precision, on the CPU: DINOPretrainModule's optimiser path under Trainer.fit
(fp16 autocast, Lightning's GradScaler, the module's foreach AdamW and its per-parameter clipping after the
un-scale) against the same steps written out by hand with plain tensor ops, including a step whose gradient is
made infinite: that step must be skipped (parameters unchanged) and the scale halved.

Lightning turns ``precision="16-mixed"`` into bf16 on the CPU; the MixedPrecision plugin given directly runs
the fp16 + GradScaler path a GPU runs (torch has CPU fp16 autocast and a CPU GradScaler).
"""
from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.plugins import MixedPrecision
from torch.utils.data import DataLoader

from lightning_modules.dino_module import DINOPretrainModule

STEPS, INF_STEP, BATCH, CLIP = 5, 2, 4, 0.3
# the tiny model's head-bias gradients reach ~1e3 unscaled: from the default 65536 the first steps overflow (the
# scaler's job, but then not one chosen skip); from 8 no step overflows unless made to
INIT_SCALE = 8.0


def _module() -> DINOPretrainModule:
    torch.manual_seed(0)
    return DINOPretrainModule(arch="vit_test_patch8", variant="softmax", out_dim=64, head_hidden_dim=32,
                              head_bottleneck_dim=16, norm_last_layer=False, epochs=2, n_local_crops=2,
                              warmup_epochs=1, lr=0.05, clip_grad=CLIP, freeze_last_layer=0,
                              backbone={"drop_path_rate": 0.0})


class _Data(pl.LightningDataModule):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.batch_size = BATCH
        self.batches = [([torch.randn(BATCH, 3, 32, 32, generator=g) for _ in range(2)] +
                         [torch.randn(BATCH, 3, 16, 16, generator=g) for _ in range(2)],
                         torch.zeros(BATCH, dtype=torch.long)) for _ in range(STEPS)]

    def train_dataloader(self):
        return DataLoader(self.batches, batch_size=None, shuffle=False)


class _Recorder(pl.Callback):
    """Per step: the parameters before and after, the scaled gradients straight out of backward (before
    Lightning un-scales them), the scale they carry, and each parameter's lr / weight decay of that step."""

    def __init__(self):
        self.steps: list[dict] = []

    def _params(self, module):
        return [p for p in module.student.parameters() if p.requires_grad]

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.steps.append({"before": [p.detach().clone() for p in self._params(module)]})

    def on_after_backward(self, trainer, module):
        params = self._params(module)
        if len(self.steps) - 1 == INF_STEP:  # an overflowed fp16 backward, as the scaler would meet it
            params[0].grad.view(-1)[0] = float("inf")
        scaler = trainer.precision_plugin.scaler
        self.steps[-1].update(scale=scaler.get_scale(),
                              grads=[None if p.grad is None else p.grad.detach().clone() for p in params])

    def on_before_optimizer_step(self, trainer, module, optimizer):
        group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
        self.steps[-1]["hyper"] = [(group_of[id(p)]["lr"], group_of[id(p)]["weight_decay"], group_of[id(p)])
                                   for p in self._params(module)]

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.steps[-1].update(after=[p.detach().clone() for p in self._params(module)],
                              scale_after=trainer.precision_plugin.scaler.get_scale())


def _reference(steps: list[dict]) -> tuple[list[torch.Tensor], list[int], list[float]]:
    """The steps by hand from the recorded scaled gradients: un-scale by 1/scale, skip the step on any
    non-finite gradient (halving the scale), else clip each gradient to L2 norm <= CLIP (DINO's per-parameter
    rule, coef = CLIP / (||g|| + 1e-6) when below 1), then AdamW (decoupled decay, bias-corrected moments)."""
    b1, b2, eps = 0.9, 0.999, 1e-8
    params = [p.clone() for p in steps[0]["before"]]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    t, skipped, scales = 0, [], []
    for i, s in enumerate(steps):
        inv = float(torch.tensor(s["scale"], dtype=torch.float64).reciprocal().float())
        grads = [None if g is None else g * inv for g in s["grads"]]
        if not all(bool(torch.isfinite(g).all()) for g in grads if g is not None):
            skipped.append(i)
            scales.append(s["scale"] * 0.5)
            continue
        scales.append(s["scale"])  # growth only after 2000 finite steps
        t += 1
        for j, g in enumerate(grads):
            if g is None:
                continue
            norm = math.sqrt(float((g.double() ** 2).sum()))
            coef = CLIP / (norm + 1e-6)
            if coef < 1:
                g = g * coef
            lr, wd, group = s["hyper"][j]
            assert group["betas"] == (b1, b2) and group["eps"] == eps and not group["amsgrad"]
            params[j] = params[j] * (1 - lr * wd)
            m[j] = b1 * m[j] + (1 - b1) * g
            v[j] = b2 * v[j] + (1 - b2) * g * g
            denom = (v[j].sqrt() / math.sqrt(1 - b2 ** t)) + eps
            params[j] = params[j] - (lr / (1 - b1 ** t)) * m[j] / denom
    return params, skipped, scales


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_fp16_grad_scaler_foreach_adamw_and_clipping_match_the_hand_written_step(tmp_path):
    module, rec = _module(), _Recorder()
    scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE)
    trainer = pl.Trainer(max_epochs=2, max_steps=STEPS, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, default_root_dir=tmp_path, callbacks=[rec],
                         plugins=[MixedPrecision("16-mixed", "cpu", scaler)])
    trainer.fit(module, datamodule=_Data())
    opt = trainer.optimizers[0]
    assert trainer.precision == "16-mixed" and opt.defaults["foreach"] is True and not opt.defaults["fused"]
    assert len(rec.steps) == STEPS
    want, skipped, scales = _reference(rec.steps)
    assert skipped == [INF_STEP]  # the injected overflow, and no other step
    inf = rec.steps[INF_STEP]
    assert all(torch.equal(a, b) for a, b in zip(inf["before"], inf["after"]))  # skipped: bit for bit unchanged
    assert [s["scale_after"] for s in rec.steps] == scales and scales[INF_STEP] == INIT_SCALE / 2
    assert any(h[0] > 0 for s in rec.steps for h in s["hyper"])  # some step really moved the weights
    moved = [not torch.equal(a, b) for a, b in zip(rec.steps[0]["before"], rec.steps[-1]["after"])]
    assert sum(moved) > len(moved) // 2
    clipped = sum(CLIP / (float(g.double().norm()) / s["scale"] + 1e-6) < 1
                  for s in rec.steps if s is not inf for g in s["grads"] if g is not None)
    assert clipped > 0  # the clipping branch is exercised
    for got, ref in zip(rec.steps[-1]["after"], want):
        torch.testing.assert_close(got, ref, rtol=2e-5, atol=1e-6)
