"""The Triton attention's runtime canary: the first call of each combination (dtype, N queries, M keys,
normaliser, with or without gradient) in a process is checked on ``ROWS`` query rows of its own input against the
fp32 torch reference (``entmax_fast.sparse_attention``): the output and, with a gradient, dq, dk, dv within
``TOL[dtype]`` (widened by the scores' own rounding, ``_rounding``); sum_k p = 1 within ``SUM_TOL``; every row's
search ended before ``MAX_PASSES``. On failure the run stops (:class:`CanaryError`), unless
``TOKENMIX_TRITON_CANARY=fallback`` (the torch path, reported by :func:`outcomes` in summary.json); ``=off`` skips
the checks; fake tensors are not checked. Cost: docs/performance.md, "The Triton canary".
"""
from __future__ import annotations

import os
from typing import Callable

import torch
from torch import Tensor

MODE_ENV = "TOKENMIX_TRITON_CANARY"
MODES = ("stop", "fallback", "off")
ROWS = 16  # query rows checked per combination (one head of batch item 0)
TOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 3e-3}  # max error / max |reference|
SUM_TOL = 2e-3  # |sum p - 1|
_seen: dict[tuple, str] = {}  # combination -> "ok" | "fallback: <why>"


class CanaryError(RuntimeError):
    """The Triton attention disagreed with the torch reference on its first call of a combination."""


def mode() -> str:
    m = os.environ.get(MODE_ENV, "stop").strip() or "stop"
    if m not in MODES:
        raise ValueError(f"{MODE_ENV}={m!r}: valid values are {', '.join(MODES)}")
    return m


def label(combo: tuple) -> str:
    """(dtype, N, M, entmax, need_grad) in words."""
    dtype, n, m, entmax, grad = combo
    return (f"{str(dtype).replace('torch.', '')} N={n} M={m} {'entmax15' if entmax else 'sparsemax'} "
            f"{'with' if grad else 'without'} gradient")


def outcomes() -> dict[str, str]:
    """What the canary decided in this process, per combination: "ok" or "fallback: <why>" (summary.json)."""
    return {label(c): v for c, v in _seen.items()}


def reset() -> None:
    _seen.clear()


def _machine(device: torch.device) -> str:
    try:
        import triton
        tri = triton.__version__
    except ImportError:
        tri = "absent"
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "none (CPU, Triton interpreter)"
    return f"torch {torch.__version__} (CUDA build {torch.version.cuda}), Triton {tri}, GPU {gpu}"


def _rounding(q: Tensor, k: Tensor, coef: float, entmax: bool) -> float:
    """How far the kernel's own rounding of the scores moves sum p (and so o and the gradients), on top of the
    fixed tolerances: scores round to ``eps`` (fp32 accumulation; tf32 operands: 11 bits) of each row's largest
    |coef q||k| sum, and sum p moves by at most 2 sqrt(M) (entmax-1.5) or M (sparsemax) times a shift of the
    threshold (large logits: the kernel's fp32 zmax alone is off by its ulp)."""
    from .triton_plan import _prec
    eps = 2.0 ** -11 if q.dtype == torch.float32 and _prec(q.dtype) == "tf32" else 2.0 ** -23
    size = float((q.double().abs() @ k.double().abs().transpose(-1, -2)).max()) * coef
    m = k.shape[-2]
    return 4 * eps * size * (2 * m ** 0.5 if entmax else m)


def _grad_errors(o, og, stats, ref, ref_in, q1, k1, v1, scale, entmax, backward, tol) -> list[str]:
    """dq, dk, dv of the kernels against autograd through the reference, as a share of the larger of the
    reference's max and the gradient's natural size (|dO| |v| |k or q| scale; |dO| for dv): rows where the true
    gradient vanishes (one-hot p) compare on that size, not on zero."""
    do = torch.cos(torch.arange(o.numel(), device=o.device, dtype=torch.float32)).reshape(o.shape)
    grads = backward(do.to(o.dtype), q1, k1, v1, og, stats, scale, entmax)
    ref_grads = torch.autograd.grad(ref, ref_in, do)
    big = [float(x.detach().abs().max()) for x in (do, *ref_in)]  # dO, q, k, v
    natural = (big[0] * big[3] * big[2] * scale, big[0] * big[3] * big[1] * scale, big[0])
    out = []
    for name, g, r, size in zip(("dq", "dk", "dv"), grads, ref_grads, natural):
        e = float((g.float() - r).abs().max()) / max(float(r.abs().max()), size, 1e-12)
        if not e <= tol:
            out.append(f"{name} differs from autograd through the torch reference by {e:.3g} x its size "
                       f"(bound {tol:.3g})")
    return out


def problems(q: Tensor, k: Tensor, v: Tensor, scale: float, entmax: bool, need_grad: bool, forward: Callable,
             backward: Callable, max_passes: int) -> list[str]:
    """What is wrong with the kernels on the first ``ROWS`` rows of (b, h) = (0, 0) of q, k, v (B, H, N, d), run
    through the launcher's ``forward`` / ``backward``. Empty: the kernels agree."""
    from .entmax_fast import sparse_attention as reference
    q1, k1, v1 = q[:1, :1, :ROWS], k[:1, :1], v[:1, :1]
    o, og, stats, passes = forward(q1, k1, v1, scale, entmax, need_grad, True)
    coef = scale * 0.5 if entmax else scale
    extra = _rounding(q1, k1, coef, entmax)
    tol, out = TOL[q.dtype] + extra, []
    ref_in = [x.detach().float().requires_grad_(need_grad) for x in (q1, k1, v1)]
    with torch.enable_grad() if need_grad else torch.no_grad():
        ref = reference(*ref_in, scale, "entmax15" if entmax else "sparsemax")
    err = float((o.float() - ref.detach()).abs().max() / v1.float().abs().max().clamp_min(1e-12))
    if not err <= tol:
        out.append(f"output differs from the torch reference by {err:.3g} x max|v| (bound {tol:.3g})")
    z = (q1.double() @ k1.double().transpose(-1, -2)) * coef - stats[..., :1].double()
    p = (z - stats[..., 1:].double()).clamp_min(0)
    dev = float(((p * p if entmax else p).sum(-1) - 1).abs().max())
    if not dev <= SUM_TOL + extra:
        out.append(f"sum of p over the keys is off 1 by up to {dev:.3g} (bound {SUM_TOL + extra:.3g})")
    most = int(passes.max())
    if most >= max_passes:
        out.append(f"a row's threshold search took {most} passes (limit MAX_PASSES = {max_passes})")
    if need_grad:
        out += _grad_errors(o, og, stats, ref, ref_in, q1, k1, v1, scale, entmax, backward, tol)
    return out


def trusted(combo: tuple, q: Tensor, k: Tensor, v: Tensor, scale: float, forward: Callable, backward: Callable,
            max_passes: int) -> bool:
    """Whether the kernels may run this call of ``combo`` = (dtype, N, M, entmax, need_grad) (False: the torch
    path); checks the combination on its first call, raising :class:`CanaryError` in ``stop`` mode."""
    seen = _seen.get(combo)
    if seen is not None:
        return seen == "ok"
    entmax, need_grad = combo[3], combo[4]
    if torch._subclasses.fake_tensor.is_fake(q) or torch.compiler.is_compiling() or mode() == "off":
        return True
    with torch.no_grad():
        found = problems(q, k, v, scale, entmax, need_grad, forward, backward, max_passes)
    if not found:
        _seen[combo] = "ok"
        return True
    why = "; ".join(found)
    if mode() == "fallback":
        _seen[combo] = f"fallback: {why}"
        import warnings
        warnings.warn(f"Triton attention canary failed for {label(combo)} ({why}) on {_machine(q.device)}: "
                      f"this combination runs on the torch path ({MODE_ENV}=fallback)", RuntimeWarning)
        return False
    raise CanaryError(f"Triton attention canary failed for {label(combo)}: {why}. {_machine(q.device)}. Stopping "
                      f"rather than training on wrong attention; {MODE_ENV}=fallback runs this combination on the "
                      "(slower) torch path instead and records it in summary.json")
