"""The Triton attention's runtime canary (backbones/canary.py) and launch limits, under Triton's CPU interpreter
and on fake CUDA tensors.

A deliberately wrong kernel: the production forward kernel launched with ``MAX_PASSES=1`` (its threshold search
stopped after one pass: tau short of its root, sum p != 1), or with a wrong scale. Reference: ``entmax`` (the
library) on float64 scores. As in test_triton_attention.py, the interpreter must be chosen before Triton is first
imported: when the suite already imported Triton in compiled mode, test_triton_attention.py's
``test_kernels_in_subprocess`` runs its kernel tests in a fresh process.
"""
from __future__ import annotations

import timeit
import warnings

import entmax
import pytest
import torch

from helpers import interpreter

_PRELOADED = interpreter.choose()  # before Triton's first import: see helpers/interpreter.py
import triton  # noqa: E402,F401
from backbones import canary  # noqa: E402
from backbones import triton_attention as ta  # noqa: E402
from backbones import triton_kernels as tk  # noqa: E402

kernel = interpreter.kernel_tests(_PRELOADED)


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    canary.reset()
    monkeypatch.delenv(canary.MODE_ENV, raising=False)
    yield
    canary.reset()


class _Wrong:
    """The real forward kernel, launched with one constexpr or argument changed (a deliberately wrong kernel)."""

    def __init__(self, real, **change):
        self.real, self.change = real, change

    def __getitem__(self, grid):
        def launch(*args, **kw):
            args = list(args)
            if "scale" in self.change:  # the 8th positional argument (Q, K, V, O, OG, STATS, PASSES, scale)
                args[7] = args[7] * self.change["scale"]
            kw.update({k: v for k, v in self.change.items() if k != "scale"})
            return self.real[grid](*args, **kw)
        return launch


def _break(monkeypatch, **change):
    """Replace the forward kernel by a wrong one (still the interpreter's: ``interpreted()`` reads its type)."""
    from backbones import triton_plan as tp
    monkeypatch.setattr(tk, "_fwd_kernel", _Wrong(tk._fwd_kernel, **change))
    for module in (ta, tp):
        monkeypatch.setattr(module, "interpreted", lambda: True)


def _qkv(b, h, n, d, dtype, seed=0, spread=3.0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(b, h, n, d, generator=g, dtype=torch.float64) * spread).to(dtype) for _ in range(3)]


def _reference(q, k, v, scale, kind):
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    return {"entmax15": entmax.entmax15, "sparsemax": entmax.sparsemax}[kind](s, dim=-1) @ v.double()


@kernel
@pytest.mark.timeout(300)
@pytest.mark.parametrize("dtype,grad", [(torch.bfloat16, True), (torch.float32, False)])
def test_right_kernel_passes_the_canary_once_per_combination(dtype, grad, monkeypatch):
    q, k, v = [x.requires_grad_(grad) for x in _qkv(2, 2, 37, 16, dtype)]
    calls = []
    real = canary.problems
    monkeypatch.setattr(canary, "problems", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    for _ in range(2):
        out = ta.sparse_attention(q, k, v, 0.25, "entmax15")
    assert len(calls) == 1  # checked on the first call only
    want = f"{str(dtype)[6:]} N=37 M=37 entmax15 {'with' if grad else 'without'} gradient"
    assert canary.outcomes() == {want: "ok"}
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(out.double(), _reference(q.detach(), k.detach(), v.detach(), 0.25, "entmax15"),
                               atol=tol * 3 * 4, rtol=0)


@kernel
@pytest.mark.timeout(300)
@pytest.mark.parametrize("change,says", [({"MAX_PASSES": 1}, "sum of p over the keys is off 1"),
                                         ({"scale": 1.3}, "output differs from the torch reference")])
def test_wrong_kernel_stops_with_the_canarys_message(change, says, monkeypatch):
    """Scores that take 4 passes (checked): one pass leaves tau short of its root."""
    q, k, v = [x.requires_grad_() for x in _qkv(1, 2, 29, 16, torch.float32, seed=1, spread=1.0)]
    assert int(ta.threshold_passes((q @ k.transpose(-1, -2)).detach() * 0.3, "sparsemax").max()) == 4
    _break(monkeypatch, **change)
    with pytest.raises(canary.CanaryError) as err:
        ta.sparse_attention(q, k, v, 0.3, "sparsemax")
    msg = str(err.value)
    assert says in msg and "float32 N=29 M=29 sparsemax with gradient" in msg, msg
    assert f"torch {torch.__version__}" in msg and f"Triton {triton.__version__}" in msg and "GPU none" in msg
    assert "TOKENMIX_TRITON_CANARY=fallback" in msg


@kernel
@pytest.mark.timeout(300)
def test_wrong_kernel_stops_a_training_step(monkeypatch):
    """A ViT's training forward with entmax attention, its kernels on the CPU under the interpreter (the layer
    takes the Triton op for CUDA tensors only: patched to take it here)."""
    import backbones
    from backbones import attention
    monkeypatch.setattr(attention, "_triton_kernel", lambda q: ta)
    model = backbones.create_vit("vit_test_patch8", "entmax")
    x = torch.randn(2, 3, 32, 32)
    model(x).sum().backward()  # the right kernel: passes, and the combination is recorded
    assert canary.outcomes() == {"float32 N=17 M=17 entmax15 with gradient": "ok",  # every block but the last
                                 "float32 N=1 M=17 entmax15 with gradient": "ok"}  # the last: CLS queries only
    canary.reset()
    _break(monkeypatch, scale=1.3)
    with pytest.raises(canary.CanaryError, match="float32 N=17 M=17 entmax15 with gradient: output differs"):
        model(x).sum().backward()


@kernel
@pytest.mark.timeout(300)
def test_fallback_setting_runs_the_torch_path_and_records_it(monkeypatch):
    monkeypatch.setenv(canary.MODE_ENV, "fallback")
    _break(monkeypatch, MAX_PASSES=1)
    q, k, v = [x.requires_grad_() for x in _qkv(1, 2, 29, 16, torch.float32, seed=1, spread=1.0)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = ta.sparse_attention(q, k, v, 0.3, "sparsemax")
    assert any("runs on the torch path" in str(w.message) for w in caught)
    (why,) = canary.outcomes().values()
    assert why.startswith("fallback: ") and "sum of p" in why
    ref = _reference(q.detach(), k.detach(), v.detach(), 0.3, "sparsemax")
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=0)  # the wrong kernel's values are not used
    out.sum().backward()  # the torch path's gradient, against float64 autograd
    q64 = q.detach().double().requires_grad_()
    _reference(q64, k.detach(), v.detach(), 0.3, "sparsemax").sum().backward()
    torch.testing.assert_close(q.grad.double(), q64.grad, atol=1e-5, rtol=0)


@kernel
@pytest.mark.timeout(120)
def test_a_known_combination_costs_a_lookup():
    """The steady-state cost (docs/performance.md, "The Triton canary: its cost"): once a combination is known, a
    call's key and lookup cost about as much as reading one tensor attribute a few times (< 2 us on the shared
    2-core test host)."""
    q, k, v = _qkv(1, 1, 17, 16, torch.float32)
    assert ta.sparse_attention(q, k, v, 0.25) is not None
    calls = 5000
    per_call = min(timeit.repeat(lambda: canary.trusted((q.dtype, 17, k.shape[-2], True, False), q, k, v, 0.25,
                                                        None, None, 64), number=calls, repeat=7)) / calls
    print(f"canary lookup: {per_call * 1e6:.2f} us per call")
    assert per_call < 2e-6, per_call


@pytest.mark.timeout(120)
def test_fake_cuda_tensors_skip_the_canary_and_check_launch_limits(monkeypatch):
    """Under FakeTensorMode (the fake-CUDA traces) the canary has no values to check and records nothing; the
    launch limits are checked on the shapes, at sizes no CPU could hold."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    monkeypatch.setattr(ta, "_device_ok", lambda x: True)
    with FakeTensorMode(allow_non_fake_inputs=False):
        q, k, v = (torch.empty(4, 6, 197, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        out = ta.sparse_attention(q, k, v, 0.125)
        assert out.shape == (4, 6, 197, 64) and out.device.type == "cuda"
        assert canary.outcomes() == {}
        # 11,000 x 6 = 66,000 (b, h) programs > 65,535
        big = torch.empty(11_000, 6, 37, 64, device="cuda", dtype=torch.bfloat16)
        with pytest.raises(ValueError, match=r"batch x heads = 11000 x 6 = 66000 exceeds .* at most 10922 items"):
            ta.sparse_attention(big, big, big, 0.125)
        # a ViT-S layer's slices of qkv (B, N, 3, H, d): 10,000 x 197 = 1.97 M images x tokens > 1.86 M
        qkv = torch.empty(10_000, 197, 3, 6, 64, device="cuda", dtype=torch.bfloat16).permute(2, 0, 3, 1, 4)
        with pytest.raises(ValueError, match=r"offsets into q reach .* 32-bit offsets .* at most 9462 items"):
            ta.sparse_attention(qkv[0], qkv[1], qkv[2], 0.125)
        fits = torch.empty(9_462, 197, 3, 6, 64, device="cuda", dtype=torch.bfloat16).permute(2, 0, 3, 1, 4)
        assert ta.sparse_attention(fits[0], fits[1], fits[2], 0.125).shape == (9_462, 6, 197, 64)


def test_launch_limit_arithmetic_by_hand():
    """The 32-bit bound for a ViT-S layer: the last element of q = qkv[:, :, 0] (B, N, 3, H, d) lies at
    (B-1) N 3 H d + (H-1) d + (N-1) 3 H d + (d-1), H = 6, d = 64 (3 H d = 1152)."""
    b, n = 9_463, 197
    q = torch.empty_strided((b, 6, n, 64), (n * 1152, 64, 1152, 1), device="meta")
    last = (b - 1) * n * 3 * 6 * 64 + 5 * 64 + (n - 1) * 3 * 6 * 64 + 63  # b, h, token, channel
    assert ta._reach(q) == last
    assert last > 2 ** 31 - 1 >= last - n * 1152  # 9,463 items overflow, 9,462 fit


def test_summary_json_records_the_canarys_fallbacks():
    """RunSummary's summary.json dict carries ``triton_canary`` when a combination fell back (and nothing when the
    canary never ran, as on CPU runs)."""
    from types import SimpleNamespace

    from lightning_modules.callbacks.summary import RunSummary
    trainer = SimpleNamespace(callback_metrics={}, global_step=3, current_epoch=0, callbacks=[],
                              datamodule=SimpleNamespace())
    module = SimpleNamespace(hparams=SimpleNamespace(variant="entmax", arch="vit_test_patch8"))
    assert "triton_canary" not in RunSummary().summary(trainer, module)
    canary._seen[(torch.float16, 197, 197, True, True)] = "fallback: sum of p over the keys is off 1 by up to 0.5"
    got = RunSummary().summary(trainer, module)["triton_canary"]
    assert got == {"float16 N=197 M=197 entmax15 with gradient":
                   "fallback: sum of p over the keys is off 1 by up to 0.5"}
