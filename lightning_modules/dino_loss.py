"""DINO self-distillation loss with centering and the teacher-temperature warm-up (facebookresearch/dino)."""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class DINOLoss(nn.Module):
    """Cross-entropy between the centred, sharpened teacher and the student over every (global teacher view,
    other student view) pair, averaged over pairs. ``center`` is an EMA of the teacher's batch mean."""

    def __init__(self, out_dim: int, ncrops: int, warmup_teacher_temp: float, teacher_temp: float,
                 warmup_teacher_temp_epochs: int, nepochs: int, student_temp: float = 0.1,
                 center_momentum: float = 0.9):
        super().__init__()
        if warmup_teacher_temp_epochs > nepochs:
            raise ValueError(f"warmup_teacher_temp_epochs={warmup_teacher_temp_epochs} exceeds nepochs={nepochs}")
        self.student_temp = student_temp
        self.center_momentum = center_momentum
        self.ncrops = ncrops
        self.register_buffer("center", torch.zeros(1, out_dim))
        # per-epoch linear warm-up, then constant (same array as the official code)
        self.teacher_temp_schedule = np.concatenate((
            np.linspace(warmup_teacher_temp, teacher_temp, warmup_teacher_temp_epochs),
            np.ones(nepochs - warmup_teacher_temp_epochs) * teacher_temp))

    def teacher_temp(self, epoch: int) -> float:
        # deviation: clamp instead of IndexError when training runs past the scheduled epochs
        return float(self.teacher_temp_schedule[min(epoch, len(self.teacher_temp_schedule) - 1)])

    def forward(self, student_output: torch.Tensor, teacher_output: torch.Tensor, epoch: int) -> torch.Tensor:
        student_out = (student_output / self.student_temp).chunk(self.ncrops)
        temp = self.teacher_temp(epoch)
        teacher_out = F.softmax((teacher_output - self.center) / temp, dim=-1).detach().chunk(2)
        total_loss, n_loss_terms = 0.0, 0
        for iq, q in enumerate(teacher_out):
            for v, s in enumerate(student_out):
                if v == iq:  # same view for teacher and student: skipped
                    continue
                total_loss = total_loss + torch.sum(-q * F.log_softmax(s, dim=-1), dim=-1).mean()
                n_loss_terms += 1
        total_loss = total_loss / n_loss_terms
        self.update_center(teacher_output)
        return total_loss

    @torch.no_grad()
    def update_center(self, teacher_output: torch.Tensor) -> None:
        batch_center = torch.sum(teacher_output, dim=0, keepdim=True)
        world = 1
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(batch_center)
            world = dist.get_world_size()
        batch_center = batch_center / (len(teacher_output) * world)
        # in place, so the registered buffer (and its checkpoint entry) is what changes
        self.center.mul_(self.center_momentum).add_(batch_center * (1 - self.center_momentum))
