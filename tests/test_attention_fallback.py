"""The mixed-precision fallback of sparse attention, where no Triton kernel runs (CPU): both attention matmuls
under autocast in bf16, the normaliser in fp32. Needs no Triton (it is not behind the kernel tests' import)."""
from __future__ import annotations

import entmax
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

_REF = {"entmax15": entmax.entmax15, "sparsemax": entmax.sparsemax}


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
