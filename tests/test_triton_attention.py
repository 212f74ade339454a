"""The Triton sparse-attention kernel (run by Triton's CPU interpreter here) and the mixed-precision fallback.

Reference: the ``entmax`` library (sort-based entmax15 / sparsemax) on the unfused float64 scores.

The interpreter must be chosen before Triton is first imported (triton.language's own helpers are decorated
at import). Run alone, this module sets TRITON_INTERPRET=1 first. In the full suite timm has already
imported Triton in compiled mode: the kernel tests then skip here and ``test_kernels_in_subprocess`` runs
this file in a fresh process with TRITON_INTERPRET=1, so no other test's Triton is switched to the interpreter.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import entmax
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

_PRELOADED = "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1"
if not _PRELOADED:
    os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton")
from backbones import triton_attention as ta  # noqa: E402

_REF = {"entmax15": entmax.entmax15, "sparsemax": entmax.sparsemax}
kernel = pytest.mark.skipif(_PRELOADED, reason="Triton already imported in compiled mode: "
                            "test_kernels_in_subprocess runs these under the interpreter")


@pytest.mark.skipif(not _PRELOADED, reason="the kernel tests run directly in this process")
@pytest.mark.timeout(900)
def test_kernels_in_subprocess():
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(
        [str(root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
                           "-k", "not subprocess and not fallback and not compile and not gpu_check"],
                          cwd=root, env=env,
                          capture_output=True, text=True, timeout=880)
    assert proc.returncode == 0 and " passed" in proc.stdout and "skipped" not in proc.stdout, \
        proc.stdout[-6000:] + proc.stderr[-3000:]


def _qkv(b, h, n, d, dtype, seed=0, spread=1.5):
    g = torch.Generator().manual_seed(seed)
    # values representable in `dtype`, so kernel and reference see the same inputs
    return [(torch.randn(b, h, n, d, generator=g, dtype=torch.float64) * spread).to(dtype) for _ in range(3)]


def _errors(kind, q, k, v, scale):
    """Max abs error of the kernel's output and q/k/v gradients against the float64 reference, and the
    reference's magnitudes."""
    qk = [x.clone().requires_grad_() for x in (q, k, v)]
    out = ta.sparse_attention(*qk, scale, kind=kind)
    assert out.dtype == q.dtype and out.shape == v.shape[:-2] + (q.shape[-2], v.shape[-1])
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out.backward(grad.to(out.dtype))
    ref_in = [x.double().requires_grad_() for x in (q, k, v)]
    ref = _REF[kind]((ref_in[0] @ ref_in[1].transpose(-2, -1)) * scale, dim=-1) @ ref_in[2]
    ref.backward(grad)
    errs = [(out.double() - ref).abs().max().item()] + \
           [(a.grad.double() - b.grad).abs().max().item() for a, b in zip(qk, ref_in)]
    mags = [ref.abs().max().item()] + [b.grad.abs().max().item() for b in ref_in]
    return errs, mags


@kernel
def test_interpreter_is_used():
    assert ta.interpreted() and ta.available(torch.zeros(1))


@kernel
@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["entmax15", "sparsemax"])
@pytest.mark.parametrize("n,d", [(37, 32), (50, 64), (197, 64)])
def test_fp32_values_and_grads_match_entmax(kind, n, d):
    q, k, v = _qkv(1, 2 if n < 100 else 1, n, d, torch.float32)
    errs, _ = _errors(kind, q, k, v, d ** -0.5)
    assert max(errs) < 1e-4, errs


@kernel
@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["entmax15", "sparsemax"])
def test_multi_block_rows_match_entmax(kind, monkeypatch):
    """Rows longer than one key block (ViT-S/8's 785 tokens): the threshold search sums over blocks."""
    monkeypatch.setattr(ta, "_SINGLE_MAX", 16)  # force the block-wise path on a short sequence
    q, k, v = _qkv(1, 2, 100, 32, torch.float32, seed=3)  # 2 key blocks of 64, the last one ragged
    errs, _ = _errors(kind, q, k, v, 32 ** -0.5)
    assert max(errs) < 1e-4, errs


@kernel
@pytest.mark.timeout(300)
@pytest.mark.parametrize("dtype,tol", [(torch.float16, 3e-3), (torch.bfloat16, 2.5e-2)])
@pytest.mark.parametrize("kind", ["entmax15", "sparsemax"])
def test_half_precision_within_dtype_tolerance(dtype, tol, kind):
    """16-bit q, k, v: fp32 accumulation and threshold; p and ds are rounded to the input dtype for the
    tensor-core products (as FlashAttention does), so the error is a few units of that dtype's rounding."""
    q, k, v = _qkv(2, 2, 50, 32, dtype, seed=5)
    errs, mags = _errors(kind, q, k, v, 32 ** -0.5)
    for e, m in zip(errs, mags):
        assert e < tol * m, (errs, mags)


@kernel
@pytest.mark.timeout(300)
def test_peaked_rows_and_cross_attention_shapes():
    """Large logits (supports of 1-3 keys), N != M, d != dv, extra leading dims."""
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 1, 3, 20, 16, generator=g) * 4
    k = torch.randn(2, 1, 3, 45, 16, generator=g) * 4
    v = torch.randn(2, 1, 3, 45, 24, generator=g)
    for kind in ("entmax15", "sparsemax"):
        errs, _ = _errors(kind, q, k, v, 0.25)
        assert max(errs) < 1e-4, (kind, errs)


@kernel
@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["entmax15", "sparsemax"])
def test_tiles_outside_the_support_are_skipped_exactly(kind, monkeypatch):
    """Two groups of 64 tokens that attend only within their group: the off-diagonal 64 x 64 tiles have
    p = 0 everywhere and are skipped (forward block-wise pass, dK/dV and dQ); results still exact."""
    monkeypatch.setattr(ta, "_SINGLE_MAX", 16)
    g = torch.Generator().manual_seed(11)
    group = torch.zeros(128, 2)
    group[:64, 0] = group[64:, 1] = 6.0
    q, k = (torch.cat([group, torch.randn(128, 14, generator=g)], 1)[None, None] for _ in range(2))
    v = torch.randn(1, 1, 128, 16, generator=g)
    errs, _ = _errors(kind, q, k, v, 0.25)
    assert max(errs) < 1e-4, errs


@kernel
def test_bad_input_is_rejected():
    q = torch.zeros(1, 4, 8)
    with pytest.raises(ValueError, match="kind"):
        ta.sparse_attention(q, q, q, 1.0, kind="softmax")
    with pytest.raises(ValueError, match="expects"):
        ta.sparse_attention(q, torch.zeros(1, 4, 9), q, 1.0)
    with pytest.raises(TypeError, match="fp16, bf16 and fp32"):
        ta.sparse_attention(q.double(), q.double(), q.double(), 1.0)
    assert not ta.available(q.double())  # so the model keeps its fp64 path


class _MatmulDtypes(TorchDispatchMode):
    """Records the input dtypes of every matrix product dispatched (forward and backward)."""

    OPS = {"mm", "bmm", "addmm", "baddbmm", "matmul"}

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in self.OPS:
            self.seen.append((name, tuple(a.dtype for a in args if isinstance(a, torch.Tensor))))
        return func(*args, **(kwargs or {}))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["entmax15", "sparsemax"])
def test_autocast_fallback_runs_bf16_matmuls_and_fp32_normaliser(kind, monkeypatch):
    """No kernel (CPU): under autocast both attention matmuls take bf16 inputs, the normaliser gets fp32
    scores, and the layer matches the float64 reference (entmax library) within bf16 rounding."""
    from backbones import entmax_fast
    from backbones.attention import TokenMixAttention

    norm_dtypes = []
    op = getattr(entmax_fast, kind)
    monkeypatch.setattr(entmax_fast, kind, lambda s, dim=-1, **kw: (norm_dtypes.append(s.dtype), op(s, dim=dim, **kw))[1])
    torch.manual_seed(0)
    layer = TokenMixAttention(64, num_heads=2, qkv_bias=True, normalizer=kind)
    x = torch.randn(2, 37, 64) * 2
    xa = x.clone().requires_grad_()
    with _MatmulDtypes() as rec, torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(xa)
        out.float().pow(2).sum().backward()
    assert out.dtype == torch.bfloat16
    assert norm_dtypes == [torch.float32]
    assert rec.seen and all(torch.float32 not in dts for _, dts in rec.seen), rec.seen
    assert sum(name in ("bmm", "matmul") for name, _ in rec.seen) >= 2  # q k^T and p v (forward)

    ref_layer = TokenMixAttention(64, num_heads=2, qkv_bias=True).double()
    ref_layer.load_state_dict(layer.state_dict())
    B, N, C = x.shape
    q, k, v = ref_layer.qkv(x.double()).reshape(B, N, 3, 2, 32).permute(2, 0, 3, 1, 4)
    attn = _REF[kind]((q @ k.transpose(-2, -1)) * ref_layer.scale, dim=-1)
    ref = ref_layer.proj((attn @ v).transpose(1, 2).reshape(B, N, C))
    assert (out.double() - ref).abs().max() < 3e-2 * ref.abs().max()


_COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from backbones import triton_attention as ta
assert not ta.interpreted()
rows = dict(Q="*fp16", K="*fp16", V="*fp16")
fwd = dict(rows, O="*fp16", OG="*fp16", STATS="*fp32", scale="fp32", N="i32", M="i32")
grads = dict(rows, DO="*fp16", OG="*fp16", STATS="*fp32")
bwd = dict(grads, DK="*fp16", DV_="*fp16", scale="fp32", N="i32", M="i32")
bwd_q = dict(grads, DQ="*fp16", scale="fp32", N="i32", M="i32")
meta = dict(D=64, DV=64, BLOCK_M=32, BLOCK_N=256, BLOCK_D=64, BLOCK_DV=64, ENTMAX=True, PREC="tf32")
for fn, sig, consts in ((ta._fwd_kernel, fwd, dict(meta, SINGLE=True, MAX_SWEEPS=64)),
                        (ta._fwd_kernel, fwd, dict(meta, BLOCK_M=64, BLOCK_N=64, SINGLE=False, MAX_SWEEPS=64)),
                        (ta._bwd_kv_kernel, bwd, dict(meta, BLOCK_M=64, BLOCK_N=64)),
                        (ta._bwd_q_kernel, bwd_q, dict(meta, BLOCK_M=64, BLOCK_N=64))):
    sig = dict(sig, **{k: "constexpr" for k in consts})
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=4, num_stages=1))
    assert k.asm["cubin"], fn
print("compiled")
"""


@pytest.mark.timeout(600)
def test_kernels_compile_for_a_gpu_without_one():
    """The interpreter runs the kernels as Python: Triton's compiler (AST -> TTIR -> PTX -> cubin for sm_90,
    ptxas bundled with Triton, no driver needed) catches what the interpreter accepts but a GPU would not
    (loop-carried Python ints, branch types, layouts)."""
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", _COMPILE], cwd=root, env=env, capture_output=True, text=True,
                          timeout=580)
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
@pytest.mark.timeout(120)
def test_gpu_check_skips_cleanly_without_a_gpu(tmp_path):
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--out", str(out)], cwd=root,
                          capture_output=True, text=True, timeout=110,
                          env={**os.environ,
                               "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])})
    assert proc.returncode == 0 and proc.stdout.strip() == "no CUDA GPU: skipped", proc.stdout + proc.stderr
    assert not out.exists()


@pytest.mark.timeout(400)
def test_gpu_check_smoke_runs_every_part_on_cpu(tmp_path):
    """`make gpu-check ARGS=--smoke`: every part of the GPU script on CPU with tiny shapes, so that a session
    with a GPU lent does not find it broken. Part (d) (`bench.dino_step`) fails unless the plain main_dino.py
    step and the module's step give the same step-1 loss."""
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "r.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # (a) is skipped: no kernel on CPU
    env["PYTHONPATH"] = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--smoke", "--out", str(out)], cwd=root,
                          capture_output=True, text=True, timeout=380, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    rows = json.loads(out.read_text())["rows"]
    assert {r["part"] for r in rows} == {"a", "b", "c", "d"}
    steps = {r["variant"].split(" (")[0]: r for r in rows if r["part"] == "d"}
    assert set(steps) == {f"{p} {v}" for p in ("plain", "optimised") for v in ("softmax", "entmax")} | \
        {"optimised entmax vs plain softmax"}
    assert all(r["images_per_s"] > 0 for name, r in steps.items() if "vs" not in name)
    assert all(r["x_plain"] > 0 for r in steps.values())
    assert "| d | DINO step, fp32 | plain softmax" in proc.stdout
