"""backbones/linear.py: the blocks' linear layers on oneDNN's fp32 GEMM, against float64 products computed here."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import backbones
from backbones import linear as L


def _close(got, ref, name):
    # fp32 GEMM rounding: relative to the largest value (K up to 300 terms here)
    err = (got.double() - ref).abs().max().item() / ref.abs().max().item()
    assert err < 2e-6, f"{name}: {err:.2e}"


# the input as the layer meets it: a view of a float64-representable leaf ``base``, so the float64 reference
# differentiates the very same view
INPUTS = {
    "2d": ((7, 24), lambda b: b),
    "3d": ((3, 50, 24), lambda b: b),
    "3d-long": ((2, 300, 24), lambda b: b),
    "element-strided": ((3, 50, 48), lambda b: b[..., ::2]),
    "row-strided": ((2, 60, 24), lambda b: b[:, ::3]),          # rows 3 apart: (2, 20, 24)
    "row-padded": ((40, 32), lambda b: b[:, 4:28]),             # row stride 32 > 24 columns
    "transposed": ((24, 9), lambda b: b.t()),                   # (9, 24), column-major
    "transposed-3d": ((4, 24, 6), lambda b: b.transpose(1, 2)),  # (4, 6, 24)
    "expanded": ((1, 24), lambda b: b.expand(11, 24)),          # stride-0 rows
    "expanded-3d": ((24,), lambda b: b.expand(2, 5, 24)),
}
GRADS = {"dense": lambda y: torch.randn_like(y),
         "stride0-rows": lambda y: torch.randn(y.shape[-1]).expand_as(y),  # what .sum(dim) sends back
         "stride0-all": lambda y: torch.ones(()).expand_as(y)}             # what .sum() sends back


@pytest.mark.parametrize("grad", list(GRADS))
@pytest.mark.parametrize("kind", list(INPUTS))
@pytest.mark.parametrize("bias", [True, False])
def test_onednn_linear_values_and_gradients_equal_float64(kind, grad, bias, monkeypatch):
    calls = []
    gemm = L._gemm
    monkeypatch.setattr(L, "_gemm", lambda *a: calls.append(a[0].shape) or gemm(*a))
    torch.manual_seed(0)
    lin = L.FastLinear(24, 40, bias=bias, backend="onednn")
    shape, view = INPUTS[kind]
    base = torch.randn(shape, requires_grad=True)
    y = lin(view(base))
    dy = GRADS[grad](y)
    y.backward(dy)
    # float64 reference: torch's own autograd through the same view and F.linear, nothing of backbones/linear.py
    base64 = base.detach().double().requires_grad_(True)
    w64 = lin.weight.detach().double().requires_grad_(True)
    b64 = lin.bias.detach().double().requires_grad_(True) if bias else None
    y64 = nn.functional.linear(view(base64), w64, b64)
    y64.backward(dy.double())
    _close(y, y64.detach(), "y")
    _close(base.grad, base64.grad, "dx")
    _close(lin.weight.grad, w64.grad, "dw")
    if bias:
        _close(lin.bias.grad, b64.grad, "db")
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
    monkeypatch.delenv(L.ENV, raising=False)
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


@pytest.mark.parametrize("vendor", ["AuthenticAMD", "GenuineIntel"])
def test_environment_variable_overrides_auto_on_every_vendor(vendor, monkeypatch):
    monkeypatch.setattr(L.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(L, "_cpu_vendor", lambda: vendor)
    for forced in ("aten", "onednn"):
        monkeypatch.setenv(L.ENV, forced)
        assert L.resolve("auto") == forced
        assert L.FastLinear(4, 2).backend == forced
        assert L.resolve("aten") == "aten" and L.resolve("onednn") == "onednn"  # an explicit choice stays
    monkeypatch.setenv(L.ENV, "mkl")
    with pytest.raises(ValueError, match="TOKENMIX_LINEAR_BACKEND='mkl': valid values are aten and onednn"):
        L.resolve("auto")


def test_checkpoint_records_the_resolved_backend_and_a_resume_under_another_warns():
    from backbones.checkpoint import DINO, check_resume_config, runtime_record, write_entry
    models = {b: backbones.create_vit("vit_test_patch8", "softmax", linear_backend=b) for b in ("aten", "onednn")}
    assert {b: runtime_record(m) for b, m in models.items()} == {b: {"linear_backend": b} for b in models}
    ck: dict = {}
    entry = write_entry(ck, models["onednn"].backbone_config, kind=DINO, runtime=runtime_record(models["onednn"]))
    assert entry["runtime"] == {"linear_backend": "onednn"} and "linear_backend" not in entry["backbone"]
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same backend: silent
        check_resume_config(ck, models["onednn"].backbone_config, DINO, runtime=runtime_record(models["onednn"]))
    with pytest.warns(UserWarning, match="linear_backend=onednn under linear_backend=aten"):
        check_resume_config(ck, models["aten"].backbone_config, DINO, runtime=runtime_record(models["aten"]))


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
    out, out_ref = model(x), ref(x)
    torch.testing.assert_close(out, out_ref, rtol=0, atol=1e-5)
    # and the gradients of every parameter (the blocks' linears: oneDNN's dx and dW, through the whole ViT)
    dy = torch.randn_like(out)
    out.backward(dy)
    out_ref.backward(dy)
    grads = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        if p.grad is not None or grads[name].grad is not None:
            torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-4, atol=1e-5, msg=name)
