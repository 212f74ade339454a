"""DINO's optimisation helpers, with the signatures of facebookresearch/dino utils.py: the per-iteration cosine
schedules (lr, weight decay, teacher momentum), the parameter groups that get weight decay, and the frozen last
layer's gradient. (The gradient clipping runs in ``fast_ops.clip_grad_norms_``.)"""
from __future__ import annotations

import numpy as np
from torch import nn


def cosine_scheduler(base_value: float, final_value: float, epochs: int, niter_per_ep: int,
                     warmup_epochs: int = 0, start_warmup_value: float = 0) -> np.ndarray:
    """One value per iteration: linear warm-up (``np.linspace``, endpoints included), then a half cosine from
    ``base_value`` to ``final_value`` (the last value stays just above ``final_value``, as upstream)."""
    warmup_iters = warmup_epochs * niter_per_ep
    warmup = np.linspace(start_warmup_value, base_value, warmup_iters) if warmup_epochs > 0 else np.array([])
    iters = np.arange(epochs * niter_per_ep - warmup_iters)
    if len(iters) == 0 and epochs * niter_per_ep > 0:
        raise ValueError(f"warmup_epochs={warmup_epochs} leaves no iteration for the cosine part "
                         f"(epochs={epochs}, niter_per_ep={niter_per_ep})")
    schedule = final_value + 0.5 * (base_value - final_value) * (1 + np.cos(np.pi * iters / max(len(iters), 1)))
    schedule = np.concatenate((warmup, schedule))
    assert len(schedule) == epochs * niter_per_ep
    return schedule


def get_params_groups(model: nn.Module) -> list[dict]:
    """Weight decay on weights only: biases and every 1-D parameter (norms, tokens' gains) get none."""
    regularized, not_regularized = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if name.endswith(".bias") or len(param.shape) == 1:
            not_regularized.append(param)
        else:
            regularized.append(param)
    return [{"params": regularized}, {"params": not_regularized, "weight_decay": 0.0}]


def cancel_gradients_last_layer(epoch: int, model: nn.Module, freeze_last_layer: int) -> None:
    """Drop the prototypes' gradients during the first ``freeze_last_layer`` epochs (AdamW then skips them)."""
    if epoch >= freeze_last_layer:
        return
    for n, p in model.named_parameters():
        if "last_layer" in n:
            p.grad = None
