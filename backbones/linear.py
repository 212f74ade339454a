"""The backbone's linear layers on oneDNN's fp32 GEMM on CPUs where MKL's sgemm under-performs (non-Intel x86;
figures: docs/performance.md, "oneDNN linears"). Results agree with ``F.linear`` to fp32 rounding, not bit for bit.

``backend`` is a runtime choice (``BackboneConfig`` leaves it out): ``aten`` = ``F.linear``; ``onednn`` = oneDNN on
CPU fp32 tensors outside autocast and ``torch.compile``; ``auto`` = ``$TOKENMIX_LINEAR_BACKEND`` when set, else
``onednn`` on non-Intel x86 CPUs (never chosen by a timing, so every host gives it one meaning).
"""
from __future__ import annotations

import functools
import os
import platform
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

BACKENDS = ("auto", "aten", "onednn")


@functools.lru_cache(maxsize=None)
def _cpu_vendor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


ENV = "TOKENMIX_LINEAR_BACKEND"


def resolve(backend: str) -> str:
    """``auto`` -> ``$TOKENMIX_LINEAR_BACKEND`` if set, else ``onednn`` or ``aten`` by CPU; an unknown name raises."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown linear backend '{backend}'; valid: {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    forced = os.environ.get(ENV, "").strip()
    if forced:
        if forced not in ("aten", "onednn"):
            raise ValueError(f"{ENV}={forced!r}: valid values are aten and onednn (unset it for auto)")
        return forced
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    return "onednn" if x86 and torch.backends.mkldnn.is_available() and _cpu_vendor() not in ("", "GenuineIntel") \
        else "aten"


def _gemm(a: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``a @ w.T + b`` (a (M, K), w (N, K), strided views accepted) by oneDNN."""
    return torch.ops.mkldnn._linear_pointwise(a, w, b, "none", [], "")


class _OneDNNLinearFn(torch.autograd.Function):
    """y = x W^T + b; dx = dy W and dW = dy^T x as oneDNN GEMMs on transposed views, db = sum of dy."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        x2 = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(x2, weight)
        ctx.has_bias, ctx.lead = bias is not None, x.shape[:-1]
        return _gemm(x2, weight, bias).view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x2, weight = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.shape[-1])
        dx = _gemm(dy2, weight.t()).view(*ctx.lead, weight.shape[1]) if ctx.needs_input_grad[0] else None
        dw = _gemm(dy2.t(), x2.t()) if ctx.needs_input_grad[1] else None
        db = dy2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], backend: str) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; with ``backend="onednn"`` by oneDNN where that applies (module docstring)."""
    if backend == "onednn" and x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32 \
            and x.numel() and not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling():
        return _OneDNNLinearFn.apply(x, weight, bias)
    return F.linear(x, weight, bias)


class FastLinear(nn.Linear):
    """``nn.Linear`` (same parameters and keys) computed by :func:`linear` with a resolved ``backend``."""

    def __init__(self, *args, backend: str = "auto", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.backend = resolve(backend)

    def functional(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """This layer's GEMM on other weights (a slice of its own, e.g. the q rows of a qkv projection)."""
        return linear(x, weight, bias, self.backend)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.backend)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, backend={self.backend}"


def use_fast_linears(module: nn.Module, backend: str = "auto") -> nn.Module:
    """Replace every plain ``nn.Linear`` under ``module`` by a :class:`FastLinear` holding the same parameters."""
    backend = resolve(backend)
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                fast = FastLinear(child.in_features, child.out_features, bias=child.bias is not None,
                                  device="meta", backend=backend)
                fast.weight, fast.bias = child.weight, child.bias
                setattr(parent, name, fast)
    return module
