"""The diffusion dial (backbones/diffusion_dial.py) on random small ViTs, no training: at a = 0 the forward is
bitwise the unmodified one; the semantic dial's block input, the lazy dial's planted rows and [CLS] attention row and
the tokens dial's deletion, each computed here by hand from the undialed input and the layer's own weights; the
normalisers come back; every backbone kind the probes build (softmax, entmax-1.5, sparsemax, registers, LaSt-ViT,
specialization, a timm DINOv2-with-registers architecture, a DINOv2 hub file) takes it."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from backbones import create_vit
from backbones.diffusion_dial import default_blocks, dialed_blocks, diffusion_dial
from helpers.dinov2_source import dinov2_source
from official.dinov2 import DinoVisionTransformer

pytestmark = pytest.mark.timeout(120)

VARIANTS = ("softmax", "entmax", "sparsemax", "registers", "lastvit", "specialization", "entmax+registers")


def _images(seed: int = 0, size: int = 40) -> torch.Tensor:  # 5x5 patches: not the native 4x4 grid
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(seed)) * 1.7 + 0.3


def _model(variant: str):
    m = create_vit("vit_test_patch8", variant, seed=3, depth=3).eval()
    with torch.no_grad():  # trained-scale, uneven weights: peaked attention rows (entmax gets exact zeros)
        for blk in m.blocks:
            blk.attn.qkv.weight.mul_(4.0)
    return m


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", ("semantic", "lazy"))
def test_a_zero_is_bitwise_the_unmodified_forward(variant, mode):
    m, x = _model(variant), _images()
    with torch.no_grad():
        ref_cls, ref = m(x), m.extract(x, blocks=[0, 1, 2])
        ref_attn = m.attention_maps(x)
        norms = [blk.attn.normalizer for blk in m.blocks]
        with diffusion_dial(m, 0.0, blocks=3, mode=mode) as d:
            assert d.blocks == [0, 1, 2] and [blk.attn.normalizer for blk in m.blocks] == norms
            cls, out, attn = m(x), m.extract(x, blocks=[0, 1, 2]), m.attention_maps(x)
    assert torch.equal(cls, ref_cls)
    for o, r in zip(out, ref):
        assert torch.equal(o["cls"], r["cls"]) and torch.equal(o["patch"], r["patch"])
    assert all(torch.equal(a, b) for a, b in zip(attn, ref_attn))


def _inputs(m, x, i: int, dial=None):
    """The input of block ``i`` without the dial, and with it when ``dial`` (a, mode) is given."""
    seen = []
    h = m.blocks[i].register_forward_pre_hook(lambda mod, args: seen.append(args[0].clone()))
    try:
        with torch.no_grad():
            if dial is None:
                m.extract(x)
            else:
                with diffusion_dial(m, dial[0], blocks=m.depth - i, mode=dial[1]) as d:
                    h.remove()  # after the dial's own hook: sees the dialed input
                    h = m.blocks[i].register_forward_pre_hook(lambda mod, args: seen.append(args[0].clone()))
                    m.extract(x)
                return seen[-1], d
    finally:
        h.remove()
    return seen[-1]


@pytest.mark.parametrize("variant", ("softmax", "registers"))
def test_semantic_dial_adds_the_cls_direction_at_each_patch_norm_and_keeps_local_content(variant):
    m, x = _model(variant), _images(4)
    P = m.num_prefix_tokens
    plain = _inputs(m, x, 2)
    dialed, d = _inputs(m, x, 2, (1.0, "semantic"))
    for b in range(2):  # by hand, row by row: x_i + 1 * |x_i| * c / |c|
        c = plain[b, 0] / plain[b, 0].norm()
        for i in range(P, plain.shape[1]):
            torch.testing.assert_close(dialed[b, i], plain[b, i] + plain[b, i].norm() * c, atol=1e-5, rtol=1e-5)
    assert torch.equal(dialed[:, :P], plain[:, :P])  # [CLS] and registers unchanged at the dial's input
    patches = dialed[:, P:]
    gaps = torch.cdist(patches, patches) + torch.eye(patches.shape[1]) * 1e9
    assert gaps.min() > 1e-2 * patches.norm(dim=-1).mean()  # a = 1: the patch tokens still differ from one another
    chk = d.check()
    assert chk["with"] > chk["without"] and chk["with"] < 1.0  # the share of c grew, the patches are not c


def test_lazy_dial_plants_high_norm_copies_on_the_lowest_score_patches_and_biases_cls_towards_them():
    m, x, a, k = _model("softmax"), _images(5), 0.5, 3
    plain = _inputs(m, x, 2)
    with torch.no_grad():
        with diffusion_dial(m, a, blocks=1, mode="lazy", k=k) as d:
            attn = m.attention_maps(x, blocks=[2])[0]
            planted = d.planted
    for b in range(2):
        c = plain[b, 0] / plain[b, 0].norm()
        cos = [float(plain[b, i] @ c / plain[b, i].norm()) for i in range(1, plain.shape[1])]
        assert sorted(planted[b].tolist()) == sorted(1 + j for j in sorted(range(len(cos)), key=cos.__getitem__)[:k])
    y = plain.clone()  # the planted input by hand, then [CLS]'s logits and their bias by hand
    for b in range(2):
        c, m_norm = plain[b, 0] / plain[b, 0].norm(), plain[b, 1:].norm(dim=-1).mean()
        for j in planted[b].tolist():
            y[b, j] = (1 - a) * plain[b, j] + a * 4.0 * m_norm * c
    blk, D, H = m.blocks[2], m.embed_dim, m.blocks[2].attn.num_heads
    z = blk.norm1(y)
    q = F.linear(z, blk.attn.qkv.weight[:D], blk.attn.qkv.bias[:D]).reshape(2, -1, H, D // H).transpose(1, 2)
    kk = F.linear(z, blk.attn.qkv.weight[D:2 * D], blk.attn.qkv.bias[D:2 * D]).reshape(2, -1, H, D // H).transpose(1, 2)
    logits = (q[:, :, :1] @ kk.transpose(-2, -1)) * (D // H) ** -0.5
    N = y.shape[1]
    for b in range(2):
        logits[b, :, :, planted[b]] += a * math.log(N)
    torch.testing.assert_close(attn[:, :, :1], logits.softmax(-1), atol=1e-5, rtol=1e-4)
    chk = d.check()
    assert chk["with"] > chk["without"] and chk["k"] == k


def test_tokens_dial_deletes_local_content_and_leaves_cls():
    m, x = _model("registers"), _images(6)
    plain = _inputs(m, x, 2)
    dialed, _ = _inputs(m, x, 2, (1.0, "tokens"))
    P = m.num_prefix_tokens
    assert torch.equal(dialed[:, :P], plain[:, :P])
    torch.testing.assert_close(dialed[:, P:], plain[:, P:].mean(1, keepdim=True).expand_as(dialed[:, P:]))


def test_restored_after_an_error_and_refusals():
    m = _model("softmax")
    before = [blk.attn.normalizer for blk in m.blocks]
    with pytest.raises(RuntimeError, match="boom"):
        with diffusion_dial(m, 1.0, blocks=2, mode="lazy"):
            assert m.blocks[-1].attn.normalizer is not None
            raise RuntimeError("boom")
    assert [blk.attn.normalizer for blk in m.blocks] == before
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="in \\[0, 1\\]"):
            with diffusion_dial(m, bad):
                pass
    with pytest.raises(ValueError, match="1..3"):
        with diffusion_dial(m, 0.5, blocks=4):
            pass
    with pytest.raises(ValueError, match="k must be"):
        with diffusion_dial(m, 0.5, mode="lazy", k=0):
            pass
    from backbones.baselines import PixelBackbone
    with pytest.raises(ValueError, match="pixels"):
        with diffusion_dial(PixelBackbone(8), 0.5):
            pass
    assert [default_blocks(d) for d in (1, 2, 4, 12)] == [1, 1, 2, 4] and dialed_blocks(12) == [8, 9, 10, 11]


def test_timm_dinov2_registers_architecture_takes_the_dial():
    # what backbones.load builds for CKPT=<timm DINOv2 file> ARGS="--arch vit_small_patch14_reg4_dinov2" (registers,
    # LayerScale, timm's position interpolation), narrowed to 2 blocks of width 48 to stay cheap
    from backbones.foreign import timm_config
    cfg = {**timm_config("vit_small_patch14_reg4_dinov2"), "depth": 2, "embed_dim": 48, "num_heads": 2}
    m = create_vit(seed=0, **cfg).eval()
    x = torch.randn(1, 3, 28, 28, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = m(x)
        with diffusion_dial(m, 0.0):
            assert torch.equal(m(x), ref)
        with diffusion_dial(m, 1.0, mode="lazy", k=1) as d:
            m.attention_maps(x, blocks=d.blocks)
    assert d.blocks == [1] and m.num_reg_tokens == 4 and d.planted.min() >= 5  # a patch, not a register
    assert d.check()["with"] > d.check()["without"]


def test_a_dinov2_hub_file_takes_the_dial_and_keeps_dinov2s_features_at_a_zero(tmp_path):
    """A DINOv2 ViT-S/14 + 4 registers file as DINOv2's own module writes it (official/dinov2.py, trained-scale
    random weights), through CKPT= as the probes load it: at a = 0 inside the dial the features are DINOv2's own
    ``x_norm_*`` (to 1e-5); at a = 1 the semantic dial changes the patch features."""
    from backbones.load import resolve_backbone
    src = dinov2_source("dinov2_vits14_reg")
    assert isinstance(src, DinoVisionTransformer)  # the reference is DINOv2's own module, not ours
    torch.save(src.state_dict(), tmp_path / "dinov2_vits14_reg4.pth")
    m = resolve_backbone(str(tmp_path / "dinov2_vits14_reg4.pth"), "", "vit_demo_patch8", 16).model.eval()
    x = torch.randn(1, 3, 56, 84, generator=torch.Generator().manual_seed(0))  # 4x6 patches, not the native grid
    with torch.no_grad():
        ref = src.forward_features(x)
        with diffusion_dial(m, 0.0):
            out = m.extract(x)[-1]
        with diffusion_dial(m, 1.0) as d:
            dialed = m.extract(x)[-1]
    torch.testing.assert_close(out["cls"], ref["x_norm_clstoken"], atol=1e-5, rtol=0)
    torch.testing.assert_close(out["patch"], ref["x_norm_patchtokens"], atol=1e-5, rtol=0)
    assert d.blocks == [1] and not torch.allclose(dialed["patch"], out["patch"], atol=1e-3)
