"""The forward's FUSED threshold reduction (one ``tl.reduce`` over four inputs, ``_support_sums`` in
backbones/triton_kernels.py) is what every compiled launch runs, but the launch plan turns it off under Triton's
interpreter (a custom combine runs per element in Python there). Forced on here, under the interpreter, on small
shapes: the output, the row sums of p (v = 1: o = sum p) and the threshold pass counts against the unfused path
and the ``entmax`` library, for the register-tile path (16-bit, one tile; keys 37) and the block-wise path
(fp32, two key blocks; keys 80).

Run alone, this module sets TRITON_INTERPRET=1 before Triton is imported; in the full suite (Triton already
imported in compiled mode) test_triton_attention.py's ``test_kernels_in_subprocess`` runs its tests in a fresh process.
"""
from __future__ import annotations


import entmax
import pytest
import torch

from helpers import interpreter

_PRELOADED = interpreter.choose()  # before Triton's first import: see helpers/interpreter.py
import triton  # noqa: E402,F401
from backbones import triton_attention as ta, triton_plan as tp  # noqa: E402

here = interpreter.kernel_tests(_PRELOADED)
_REF = {"entmax15": entmax.entmax15, "sparsemax": entmax.sparsemax}


def _forced(monkeypatch, fused: bool) -> None:
    """The forward launch's FUSED constexpr set to ``fused`` (everything else as planned)."""
    plan = tp._plan.__wrapped__ if hasattr(tp._plan, "__wrapped__") else tp._plan

    def forced(*args, **kw):
        (name, fn, grid, consts, opts), *rest = plan(*args, **kw)
        return [(name, fn, grid, {**consts, "FUSED": fused}, opts), *rest]
    forced.__wrapped__ = plan
    monkeypatch.setattr(tp, "_plan", forced)


def _run(kind, dtype, m, monkeypatch, fused):
    _forced(monkeypatch, fused)
    g = torch.Generator().manual_seed(m)
    q, k = ((torch.randn(1, 1, n, 16, generator=g, dtype=torch.float64) * 1.5).to(dtype) for n in (6, m))
    ones = torch.ones(1, 1, m, 16, dtype=dtype)
    v = torch.randn(1, 1, m, 16, generator=g, dtype=torch.float64).to(dtype)
    out, total = (ta.sparse_attention(q, k, x, 0.25, kind=kind) for x in (v, ones))
    passes = ta.threshold_passes((q.double() @ k.double().transpose(-2, -1) * 0.25).float(), kind)
    ref = _REF[kind](q.double() @ k.double().transpose(-2, -1) * 0.25, dim=-1) @ v.double()
    return out.double(), total.double(), passes, ref


@here
@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind,dtype,m", [("entmax15", torch.bfloat16, 37), ("sparsemax", torch.float32, 80),
                                          ("entmax15", torch.float32, 80)])
def test_fused_reduction_matches_the_unfused_path_and_entmax(kind, dtype, m, monkeypatch):
    assert tp.interpreted()
    fused = _run(kind, dtype, m, monkeypatch, True)
    plain = _run(kind, dtype, m, monkeypatch, False)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(fused[0], plain[0], rtol=0, atol=tol)  # same threshold, same output
    assert torch.equal(fused[2], plain[2]) and int(fused[2].max()) < tp._MAX_PASSES  # same passes, settled
    torch.testing.assert_close(fused[1], torch.ones_like(fused[1]), rtol=0, atol=tol)  # sum p = 1
    torch.testing.assert_close(fused[0], fused[3], rtol=0, atol=tol * 4)  # the entmax library's values


@here
@pytest.mark.timeout(120)
def test_the_plan_runs_fused_only_when_compiled(monkeypatch):
    consts = tp._plan(6, 37, torch.bfloat16, 16, 16, 1, True, False)[0][3]
    assert consts["FUSED"] is False  # here, the interpreter; test_kernel_report checks the compiled launches
    _forced(monkeypatch, True)
    assert tp._plan(6, 37, torch.bfloat16, 16, 16, 1, True, False)[0][3]["FUSED"] is True
