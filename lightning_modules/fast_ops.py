"""Whole-model DINO update steps in a few multi-tensor kernels instead of one small kernel per parameter.

Same maths as facebookresearch/dino ``utils.clip_gradients`` and the ``train_one_epoch`` teacher EMA
(transcribed in ``official/``); nothing reads a value back to the host on a GPU, so the step never waits for the
device (on a CPU the clip multiplies only the gradients it clips, as upstream).
"""
from __future__ import annotations

from typing import Iterable, Optional

import torch


@torch.no_grad()
def clip_grad_norms_(params: Iterable[torch.Tensor], clip: float) -> Optional[torch.Tensor]:
    """Per-parameter clipping, the official rule: gradients with ``coef = clip / (||g||_2 + 1e-6) < 1`` are
    multiplied by it. Returns the norms before clipping (one tensor), or None when no parameter has a gradient."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return None
    norms = torch.stack(torch._foreach_norm(grads, 2))
    coefs = (clip / (norms + 1e-6)).clamp_max_(1.0)
    if norms.device.type == "cpu":  # reading the values costs nothing here: touch only the clipped gradients
        for g, c, clipped in zip(grads, coefs.unbind(), (coefs < 1).tolist()):
            if clipped:
                g.mul_(c)
        return norms
    by_dtype: dict[torch.dtype, tuple[list, list]] = {}
    for g, c in zip(grads, coefs.unbind()):
        gs, cs = by_dtype.setdefault(g.dtype, ([], []))
        gs.append(g)
        cs.append(c)
    for gs, cs in by_dtype.values():
        torch._foreach_mul_(gs, cs)
    return norms


@torch.no_grad()
def ema_(teacher: list[torch.Tensor], student: list[torch.Tensor], m: float,
         multi_tensor: Optional[bool] = None) -> None:
    """``teacher = m * teacher + (1 - m) * student``, rounded as the official ``mul_(m).add_((1 - m) * student)``
    (a fused ``add_(alpha=)`` rounds differently: 1e-6-scale loss changes). Multi-tensor on a GPU; per parameter
    on a CPU, where reusing one freed block beats allocating every product at once (docs/performance.md, "DINO
    step"). ``multi_tensor``: force one form (None: by device)."""
    if multi_tensor is None:
        multi_tensor = bool(teacher) and teacher[0].device.type != "cpu"
    if not multi_tensor:
        for t, s in zip(teacher, student):
            t.mul_(m).add_((1 - m) * s)
        return
    torch._foreach_mul_(teacher, m)
    torch._foreach_add_(teacher, torch._foreach_mul(student, 1 - m))
