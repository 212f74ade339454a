"""backbones.entmax_fast against the reference library (entmax.entmax15 / entmax.sparsemax), both backends.

Every check runs on the C++ kernel and on the pure-PyTorch path, each chosen by the ops' ``backend`` argument.
Tolerance 1e-5 (forward and backward). The C++ kernel is built once (cached, ~2 s cold).
"""
import shutil
import warnings
from functools import partial

import entmax
import pytest
import torch

import backbones
from backbones import entmax_fast as ef

OPS = {"entmax15": (ef.entmax15, entmax.entmax15), "sparsemax": (ef.sparsemax, entmax.sparsemax)}
TOL = 1e-5


def _backends():
    params = [pytest.param("torch", id="torch")]
    # a missing compiler is a supported configuration (PyTorch path); with one, the kernel must build
    params.append(pytest.param("cpp", id="cpp", marks=pytest.mark.skipif(
        shutil.which("c++") is None and shutil.which("g++") is None, reason="no C++ compiler")))
    return params


BACKENDS = _backends()


def _run(fn, x, dim=-1, grad=None):
    x = x.detach().clone().requires_grad_()
    y = fn(x, dim=dim)
    g = torch.randn_like(y, dtype=y.dtype) if grad is None else grad
    y.backward(g)
    return y.detach(), x.grad, g


def _fast(name, backend):
    return partial(OPS[name][0], backend=backend)


def _compare(name, backend, x, dim=-1):
    ref = OPS[name][1]
    y, gx, g = _run(_fast(name, backend), x, dim)
    y_ref, gx_ref, _ = _run(lambda t, dim: ref(t, dim=dim), x, dim, grad=g)
    assert y.dtype == y_ref.dtype
    torch.testing.assert_close(y, y_ref, atol=TOL, rtol=0)
    torch.testing.assert_close(gx, gx_ref, atol=TOL, rtol=0)
    torch.testing.assert_close(y.sum(dim), torch.ones_like(y.sum(dim)), atol=TOL, rtol=0)
    return y


def test_cpp_kernel_builds_when_a_compiler_exists():
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler")
    assert ef.cpp_available(), ef.cpp_build_error()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("T", [197, 50, 5])
@pytest.mark.parametrize("scale", [0.15, 1.0, 10.0])
def test_matches_reference_attention_shapes(backend, name, T, scale):
    # scale 0.15 ~ ViT-S logits at init (about 2/3 of keys in the entmax support), 10 ~ trained, peaked
    torch.manual_seed(T)
    x = torch.randn(2, 3, T, T) * scale
    y = _compare(name, backend, x)
    if name == "entmax15" and scale == 0.15 and T == 197:
        support = (y > 0).float().sum(-1).mean().item()
        assert 90 < support < 170  # ViT-S/16 at init: about 128 of 197 keys


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(OPS))
def test_ties_peaked_and_flat_rows(backend, name):
    n = 20
    rows = [
        torch.zeros(n),                                       # all equal: uniform 1/n
        torch.tensor([3.0, 3.0, 3.0] + [0.0] * (n - 3)),      # tie at the top
        torch.tensor([1.0, 1.0] + [0.0] * (n - 2)),           # sparsemax: tie exactly at tau's boundary
        torch.arange(n, dtype=torch.float32) % 4,             # many ties across the support
        torch.tensor([1000.0] + [0.0] * (n - 1)),             # very peaked: one-hot
        torch.tensor([1e-7 * i for i in range(n)]),           # very flat: near uniform
        torch.linspace(-1e4, 1e4, n),                         # huge range
        torch.tensor([2.0, 2.0 - 1e-6] + [-5.0] * (n - 2)),   # near tie at the top
    ]
    x = torch.stack(rows)
    y = _compare(name, backend, x)
    torch.testing.assert_close(y[0], torch.full((n,), 1.0 / n))
    assert y[4, 0] == 1.0 and (y[4, 1:] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(OPS))
def test_exact_zeros_and_hand_worked_values(backend, name):
    # entmax-1.5 of [0, -inf, ..] style rows, worked by hand: z = x/2, tau solves sum (z - tau)_+^2 = 1.
    # x = [2, 0]: z = [1, 0]; support {1} alone gives tau = 0, consistent (0 <= 0) -> [1, 0].
    # x = [1, 0]: z = [.5, 0]; tau = mean - sqrt((1 - ss)/2) = .25 - sqrt(.4375)  -> p = (z - tau)^2.
    y = _fast(name, backend)(torch.tensor([[2.0, 0.0], [1.0, 0.0]]))
    if name == "entmax15":
        tau = 0.25 - 0.4375 ** 0.5
        expect = torch.tensor([[1.0, 0.0], [(0.5 - tau) ** 2, (0.0 - tau) ** 2]])
    else:  # sparsemax: [1, 0] -> tau = 0 -> [1, 0]; [2, 0] -> [1, 0]
        expect = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    torch.testing.assert_close(y, expect, atol=1e-7, rtol=0)
    assert y[0, 1] == 0.0  # an exact zero, not a tiny number


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(OPS))
def test_masked_minus_inf(backend, name):
    torch.manual_seed(0)
    x = torch.randn(6, 50)
    mask = torch.rand(6, 50) < 0.5
    mask[:, 0] = False
    mask[3, 1:] = True  # a row with a single finite entry
    x = x.masked_fill(mask, float("-inf"))
    y = _compare(name, backend, x)
    assert (y[mask] == 0).all()
    assert y[3, 0] == 1.0
    xx = x.clone().requires_grad_()
    _fast(name, backend)(xx).backward(torch.randn(6, 50))
    assert torch.isfinite(xx.grad).all() and (xx.grad[mask] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(OPS))
def test_fully_masked_row_is_nan_like_softmax(backend, name):
    x = torch.randn(3, 7)
    x[1] = float("-inf")
    y = _fast(name, backend)(x)
    assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2]]).all()
    assert torch.isnan(torch.softmax(x, -1)[1]).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_computed_in_fp32(backend, name, dtype):
    torch.manual_seed(1)
    x = (torch.randn(2, 2, 33, 33) * 2).to(dtype)
    fast, ref = _fast(name, backend), OPS[name][1]
    xx = x.clone().requires_grad_()
    y = fast(xx)
    g = torch.randn_like(y)
    y.backward(g)
    assert y.dtype == torch.float32 and xx.grad.dtype == dtype
    xr = x.float().requires_grad_()
    y_ref = ref(xr, dim=-1)
    y_ref.backward(g)
    torch.testing.assert_close(y, y_ref, atol=TOL, rtol=0)
    torch.testing.assert_close(xx.grad, xr.grad.to(dtype))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(OPS))
def test_other_dims_and_noncontiguous(backend, name):
    torch.manual_seed(2)
    x = torch.randn(4, 9, 5)
    _compare(name, backend, x, dim=1)
    _compare(name, backend, x.transpose(0, 2), dim=-1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(OPS))
def test_gradcheck_float64(backend, name):
    torch.manual_seed(3)
    fast, ref = _fast(name, backend), OPS[name][1]
    # distinct values with margins, so finite differences never cross a support boundary
    x = (torch.randperm(4 * 7).reshape(4, 7).double() * 0.37).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: fast(t, dim=-1), (x,), eps=1e-6, atol=1e-8)
    y = fast(x)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, ref(x, dim=-1), atol=1e-12, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_saves_only_the_output(backend):
    x = torch.randn(2, 3, 11, 11, requires_grad=True)
    y = ef.entmax15(x, backend=backend)
    node = y.grad_fn
    while type(node).__name__ != "_SparseNormFnBackward":  # view nodes sit above the Function
        node = node.next_functions[0][0]
    saved = node.saved_tensors
    assert len(saved) == 1 and saved[0].data_ptr() == y.data_ptr()


@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="no C++ compiler")
def test_cpp_result_independent_of_thread_count():
    # rows are warm-started from their neighbour inside fixed groups: same bits with 1 or 2 threads
    torch.manual_seed(6)
    x = torch.randn(4, 6, 100, 100)
    x[:, :, ::3] *= 20  # alternate flat and peaked rows: warm starts from above and below the root
    old = torch.get_num_threads()
    out = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            out.append((ef.entmax15(x, backend="cpp"), ef.sparsemax(x, backend="cpp")))
    finally:
        torch.set_num_threads(old)
    assert all(torch.equal(a, b) for a, b in zip(*out))
    torch.testing.assert_close(out[0][0], entmax.entmax15(x, dim=-1), atol=TOL, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sort_fallback_is_exact(backend, monkeypatch):
    # rows that the sweep does not settle go to the sort-based formula: force that path for all rows
    torch.manual_seed(4)
    x = torch.randn(3, 4, 23) * 3
    x[0, 0, 5:] = float("-inf")
    x[1, 1] = 0.5  # ties
    if backend == "cpp":
        assert ef.cpp_available(), ef.cpp_build_error()
        ef._lib.tm_set_max_sweeps(0)
    monkeypatch.setattr(ef, "_MAX_SWEEPS", 0)
    try:
        for name in OPS:
            _compare(name, backend, x)
    finally:
        if backend == "cpp":
            ef._lib.tm_set_max_sweeps(64)


def test_auto_falls_back_to_torch_when_the_build_failed(monkeypatch):
    monkeypatch.setattr(ef, "_lib", None)
    monkeypatch.setattr(ef, "_lib_error", "RuntimeError: no C++ compiler found (simulated)")
    monkeypatch.setattr(ef, "_warned", False)
    x = torch.randn(2, 5, 5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = ef.entmax15(x, backend="auto")
        ef.entmax15(x)  # the default backend is auto
    assert sum("C++ kernel unavailable" in str(w.message) for w in caught) == 1  # warned once
    torch.testing.assert_close(y, entmax.entmax15(x, dim=-1), atol=TOL, rtol=0)
    with pytest.raises(RuntimeError, match="did not build"):
        ef.entmax15(x, backend="cpp")


def test_vit_threads_its_backend_to_every_attention_layer(monkeypatch):
    """create_vit(entmax_backend=...) reaches the op: with the C++ kernel 'unbuildable', a 'torch' model runs
    and a 'cpp' model fails naming the build, in both the fused and the recorded (explicit) attention paths."""
    import pickle
    monkeypatch.setattr(ef, "_lib", None)
    monkeypatch.setattr(ef, "_lib_error", "RuntimeError: no C++ compiler found (simulated)")
    x = torch.randn(1, 3, 32, 32)
    for record in (False, True):
        ok = backbones.create_vit("vit_test_patch8", "entmax", entmax_backend="torch")
        bad = backbones.create_vit("vit_test_patch8", "entmax", entmax_backend="cpp")
        assert {blk.attn.entmax_backend for blk in ok.blocks} == {"torch"}
        for blk in (*ok.blocks, *bad.blocks):
            blk.attn.record = record
        assert torch.isfinite(ok(x)).all()
        with pytest.raises(RuntimeError, match="did not build"):
            bad(x)
    # the bound attention class pickles by its arguments (softmax layers hold no closure)
    plain = backbones.create_vit("vit_test_patch8", "softmax").eval()
    again = pickle.loads(pickle.dumps(plain))
    assert type(again.blocks[0].attn) is type(plain.blocks[0].attn)
    assert torch.equal(again(x), plain(x))


def test_bad_input_errors():
    with pytest.raises(ValueError, match="valid: auto, cpp, torch"):
        ef.entmax15(torch.ones(3), backend="triton")
    with pytest.raises(ValueError, match="valid: auto, cpp, torch"):
        backbones.create_vit("vit_test_patch8", "entmax", entmax_backend="triton")
    with pytest.raises(TypeError, match="floating-point"):
        ef.entmax15(torch.ones(3, dtype=torch.long))
    assert ef.sparsemax(torch.empty(0, 4)).shape == (0, 4)


def _attention_ref(q, k, v, scale, name):
    return OPS[name][1]((q @ k.transpose(-2, -1)) * scale, dim=-1) @ v


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("N,M", [(50, 50), (7, 13)])
def test_sparse_attention_matches_unfused(backend, name, N, M):
    torch.manual_seed(N + M)
    d = 16
    q, k, v = torch.randn(2, 3, N, d) * 2, torch.randn(2, 3, M, d), torch.randn(2, 3, M, 8)
    qkv = [t.clone().requires_grad_() for t in (q, k, v)]
    out = ef.sparse_attention(*qkv, d ** -0.5, name, backend=backend)
    g = torch.randn_like(out)
    out.backward(g)
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    out_ref = _attention_ref(*ref, d ** -0.5, name)
    out_ref.backward(g)
    torch.testing.assert_close(out, out_ref, atol=TOL, rtol=0)
    for a, b in zip(qkv, ref):
        torch.testing.assert_close(a.grad, b.grad, atol=TOL, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("N", [37, 197])
def test_sparse_attention_is_bitwise_the_unfused_lines_for_head_dim_64(backend, name, N):
    # the ViT case: q, k, v strided views of one qkv tensor, scale 1/8 (a power of two, which the fused path
    # applies inside its GEMMs): the same bits as the unfused DINO lines with the same normaliser, in autograd
    torch.manual_seed(N)
    B, H, d = 2, 3, 64
    qkv = torch.randn(B, N, 3, H, d)
    g = torch.randn(B, H, N, d)
    results = []
    for fused in (True, False):
        x = qkv.clone().requires_grad_()
        q, k, v = x.permute(2, 0, 3, 1, 4).unbind(0)
        if fused:
            out = ef.sparse_attention(q, k, v, d ** -0.5, name, backend=backend)
        else:
            out = getattr(ef, name)((q @ k.transpose(-2, -1)) * d ** -0.5, dim=-1, backend=backend) @ v
        out.backward(g)
        results.append((out.detach(), x.grad))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_sparse_attention_saves_no_probabilities(backend):
    # memory like fused softmax: q, k, v (contiguous copies; the qkv output they replace is freed) and 2
    # numbers per query row
    q, k, v = (torch.randn(2, 3, 20, 8, requires_grad=True) for _ in range(3))
    out = ef.sparse_attention(q, k, v, 0.3, backend=backend)
    shapes = [tuple(t.shape) for t in out.grad_fn.saved_tensors]
    assert shapes == [(2, 3, 20, 8)] * 3 + [(2 * 3 * 20, 2)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(OPS))
def test_sparse_attention_gradcheck_and_half(backend, name):
    torch.manual_seed(5)
    q, k, v = (torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    attention = partial(ef.sparse_attention, scale=0.7, kind=name, backend=backend)
    assert torch.autograd.gradcheck(lambda a, b, c: attention(a, b, c), (q, k, v), eps=1e-6, atol=1e-7)
    qh, kh, vh = (t.detach().to(torch.bfloat16).requires_grad_() for t in (q, k, v))
    out = attention(qh, kh, vh)
    out.sum().backward()
    assert out.dtype == torch.float32 and qh.grad.dtype == torch.bfloat16
    torch.testing.assert_close(out, _attention_ref(*(t.detach().float() for t in (qh, kh, vh)), 0.7, name),
                               atol=TOL, rtol=0)
    grads = [t.grad.clone() for t in (qh, kh, vh)]
    for t in (qh, kh, vh):
        t.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):  # fp32 inside regardless
        out_amp = attention(qh, kh, vh)
        out_amp.sum().backward()
    torch.testing.assert_close(out_amp, out, atol=0, rtol=0)
    for g, t in zip(grads, (qh, kh, vh)):
        torch.testing.assert_close(t.grad, g, atol=0, rtol=0)
    with pytest.raises(ValueError, match="entmax15' or 'sparsemax"):
        ef.sparse_attention(q, k, v, 0.7, "softmax")


@pytest.mark.slow
def test_bench_quick_smoke(tmp_path):
    """`make bench ARGS=--quick`: the attention comparison runs in its own process and lands in the JSON."""
    import json

    from bench import run as bench_run
    from bench.harness import ratio_table
    out = tmp_path / "results.json"
    assert bench_run.main(["--quick", "--only", "attention", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    (att,) = res["results"]
    names = {r["name"].split(": ", 1)[1]: r for r in att["rows"] if r["name"].startswith("ViT")}
    assert names["softmax (fused SDPA)"]["ratio"] == 1.0
    for r in att["rows"]:
        if r["unit"] == "ms":
            assert r["value"] > 0 and r["ratio"] > 0
    mem = [r for r in att["rows"] if r["unit"] == "MiB"]
    assert len(mem) == 2 and all(r["value"] is not None for r in mem), mem
    assert res["machine"]["cores"] >= 1 and "table" not in res
    other = [{"comparison": "multicrop", "error": "exit code 1 (its stderr is above)", "rows": []},
             {"comparison": "probe_cache", "rows": [{"epoch": 2, "seconds": 0.5, "ratio_to_first": 0.25}]}]
    table = ratio_table(res["results"] + other).splitlines()
    assert any("entmax15 fast, C++ kernel" in line for line in table)
    assert any("multicrop" in line and "exit code 1" in line for line in table)
    (pc,) = [line.split() for line in table if line.startswith("probe_cache")]
    assert pc[1:] == ["epoch=2", "0.500", "seconds", "0.250"]  # rows without name/value shown from their fields
