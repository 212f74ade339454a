"""The diffusion dial (backbones/diffusion_dial.py) on random small ViTs, no training: at a = 0 the forward is
bitwise the unmodified one; at a > 0 the dialed blocks' attention output is (1 - a)·(unmodified output) + a·proj(mean
of the values), computed here by hand from the layer's own weights; only the chosen blocks and rows change; the
normalisers come back; every backbone kind the probes build (softmax, entmax-1.5, sparsemax, registers, LaSt-ViT,
specialization, a timm DINOv2-with-registers architecture) takes it."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from backbones import create_vit
from backbones.diffusion_dial import Rows, default_blocks, dialed_blocks, diffusion_dial

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
def test_a_zero_is_bitwise_the_unmodified_forward(variant):
    m, x = _model(variant), _images()
    with torch.no_grad():
        ref_cls, ref = m(x), m.extract(x, blocks=[0, 1, 2])
        ref_attn = m.attention_maps(x)
        norms = [blk.attn.normalizer for blk in m.blocks]
        with diffusion_dial(m, 0.0, blocks=3) as idx:
            assert idx == [0, 1, 2] and [blk.attn.normalizer for blk in m.blocks] == norms
            cls, out, attn = m(x), m.extract(x, blocks=[0, 1, 2]), m.attention_maps(x)
    assert torch.equal(cls, ref_cls)
    for o, r in zip(out, ref):
        assert torch.equal(o["cls"], r["cls"]) and torch.equal(o["patch"], r["patch"])
    assert all(torch.equal(a, b) for a, b in zip(attn, ref_attn))


def _by_hand_uniform(attn, x: torch.Tensor) -> torch.Tensor:
    """proj(mean over tokens of v), for every token: the attention output of all-uniform rows, from the weights."""
    B, T, D = x.shape
    v = F.linear(x, attn.qkv.weight[2 * D:], attn.qkv.bias[2 * D:])
    return F.linear(v.mean(1, keepdim=True).expand(B, T, D), attn.proj.weight, attn.proj.bias)


@pytest.mark.parametrize("variant", ("softmax", "entmax", "registers"))
@pytest.mark.parametrize("a", (0.3, 1.0))
def test_dialed_attention_is_the_mix_with_the_token_mean(variant, a):
    m = _model(variant)
    attn = m.blocks[-1].attn
    x = torch.randn(2, 1 + m.num_reg_tokens + 25, m.embed_dim, generator=torch.Generator().manual_seed(1)) * 2
    with torch.no_grad():
        plain = attn(x)
        with diffusion_dial(m, a, blocks=1):
            dialed = attn(x)
        expect = (1 - a) * plain + a * _by_hand_uniform(attn, x)
    torch.testing.assert_close(dialed, expect, atol=2e-5, rtol=1e-5)
    assert not torch.allclose(dialed, plain, atol=1e-3)  # the dial did something


def test_only_the_last_blocks_change_and_patch_rows_keep_cls():
    m, x = _model("entmax"), _images(2)
    with torch.no_grad():
        ref = m.attention_maps(x)
        with diffusion_dial(m, 0.5, blocks=1, rows=Rows.PATCH):
            got = m.attention_maps(x)
            cls = m(x)
        ref_cls = m(x)
    assert all(torch.equal(g, r) for g, r in zip(got[:-1], ref[:-1]))  # earlier blocks untouched
    N = got[-1].shape[-1]
    torch.testing.assert_close(got[-1][:, :, 1:], 0.5 * ref[-1][:, :, 1:] + 0.5 / N)
    torch.testing.assert_close(got[-1][:, :, :1], ref[-1][:, :, :1])  # [CLS] row as it was
    assert (ref[-1] == 0).any() and not (got[-1][:, :, 1:] == 0).any()  # entmax's zeros are gone where mixed
    torch.testing.assert_close(cls, ref_cls, atol=1e-5, rtol=1e-5)  # last block: [CLS] reads only its own row


def test_restored_after_an_error_and_refusals():
    m = _model("softmax")
    before = [blk.attn.normalizer for blk in m.blocks]
    with pytest.raises(RuntimeError, match="boom"):
        with diffusion_dial(m, 1.0, blocks=2):
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
        with diffusion_dial(m, 1.0) as idx:
            p = m.attention_maps(x, blocks=idx)
    T = 1 + 4 + 4  # [CLS], 4 registers, 2x2 patches
    assert idx == [1] and m.num_reg_tokens == 4 and torch.allclose(p[0], torch.full_like(p[0], 1 / T))


def test_a_dinov2_hub_file_takes_the_dial_and_keeps_dinov2s_features_at_a_zero(tmp_path):
    """A DINOv2 ViT-S/14 + 4 registers file as DINOv2's own module writes it (official/dinov2.py, trained-scale
    random weights), through CKPT= as the probes load it: at a = 0 inside the dial the features are DINOv2's own
    ``x_norm_*`` (to 1e-5); at a = 1 the dialed block's attention rows are uniform over [CLS], registers, patches."""
    from backbones.load import resolve_backbone
    from helpers.dinov2_source import dinov2_source
    from official.dinov2 import DinoVisionTransformer
    src = dinov2_source("dinov2_vits14_reg")
    assert isinstance(src, DinoVisionTransformer)  # the reference is DINOv2's own module, not ours
    torch.save(src.state_dict(), tmp_path / "dinov2_vits14_reg4.pth")
    m = resolve_backbone(str(tmp_path / "dinov2_vits14_reg4.pth"), "", "vit_demo_patch8", 16).model.eval()
    x = torch.randn(1, 3, 56, 84, generator=torch.Generator().manual_seed(0))  # 4x6 patches, not the native grid
    with torch.no_grad():
        ref = src.forward_features(x)
        with diffusion_dial(m, 0.0):
            out = m.extract(x)[-1]
        with diffusion_dial(m, 1.0) as idx:
            p = m.attention_maps(x, blocks=idx)
    torch.testing.assert_close(out["cls"], ref["x_norm_clstoken"], atol=1e-5, rtol=0)
    torch.testing.assert_close(out["patch"], ref["x_norm_patchtokens"], atol=1e-5, rtol=0)
    T = 1 + 4 + 4 * 6
    assert idx == [1] and torch.allclose(p[0], torch.full_like(p[0], 1 / T))
