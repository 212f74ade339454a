"""Backbone: DINO equivalence, the attention normalisers and the global-token strategies."""
import math

import entmax
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import backbones
from backbones.attention import TokenMixAttention
from backbones.lastvit import FrequencyTopKPooling, gaussian_window
from backbones.normalizers import build_normalizer


def _layernorm(x, sd, p):
    return F.layer_norm(x, x.shape[-1:], sd[p + ".weight"], sd[p + ".bias"], eps=1e-6)


def dino_reference_forward(sd, x, heads, patch, n_last):
    """Independent ViT forward written from DINO's vision_transformer.py structure, on a raw state dict."""
    B = x.shape[0]
    t = F.conv2d(x, sd["patch_embed.proj.weight"], sd["patch_embed.proj.bias"], stride=patch)
    gh, gw = t.shape[-2:]
    t = t.flatten(2).transpose(1, 2)
    t = torch.cat([sd["cls_token"].expand(B, -1, -1), t], 1)
    pos = sd["pos_embed"]
    side = int(math.sqrt(pos.shape[1] - 1))
    if (gh, gw) != (side, side):
        pp = pos[:, 1:].reshape(1, side, side, -1).permute(0, 3, 1, 2)
        pp = F.interpolate(pp, scale_factor=((gh + 0.1) / side, (gw + 0.1) / side), mode="bicubic")
        pos = torch.cat([pos[:, :1], pp.permute(0, 2, 3, 1).reshape(1, gh * gw, -1)], 1)
    t = t + pos
    depth = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
    outs = []
    for i in range(depth):
        p = f"blocks.{i}."
        h = _layernorm(t, sd, p + "norm1")
        qkv = F.linear(h, sd[p + "attn.qkv.weight"], sd[p + "attn.qkv.bias"])
        N, C = t.shape[1], t.shape[2]
        q, k, v = qkv.reshape(B, N, 3, heads, C // heads).permute(2, 0, 3, 1, 4)
        a = ((q @ k.transpose(-2, -1)) * (C // heads) ** -0.5).softmax(-1)
        t = t + F.linear((a @ v).transpose(1, 2).reshape(B, N, C), sd[p + "attn.proj.weight"], sd[p + "attn.proj.bias"])
        h = _layernorm(t, sd, p + "norm2")
        h = F.linear(F.gelu(F.linear(h, sd[p + "mlp.fc1.weight"], sd[p + "mlp.fc1.bias"])),
                     sd[p + "mlp.fc2.weight"], sd[p + "mlp.fc2.bias"])
        t = t + h
        if i >= depth - n_last:
            outs.append(_layernorm(t, sd, "norm"))
    return outs


def official_vit_small_keys():
    keys = ["cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias", "norm.weight", "norm.bias"]
    for i in range(12):
        for m in ("norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1", "mlp.fc2"):
            keys += [f"blocks.{i}.{m}.weight", f"blocks.{i}.{m}.bias"]
    return set(keys)


@pytest.fixture(scope="module")
def vit_s():
    torch.manual_seed(0)
    return backbones.create_vit("vit_small_patch16", "softmax").eval()


@pytest.mark.parametrize("size", [(224, 224), (96, 96)])
def test_softmax_vit_s16_matches_dino_forward(vit_s, size):
    sd = {k: v.detach().clone() for k, v in vit_s.state_dict().items()}
    for k in sd:  # non-trivial LayerNorm/bias values so the comparison covers them
        if k.endswith("bias") or "norm" in k:
            sd[k] += 0.1 * torch.randn_like(sd[k])
    vit_s.load_state_dict(sd)
    x = torch.randn(2, 3, *size)
    with torch.no_grad():
        ref = dino_reference_forward(sd, x, heads=6, patch=16, n_last=4)
        ours = vit_s.extract(x, n_last_blocks=4)
    assert len(ours) == 4
    for r, o in zip(ref, ours):
        assert torch.allclose(r[:, 0], o["cls"], atol=1e-4)
        assert torch.allclose(r[:, 1:], o["patch"], atol=1e-4)
    assert torch.allclose(vit_s(x), ours[-1]["cls"], atol=1e-6)


def test_official_released_format_loads_without_missing_or_unexpected(vit_s, tmp_path):
    sd = vit_s.state_dict()
    assert set(sd) == official_vit_small_keys()
    path = tmp_path / "dino_deitsmall16_pretrain.pth"
    torch.save({k: v.clone() + 1.0 for k, v in sd.items()}, path)
    fresh = backbones.create_vit("vit_small_patch16", "softmax")
    assert backbones.load_checkpoint(fresh, path) == {"missing": [], "unexpected": []}
    assert torch.equal(fresh.norm.weight, sd["norm.weight"] + 1.0)
    inferred = backbones.backbone_from_checkpoint(path)
    assert (inferred.arch, inferred.variant) == ("vit_small_patch16", "softmax")


def test_official_training_checkpoint_teacher_by_default(tmp_path):
    model = backbones.create_vit("vit_test_patch8", "softmax")
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    student = {f"module.backbone.{k}": v + 1 for k, v in sd.items()}
    student["module.head.last_layer.weight_g"] = torch.ones(4, 1)
    teacher = {f"backbone.{k}": v + 2 for k, v in sd.items()}
    teacher["head.mlp.0.weight"] = torch.ones(4, 32)
    path = tmp_path / "checkpoint.pth"
    torch.save({"student": student, "teacher": teacher, "epoch": 3}, path)
    assert backbones.load_checkpoint(model, path) == {"missing": [], "unexpected": []}
    assert torch.equal(model.cls_token, sd["cls_token"] + 2)
    backbones.load_checkpoint(model, path, which="student")
    assert torch.equal(model.cls_token, sd["cls_token"] + 1)


def _qk_logits(attn_module, x):
    B, N, _ = x.shape
    qkv = attn_module._qkv(x).reshape(B, N, 3, attn_module.num_heads, attn_module.head_dim).permute(2, 0, 3, 1, 4)
    return (qkv[0] @ qkv[1].transpose(-2, -1)) * attn_module.scale


def test_entmax15_attention_equals_entmax_library_and_is_sparse():
    torch.manual_seed(0)
    model = backbones.create_vit("vit_small_patch16", "entmax").eval()
    x = torch.randn(1, 3, 224, 224)
    captured = {}
    model.blocks[0].register_forward_pre_hook(lambda m, a: captured.setdefault("in", a[0]))
    attn = model.attention_maps(x, blocks=[0])[0]
    blk = model.blocks[0]
    with torch.no_grad():
        expected = entmax.entmax15(_qk_logits(blk.attn, blk.norm1(captured["in"])), dim=-1)
    assert torch.allclose(attn, expected, atol=1e-6)
    assert torch.allclose(attn.sum(-1), torch.ones_like(attn.sum(-1)), atol=1e-5)
    zero_share = (attn == 0).float().mean().item()
    print(f"entmax15 ViT-S/16 block 0 at init: {100 * zero_share:.1f}% exact zeros "
          f"(entmax library: {100 * (expected == 0).float().mean().item():.1f}%)")
    # the same support as the library's exact (sort-based) entmax-1.5: an entry may differ only where both are
    # within rounding of the threshold
    differ = (attn == 0) != (expected == 0)
    assert zero_share > 0 and bool((expected[differ] < 1e-6).all() and (attn[differ] < 1e-6).all())
    assert differ.float().mean().item() < 1e-4, differ.float().mean().item()


@pytest.mark.parametrize("variant", ["entmax", "sparsemax", "entmax_bisect"])
def test_sparse_attention_gradcheck_float64(variant):
    torch.manual_seed(0)
    layer = TokenMixAttention(8, num_heads=2, qkv_bias=True,
                              normalizer=backbones.parse_variant(variant).normalizer).double()
    x = torch.randn(1, 5, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(layer, (x,), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("variant", ["softmax", "entmax", "sparsemax"])
def test_explicit_attention_path_equals_fused_path(variant):
    torch.manual_seed(0)
    model = backbones.create_vit("vit_test_patch8", variant).eval()
    x = torch.randn(2, 3, 32, 32, requires_grad=True)
    fused = model(x)
    (g_fused,) = torch.autograd.grad(fused.square().sum(), x)
    for blk in model.blocks:
        blk.attn.record = True  # forces the explicit (q @ k^T) * scale -> normaliser -> @ v lines
    explicit = model(x)
    (g_explicit,) = torch.autograd.grad(explicit.square().sum(), x)
    assert torch.allclose(fused, explicit, atol=1e-5)
    assert torch.allclose(g_fused, g_explicit, atol=1e-5)


@pytest.mark.parametrize("name,ref", [("entmax15", entmax.entmax15), ("sparsemax", entmax.sparsemax)])
def test_sparse_normaliser_runs_in_fp32_under_autocast(name, ref, monkeypatch):
    """Decisive on a fixed input: the bf16 result must be the fp32 result rounded once, bit for bit. The same op
    computed in bf16 misses that on this input (checked below), so a bf16-only normaliser cannot pass."""
    s = (torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 3).bfloat16()
    expected = ref(s.float(), dim=-1).bfloat16()
    assert not torch.equal(ref(s, dim=-1), expected)  # computing in bf16 is distinguishable here
    from backbones import entmax_fast
    seen = []
    op = getattr(entmax_fast, name)
    monkeypatch.setattr(entmax_fast, name, lambda x, dim, **kw: seen.append((x.dtype, torch.is_autocast_enabled("cpu")))
                        or op(x, dim=dim, **kw))
    norm = build_normalizer(name)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = norm(s)
    assert out.dtype == torch.bfloat16 and torch.equal(out, expected)
    assert seen == [(torch.float32, False)]


def test_registers_add_n_times_d_parameters_and_never_leak():
    plain = backbones.create_vit("vit_small_patch16", "softmax")
    reg = backbones.create_vit("vit_small_patch16", "registers")
    n_plain = sum(p.numel() for p in plain.parameters())
    n_reg = sum(p.numel() for p in reg.parameters())
    assert n_reg - n_plain == 4 * 384
    assert reg.reg_token.std().item() < 1e-5  # DINOv2 init N(0, 1e-6)
    small = backbones.create_vit("vit_test_patch8", "registers", num_registers=3).eval()
    with torch.no_grad():
        small.reg_token.normal_(std=5.0)  # make registers distinctive
        x = torch.randn(2, 3, 40, 32)
        tokens = small.forward_features(x)
        out = small.extract(x)[-1]
    assert tokens.shape[1] == 1 + 3 + 20
    assert out["patch"].shape == (2, 20, 32)
    assert torch.equal(out["patch"], tokens[:, 4:]) and torch.equal(out["cls"], tokens[:, 0])
    # forward runs only [CLS] as the last block's query (backbones/block.py): the same values up to rounding
    with torch.no_grad():
        cls = small(x)
    torch.testing.assert_close(cls, tokens[:, 0], rtol=0, atol=1e-6)
    assert all((cls - tokens[:, r]).abs().max() > 0.1 for r in (1, 2, 3))  # not a register's output


def test_specialization_adds_parameters_only_where_specialised():
    plain = backbones.create_vit("vit_small_patch16", "softmax")
    spec = backbones.create_vit("vit_small_patch16", "specialization", spec_blocks=[0, 2])
    extra = {k: v.numel() for k, v in spec.named_parameters() if k not in dict(plain.named_parameters())}
    assert set(extra) == {f"blocks.{i}.{n}" for i in (0, 2) for n in
                          ("norm1_cls.weight", "norm1_cls.bias", "norm2_cls.weight", "norm2_cls.bias",
                           "attn.qkv_cls.weight", "attn.qkv_cls.bias")}
    assert sum(extra.values()) == 2 * (4 * 384 + 384 * 1152 + 1152)
    default = backbones.create_vit("vit_small_patch16", "specialization")
    ratio = sum(p.numel() for p in default.parameters()) / sum(p.numel() for p in plain.parameters()) - 1
    assert 0.07 < ratio < 0.09  # the paper: about 8% more parameters


def test_specialization_cls_and_patches_really_use_different_parameters():
    torch.manual_seed(0)
    model = backbones.create_vit("vit_test_patch8", "specialization", spec_blocks=[0]).eval()
    blk = model.blocks[0]
    seen = {}
    blk.attn.register_forward_pre_hook(lambda m, a: seen.__setitem__("attn_in", a[0]))
    blk.attn.qkv_cls.register_forward_hook(lambda m, a, o: seen.__setitem__("cls_qkv_in", a[0]))
    blk.attn.qkv.register_forward_hook(lambda m, a, o: seen.__setitem__("patch_qkv_in", a[0]))
    with torch.no_grad():
        blk.norm1_cls.weight.zero_()
        blk.norm1_cls.bias.fill_(0.5)
        model(torch.randn(2, 3, 32, 32))
    assert torch.equal(seen["attn_in"][:, 0], torch.full((2, 32), 0.5))  # [CLS] went through norm1_cls
    assert not torch.allclose(seen["attn_in"][:, 1:], torch.full_like(seen["attn_in"][:, 1:], 0.5))
    assert seen["cls_qkv_in"].shape[1] == 1 and seen["patch_qkv_in"].shape[1] == 16
    # with the [CLS] copies set equal to the shared parameters it is exactly the plain ViT
    fresh = backbones.create_vit("vit_test_patch8", "specialization", spec_blocks=[0]).eval()
    plain = backbones.create_vit("vit_test_patch8", "softmax").eval()
    missing, unexpected = plain.load_state_dict(fresh.state_dict(), strict=False)
    assert not missing and len(unexpected) == 6
    x = torch.randn(1, 3, 32, 32)
    assert not torch.allclose(plain(x), fresh(x), atol=1e-4)
    b = fresh.blocks[0]
    b.norm1_cls.load_state_dict(b.norm1.state_dict())
    b.norm2_cls.load_state_dict(b.norm2.state_dict())
    b.attn.qkv_cls.load_state_dict(b.attn.qkv.state_dict())
    assert torch.allclose(plain(x), fresh(x), atol=1e-6)


def lastvit_reference(x: np.ndarray, k: int, sigma: float):
    """Independent numpy version: the Gaussian window indexed by signed frequency (fftfreq order)."""
    D = x.shape[-1]
    n = np.fft.fftfreq(D) * D
    low = np.fft.ifft(np.fft.fft(x, axis=-1) * np.exp(-0.5 * (n / sigma) ** 2), axis=-1).real
    score = x / (np.abs(low - x) + 1e-6)
    B, N, _ = x.shape
    cls = np.zeros((B, D))
    votes = np.zeros((B, N), dtype=int)
    for b in range(B):
        for c in range(D):
            top = np.argsort(-score[b, :, c], kind="stable")[:k]
            cls[b, c] = x[b, top, c].mean()
            votes[b, top] += 1
    return cls, votes


@pytest.mark.parametrize("k", [1, 3])
def test_lastvit_matches_formula(k):
    torch.manual_seed(0)
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    pool = FrequencyTopKPooling(16, k=k)
    cls, votes = pool(x)
    ref_cls, ref_votes = lastvit_reference(x.numpy(), k, math.sqrt(16))
    np.testing.assert_allclose(cls.numpy(), ref_cls, atol=1e-6)
    np.testing.assert_array_equal(votes.numpy(), ref_votes)
    assert votes.sum(1).tolist() == [16 * k, 16 * k]


def test_lastvit_hand_checkable_and_gradient_flows_through_selection():
    # constant channels have zero high-frequency content except where a patch is perturbed; the window's
    # peak sits on DC so a constant token is its own low-pass and its score explodes (x / eps)
    assert gaussian_window(8, 2.0)[4] == 1.0 and gaussian_window(8, 2.0)[3] < 1.0
    x = torch.randn(1, 4, 8)
    x[0, 2] = 1.0  # a perfectly smooth (constant) token: L == X, every channel picks it
    x.requires_grad_(True)
    cls, votes = FrequencyTopKPooling(8, k=1)(x)
    assert votes.tolist() == [[0, 0, 8, 0]]
    assert torch.allclose(cls, torch.ones(1, 8))
    cls.sum().backward()
    assert x.grad[0, 2].abs().sum() > 0 and x.grad[0, [0, 1, 3]].abs().sum() == 0


def test_lastvit_cls_is_the_aggregated_token():
    torch.manual_seed(0)
    model = backbones.create_vit("vit_test_patch8", "lastvit", lastvit_k=2).eval()
    x = torch.randn(2, 3, 32, 32)
    out = model.extract(x, n_last_blocks=2, votes=True)
    expected, votes = model.aggregator(out[-1]["patch"])
    assert torch.equal(out[-1]["cls"], expected) and torch.equal(out[-1]["votes"], votes)
    assert torch.equal(model(x), expected)
    tokens = model.forward_features(x)
    assert torch.equal(out[0]["cls"], model.norm(model.blocks[0](model._pos_embed(model.patch_embed(x))))[:, 0])
    assert not torch.allclose(model(x), tokens[:, 0])


PAPER_VARIANTS = ["softmax", "entmax", "registers", "specialization", "lastvit"]


@pytest.mark.parametrize("variant", PAPER_VARIANTS)
def test_vit_s16_variants_forward_backward_224_and_96(variant):
    torch.manual_seed(0)
    model = backbones.create_vit("vit_small_patch16", variant, drop_path_rate=0.1)
    for size in (224, 96):
        x = torch.randn(1, 3, size, size)
        out = model(x)
        assert out.shape == (1, 384) and torch.isfinite(out).all()
        out.square().mean().backward()
        # every parameter gets a gradient, registers included (they reach [CLS] through attention); values
        # may be 0 where drop path dropped a branch for this one image
        missing = [n for n, p in model.named_parameters() if p.grad is None]
        assert not missing, missing
        if variant == "registers":
            assert model.reg_token.grad.abs().sum() > 0
        model.zero_grad()


@pytest.mark.parametrize("variant", backbones.VARIANTS)
def test_every_variant_runs_both_crop_sizes(variant):
    model = backbones.create_vit("vit_test_patch8", variant)
    for size in (32, 16):
        out = model(torch.randn(2, 3, size, size))
        out.sum().backward()
        assert out.shape == (2, 32)


def test_unknown_names_list_valid_ones():
    with pytest.raises(ValueError, match="Valid variants: softmax, entmax"):
        backbones.create_vit("vit_test_patch8", "entmax2")
    with pytest.raises(ValueError, match="vit_small_patch16"):
        backbones.create_vit("vit_huge_patch3", "softmax")
    assert backbones.parse_variant("lastvit+entmax15").name == "entmax+lastvit"
    assert set(PAPER_VARIANTS) <= set(backbones.VARIANTS)


def test_seeded_creation_leaves_the_global_rng_alone():
    torch.manual_seed(3)
    expected = backbones.create_vit("vit_test_patch8", "registers").state_dict()  # the old way: seed, then build
    torch.manual_seed(123)
    before = torch.get_rng_state()
    m = backbones.create_vit("vit_test_patch8", "registers", seed=3)
    assert torch.equal(torch.get_rng_state(), before)
    assert all(torch.equal(v, expected[k]) for k, v in m.state_dict().items())
