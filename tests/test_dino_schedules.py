"""Schedules and optimiser helpers equal the official formulas at chosen iterations."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lightning_modules.dino_optim import cancel_gradients_last_layer, cosine_scheduler, get_params_groups


def official_value(it, base, final, epochs, niter, warmup_epochs=0, start=0.0):
    """Closed form of main_dino's schedules: np.linspace warm-up (endpoints included), then
    final + (base - final) / 2 * (1 + cos(pi * j / J)) for j = it - W, J = epochs * niter - W."""
    W = warmup_epochs * niter
    if it < W:
        return start + (base - start) * it / (W - 1)
    J = epochs * niter - W
    return final + 0.5 * (base - final) * (1 + math.cos(math.pi * (it - W) / J))


def test_paper_lr_schedule_at_chosen_iterations():
    # paper preset: lr 0.0005 x 1024 / 256 = 0.002, min_lr 1e-6, 200 epochs, 1251 it/epoch, 10 warm-up epochs
    base, niter = 0.0005 * 1024 / 256, 1251
    s = cosine_scheduler(base, 1e-6, 200, niter, warmup_epochs=10)
    assert len(s) == 200 * niter
    for it in (0, 1, 5000, 12509, 12510, 12511, 100000, 200 * niter - 1):
        assert s[it] == pytest.approx(official_value(it, base, 1e-6, 200, niter, 10), rel=1e-12, abs=1e-15)
    assert s[0] == 0.0 and s[12509] == pytest.approx(base) and s[12510] == pytest.approx(base)
    # halfway through the cosine part the value is the mean of the two ends
    J = 200 * niter - 12510
    assert s[12510 + J // 2] == pytest.approx((base + 1e-6) / 2, rel=1e-4)


def test_weight_decay_and_momentum_schedules():
    wd = cosine_scheduler(0.04, 0.4, 200, 100)
    mom = cosine_scheduler(0.996, 1.0, 200, 100)
    for it in (0, 1, 777, 10000, 19999):
        assert wd[it] == pytest.approx(official_value(it, 0.04, 0.4, 200, 100))
        assert mom[it] == pytest.approx(official_value(it, 0.996, 1.0, 200, 100))
    assert wd[0] == pytest.approx(0.04) and mom[0] == pytest.approx(0.996)
    assert 0.9999999 < mom[-1] < 1.0  # upstream never quite reaches the final value
    assert all(v == pytest.approx(0.98) for v in cosine_scheduler(0.98, 0.98, 3, 5))  # demo: constant


def test_warmup_longer_than_training_is_an_error():
    with pytest.raises(ValueError, match="warmup_epochs"):
        cosine_scheduler(1.0, 0.0, 2, 3, warmup_epochs=2)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, 4))
        self.lin = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.gain = nn.Parameter(torch.ones(4))
        self.frozen = nn.Parameter(torch.ones(4, 4), requires_grad=False)
        self.last_layer = nn.Linear(4, 2, bias=False)


def test_params_groups_exclude_biases_and_1d():
    m = Tiny()
    reg, noreg = get_params_groups(m)
    ids = lambda ps: {id(p) for p in ps}  # noqa: E731
    assert ids(reg["params"]) == ids([m.cls_token, m.lin.weight, m.last_layer.weight])
    assert ids(noreg["params"]) == ids([m.lin.bias, m.norm.weight, m.norm.bias, m.gain])
    assert noreg["weight_decay"] == 0.0 and "weight_decay" not in reg


def test_last_layer_gradients_cancelled_only_while_frozen():
    m = Tiny()
    for p in (m.lin.weight, m.last_layer.weight):
        p.grad = torch.ones_like(p)
    cancel_gradients_last_layer(epoch=0, model=m, freeze_last_layer=1)
    assert m.last_layer.weight.grad is None and m.lin.weight.grad is not None
    m.last_layer.weight.grad = torch.ones_like(m.last_layer.weight)
    cancel_gradients_last_layer(epoch=1, model=m, freeze_last_layer=1)
    assert m.last_layer.weight.grad is not None
