"""backbones/linear.py: the blocks' linear layers on oneDNN's fp32 GEMM, against float64 products computed here."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import backbones
from backbones import linear as L


def _reference(x, w, b, dy):
    """Float64 forward and gradients of y = x w^T + b, written out."""
    xd, wd, dyd = x.double(), w.double(), dy.double()
    y = xd @ wd.T + (0 if b is None else b.double())
    dy2, x2 = dyd.reshape(-1, dyd.shape[-1]), xd.reshape(-1, xd.shape[-1])
    return y, dyd @ wd, dy2.T @ x2, dy2.sum(0)


def _close(got, ref, name):
    # fp32 GEMM rounding: relative to the largest value (K up to 300 terms here)
    err = (got.double() - ref).abs().max().item() / ref.abs().max().item()
    assert err < 2e-6, f"{name}: {err:.2e}"


@pytest.mark.parametrize("shape,bias,strided", [((7, 24), True, False), ((3, 50, 24), True, True),
                                               ((2, 300, 24), False, False)])
def test_onednn_linear_forward_and_gradients_equal_float64(shape, bias, strided, monkeypatch):
    calls = []
    gemm = L._gemm
    monkeypatch.setattr(L, "_gemm", lambda *a: calls.append(a[0].shape) or gemm(*a))
    torch.manual_seed(0)
    lin = L.FastLinear(24, 40, bias=bias, backend="onednn")
    x = torch.randn(*shape[:-1], 2 * shape[-1])[..., ::2] if strided else torch.randn(shape)  # a strided view
    x.requires_grad_(True)
    y = lin(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    ref_y, ref_dx, ref_dw, ref_db = _reference(x.detach(), lin.weight.detach(), lin.bias, dy)
    _close(y, ref_y, "y")
    _close(x.grad, ref_dx, "dx")
    _close(lin.weight.grad, ref_dw, "dw")
    if bias:
        _close(lin.bias.grad, ref_db, "db")
    else:
        assert lin.bias is None
    assert len(calls) == 3  # forward, input gradient, weight gradient: all three by oneDNN


def test_onednn_linear_skips_the_gradients_nobody_needs(monkeypatch):
    calls = []
    gemm = L._gemm
    monkeypatch.setattr(L, "_gemm", lambda *a: calls.append(1) or gemm(*a))
    lin = L.FastLinear(8, 4, backend="onednn")
    lin.weight.requires_grad_(False)
    x = torch.randn(5, 8, requires_grad=True)
    lin(x).sum().backward()
    assert len(calls) == 2 and lin.weight.grad is None and lin.bias.grad is not None  # no weight-gradient GEMM


def test_where_onednn_does_not_apply_it_is_plain_f_linear(monkeypatch):
    monkeypatch.setattr(L, "_gemm", lambda *a: pytest.fail("oneDNN used"))
    torch.manual_seed(0)
    lin = L.FastLinear(8, 4, backend="onednn")
    x = torch.randn(3, 8)
    assert torch.equal(lin.double()(x.double()), nn.functional.linear(x.double(), lin.weight, lin.bias))
    lin.float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert lin(x).dtype == torch.bfloat16  # autocast decides, as for nn.Linear
    aten = L.FastLinear(8, 4, backend="aten")
    assert torch.equal(aten(x), nn.functional.linear(x, aten.weight, aten.bias))


def test_backend_names_and_the_automatic_choice(monkeypatch):
    with pytest.raises(ValueError, match="valid: auto, aten, onednn"):
        L.resolve("mkl")
    assert L.resolve("aten") == "aten" and L.resolve("onednn") == "onednn"
    monkeypatch.setattr(L.platform, "machine", lambda: "x86_64")
    for vendor, want in (("AuthenticAMD", "onednn"), ("GenuineIntel", "aten"), ("", "aten")):
        monkeypatch.setattr(L, "_cpu_vendor", lambda v=vendor: v)
        assert L.resolve("auto") == want, vendor
    monkeypatch.setattr(L.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(L, "_cpu_vendor", lambda: "AuthenticAMD")
    assert L.resolve("auto") == "aten"


def test_vit_blocks_use_fast_linears_with_the_same_parameters_and_keys():
    torch.manual_seed(0)
    plain_keys = set(backbones.create_vit("vit_test_patch8", "specialization", linear_backend="aten").state_dict())
    model = backbones.create_vit("vit_test_patch8", "specialization", linear_backend="onednn")
    assert set(model.state_dict()) == plain_keys
    block_linears = [m for m in model.blocks.modules() if isinstance(m, nn.Linear)]
    assert block_linears and all(isinstance(m, L.FastLinear) and m.backend == "onednn" for m in block_linears)
    assert model.blocks[0].attn.qkv_cls is not None and isinstance(model.blocks[0].attn.qkv_cls, L.FastLinear)
    params = {id(p) for p in model.parameters()}
    assert all(id(m.weight) in params for m in block_linears)  # the layers hold the model's own parameters
    # the whole model on oneDNN against the same weights on torch's default GEMM
    ref = backbones.create_vit("vit_test_patch8", "specialization", linear_backend="aten")
    ref.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model(x), ref(x), rtol=0, atol=1e-5)
