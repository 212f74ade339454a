"""DINOLoss against hand-worked numbers and an independent per-sample re-implementation."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lightning_modules.dino_loss import DINOLoss


def reference_loss(student, teacher, center, ncrops, tau_s, tau_t):
    """Plain python loops in float64: mean over (teacher global view g, student view v != g) of
    the batch mean of  -sum_k q_k log p_k."""
    B = teacher.shape[0] // 2
    s = student.double().reshape(ncrops, B, -1)
    t = teacher.double().reshape(2, B, -1)
    total, n = 0.0, 0
    for g in range(2):
        for v in range(ncrops):
            if v == g:
                continue
            per_sample = []
            for b in range(B):
                q = torch.softmax((t[g, b] - center.double()[0]) / tau_t, dim=0)
                logp = torch.log_softmax(s[v, b] / tau_s, dim=0)
                per_sample.append(float(-(q * logp).sum()))
            total += sum(per_sample) / B
            n += 1
    return total / n


def test_hand_worked_two_prototypes():
    # K=2, teacher logits (0, tau_t ln 3) -> q = (1/4, 3/4); student logits (0, tau_s ln 3) -> p = (1/4, 3/4)
    # loss = cross-entropy H(q, p) = -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.562335...; 2 crops -> 2 pairs, same value
    tau_s, tau_t = 0.1, 0.04
    loss = DINOLoss(out_dim=2, ncrops=2, warmup_teacher_temp=tau_t, teacher_temp=tau_t,
                    warmup_teacher_temp_epochs=0, nepochs=1, student_temp=tau_s)
    teacher = torch.tensor([[0.0, tau_t * math.log(3)]] * 2)
    student = torch.tensor([[0.0, tau_s * math.log(3)]] * 2)
    expected = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert loss(student, teacher, 0).item() == pytest.approx(expected, abs=1e-6)
    # centre after one update: 0.9 * 0 + 0.1 * batch mean of the teacher logits
    assert torch.allclose(loss.center, 0.1 * teacher.mean(0, keepdim=True))


def test_uniform_outputs_give_log_k():
    loss = DINOLoss(16, 4, 0.04, 0.04, 0, 10)
    assert loss(torch.zeros(4 * 3, 16), torch.zeros(2 * 3, 16), 0).item() == pytest.approx(math.log(16), abs=1e-6)


def test_matches_reference_with_centre_updates_and_temperature_schedule():
    torch.manual_seed(0)
    out_dim, ncrops, B = 32, 5, 3
    loss = DINOLoss(out_dim, ncrops, warmup_teacher_temp=0.04, teacher_temp=0.07, warmup_teacher_temp_epochs=3,
                    nepochs=6, student_temp=0.1, center_momentum=0.9)
    center = torch.zeros(1, out_dim, dtype=torch.float64)
    temps = {0: 0.04, 1: 0.055, 2: 0.07, 3: 0.07, 5: 0.07}  # np.linspace(0.04, 0.07, 3), then constant
    for epoch, temp in temps.items():
        assert loss.teacher_temp(epoch) == pytest.approx(temp)
        student = torch.randn(ncrops * B, out_dim) * 3
        teacher = torch.randn(2 * B, out_dim) * 3 + 1.0
        expected = reference_loss(student, teacher, center, ncrops, 0.1, temp)
        got = loss(student, teacher, epoch).item()
        assert got == pytest.approx(expected, rel=1e-5)
        center = center * 0.9 + teacher.double().mean(0, keepdim=True) * 0.1  # EMA of the batch mean
        assert torch.allclose(loss.center.double(), center, atol=1e-6)


def test_schedule_is_the_official_array_and_clamps_past_the_end():
    loss = DINOLoss(8, 10, 0.04, 0.07, 30, 200)
    ref = np.concatenate((np.linspace(0.04, 0.07, 30), np.ones(170) * 0.07))
    assert np.array_equal(loss.teacher_temp_schedule, ref)
    assert loss.teacher_temp(15) == pytest.approx(0.04 + 15 * 0.03 / 29)
    assert loss.teacher_temp(500) == pytest.approx(0.07)


def test_teacher_gets_no_gradient_student_does():
    loss = DINOLoss(8, 3, 0.04, 0.04, 0, 1)
    s = torch.randn(6, 8, requires_grad=True)
    t = torch.randn(4, 8, requires_grad=True)
    loss(s, t, 0).backward()
    assert s.grad is not None and s.grad.abs().sum() > 0
    assert t.grad is None  # the teacher distribution is detached
    assert "center" in dict(loss.named_buffers())
