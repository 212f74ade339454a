"""facebookresearch/dino (7c446df) ``main_dino.py``, transcribed: ``DINOLoss`` and one iteration of
``train_one_epoch`` (``train_step``), with the model built as ``train_dino`` builds it (``build_student_teacher``).

The independent plain DINO step of ``make bench`` (``bench.dino_step``) and ``make gpu-check`` part (d). It uses
only ``official.vit`` (the transcribed ``vision_transformer.py`` / ``utils.py``), never the project.
Deviations, none of which changes a number in a world of one process: ``update_center`` all-reduces only when
``torch.distributed`` is initialised; ``train_step`` takes the iteration's lr / wd / momentum as numbers instead of
indexing the schedules, returns the loss as a float instead of logging it, raises instead of ``sys.exit(1)`` on a
non-finite loss, and moves images with ``.to(device)`` (``.cuda(non_blocking=True)`` on a GPU); ``autocast_dtype``
generalises ``torch.cuda.amp.autocast(fp16_scaler is not None)`` (fp16) to bf16, which the official code lacks.
"""
from __future__ import annotations

import contextlib
import math

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from official import vit as vits


class DINOLoss(nn.Module):
    def __init__(self, out_dim, ncrops, warmup_teacher_temp, teacher_temp, warmup_teacher_temp_epochs, nepochs,
                 student_temp=0.1, center_momentum=0.9):
        super().__init__()
        self.student_temp = student_temp
        self.center_momentum = center_momentum
        self.ncrops = ncrops
        self.register_buffer("center", torch.zeros(1, out_dim))
        self.teacher_temp_schedule = np.concatenate((
            np.linspace(warmup_teacher_temp, teacher_temp, warmup_teacher_temp_epochs),
            np.ones(nepochs - warmup_teacher_temp_epochs) * teacher_temp))

    def forward(self, student_output, teacher_output, epoch):
        student_out = student_output / self.student_temp
        student_out = student_out.chunk(self.ncrops)
        temp = self.teacher_temp_schedule[epoch]
        teacher_out = F.softmax((teacher_output - self.center) / temp, dim=-1)
        teacher_out = teacher_out.detach().chunk(2)
        total_loss = 0
        n_loss_terms = 0
        for iq, q in enumerate(teacher_out):
            for v in range(len(student_out)):
                if v == iq:  # skip the student and teacher seeing the same view
                    continue
                loss = torch.sum(-q * F.log_softmax(student_out[v], dim=-1), dim=-1)
                total_loss += loss.mean()
                n_loss_terms += 1
        total_loss /= n_loss_terms
        self.update_center(teacher_output)
        return total_loss

    @torch.no_grad()
    def update_center(self, teacher_output):
        batch_center = torch.sum(teacher_output, dim=0, keepdim=True)
        world = 1
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(batch_center)
            world = dist.get_world_size()
        batch_center = batch_center / (len(teacher_output) * world)
        self.center = self.center * self.center_momentum + batch_center * (1 - self.center_momentum)


def build_student_teacher(arch="vit_small", patch_size=16, out_dim=65536, drop_path_rate=0.1, use_bn_in_head=False,
                          norm_last_layer=True, head_kwargs=None, **vit_kwargs):
    """``train_dino``'s model section: student with drop path, teacher without, teacher = student's weights,
    teacher frozen. ``vit_kwargs`` reach the ViT constructor (``arch="custom"``: ``VisionTransformer`` itself, e.g.
    a small ``embed_dim`` / ``depth``); ``head_kwargs`` the DINOHead's (``hidden_dim``, ``bottleneck_dim``, ...)."""
    make = vits.VisionTransformer if arch == "custom" else vits.__dict__[arch]
    kw = dict(patch_size=patch_size, **vit_kwargs)
    student = make(drop_path_rate=drop_path_rate, **kw)
    teacher = make(**kw)
    embed_dim = student.embed_dim
    hk = head_kwargs or {}
    student = vits.MultiCropWrapper(student, vits.DINOHead(embed_dim, out_dim, use_bn=use_bn_in_head,
                                                           norm_last_layer=norm_last_layer, **hk))
    teacher = vits.MultiCropWrapper(teacher, vits.DINOHead(embed_dim, out_dim, use_bn_in_head, **hk))
    teacher.load_state_dict(student.state_dict())
    for p in teacher.parameters():
        p.requires_grad = False
    return student, teacher


def train_step(student, teacher, dino_loss, images, optimizer, lr, wd, m, epoch, fp16_scaler=None, clip_grad=3.0,
               freeze_last_layer=1, autocast_dtype=None) -> float:
    """One ``train_one_epoch`` iteration. ``student`` is the bare student (the official code's
    ``student.module`` under DDP); ``autocast_dtype``: None = fp32, or torch.float16 / torch.bfloat16."""
    for i, param_group in enumerate(optimizer.param_groups):
        param_group["lr"] = lr
        if i == 0:  # only the first group is regularized
            param_group["weight_decay"] = wd
    device = next(student.parameters()).device
    images = [im.to(device, non_blocking=True) for im in images]
    amp = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    with amp:
        teacher_output = teacher(images[:2])  # only the 2 global views pass through the teacher
        student_output = student(images)
        loss = dino_loss(student_output, teacher_output, epoch)
    if not math.isfinite(loss.item()):
        raise FloatingPointError(f"Loss is {loss.item()}, stopping training")
    optimizer.zero_grad()
    if fp16_scaler is None:
        loss.backward()
        if clip_grad:
            vits.clip_gradients(student, clip_grad)
        vits.cancel_gradients_last_layer(epoch, student, freeze_last_layer)
        optimizer.step()
    else:
        fp16_scaler.scale(loss).backward()
        if clip_grad:
            fp16_scaler.unscale_(optimizer)  # unscale the gradients in place before clipping
            vits.clip_gradients(student, clip_grad)
        vits.cancel_gradients_last_layer(epoch, student, freeze_last_layer)
        fp16_scaler.step(optimizer)
        fp16_scaler.update()
    with torch.no_grad():  # EMA update for the teacher
        for param_q, param_k in zip(student.parameters(), teacher.parameters()):
            param_k.data.mul_(m).add_((1 - m) * param_q.detach().data)
    return loss.item()
