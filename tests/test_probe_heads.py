"""Probe heads, SigLoss, frozen feature layout, raw-pixel baseline, and the feature cache."""
import math

import numpy as np
import pytest
import torch

from backbones import create_vit
from backbones.baselines import PixelBackbone
from probes.core.features import FeatureSpec, FrozenFeatures, normalize_images
from probes.core.heads import LinearDepthHead, LinearSegHead, SigLoss


def test_sigloss_matches_dinov2_formula():
    g = torch.Generator().manual_seed(0)
    gt = torch.rand(2, 6, 7, generator=g) * 12
    gt[0, 0, :3] = 0.0                     # unknown
    pred = torch.rand(2, 6, 7, generator=g) * 10 + 0.1
    loss = SigLoss(max_depth=10.0)(pred, gt)
    m = (gt > 0) & (gt <= 10.0)
    d = np.log(pred[m].numpy().astype(np.float64) + 1e-3) - np.log(gt[m].numpy().astype(np.float64) + 1e-3)
    ref = math.sqrt(d.var(ddof=1) + 0.15 * d.mean() ** 2)   # torch.var: Bessel-corrected
    assert loss.item() == pytest.approx(ref, rel=1e-5)


def test_sigloss_scale_only_error():
    gt = torch.tensor([[1.0, 2.0, 4.0, 8.0]])
    loss = SigLoss(eps=0.0)(2 * gt, gt)    # g = log 2 everywhere: Var 0, mean log 2
    assert loss.item() == pytest.approx(math.sqrt(0.15) * math.log(2), rel=1e-6)
    assert SigLoss()(gt, gt).item() == pytest.approx(0.0, abs=1e-6)


def test_depth_head_bins_hand_worked():
    head = LinearDepthHead(4, min_depth=1.0, max_depth=3.0, n_bins=3, norm="linear")
    torch.nn.init.zeros_(head.conv.weight)
    torch.nn.init.zeros_(head.conv.bias)
    x = torch.randn(1, 4, 2, 2)
    # zero logits: relu + 0.1 -> uniform over bins (1, 2, 3) -> 2 m
    assert torch.allclose(head(x), torch.full((1, 1, 2, 2), 2.0))
    with torch.no_grad():
        head.conv.bias.copy_(torch.tensor([0.0, 0.0, 0.9]))   # p = (0.1, 0.1, 1.0) / 1.2
    assert torch.allclose(head(x), torch.full((1, 1, 2, 2), (0.1 * 1 + 0.1 * 2 + 1.0 * 3) / 1.2))
    soft = LinearDepthHead(4, 1.0, 3.0, n_bins=3, norm="softmax")
    torch.nn.init.zeros_(soft.conv.weight)
    with torch.no_grad():
        soft.conv.bias.copy_(torch.tensor([50.0, 0.0, 0.0]))
    assert torch.allclose(soft(x), torch.ones(1, 1, 2, 2), atol=1e-5)
    reg = LinearDepthHead(4, 0.5, 10.0, classify=False)
    torch.nn.init.zeros_(reg.conv.weight)
    with torch.no_grad():
        reg.conv.bias.fill_(-1.0)
    assert torch.allclose(reg(x), torch.full((1, 1, 2, 2), 0.5))  # relu(.) + min_depth


def test_seg_head_is_bn_then_1x1_conv():
    head = LinearSegHead(6, 3).eval()
    x = torch.randn(2, 6, 4, 5)
    ref = torch.einsum("bchw,kc->bkhw", head.bn(x), head.conv.weight[:, :, 0, 0]) + head.conv.bias[None, :, None, None]
    assert torch.allclose(head(x), ref, atol=1e-6)


def test_dense_feature_layout_and_cls_concat():
    torch.manual_seed(0)
    vit = create_vit("vit_test_patch8", "softmax").eval()
    imgs = torch.randint(0, 256, (2, 3, 16, 24), dtype=torch.uint8)
    f = FrozenFeatures(vit, FeatureSpec(kind="dense", n_last_blocks=2, with_cls=True))
    out = f(imgs)
    D = vit.embed_dim
    assert out.shape == (2, 4 * D, 2, 3) and f.out_dim == 4 * D
    ref = vit.extract(normalize_images(imgs), n_last_blocks=2)
    for b, o in enumerate(ref):  # per block: D patch channels, then D [CLS] channels
        patch = out[:, 2 * b * D:(2 * b + 1) * D]
        assert torch.allclose(patch[:, :, 1, 2], o["patch"][:, 1 * 3 + 2], atol=1e-6)  # row-major
        assert torch.allclose(out[:, (2 * b + 1) * D:(2 * b + 2) * D, 0, 1], o["cls"], atol=1e-6)
    cls = FrozenFeatures(vit, FeatureSpec(kind="cls", blocks=[0]))(imgs)
    assert torch.allclose(cls, ref[0]["cls"], atol=1e-6)
    assert not any(p.requires_grad for p in vit.parameters())
    f.train()
    assert not vit.training  # the backbone stays in eval mode


def test_pixel_baseline_tokens_are_patches():
    pix = PixelBackbone(4)
    imgs = torch.randn(1, 3, 8, 12)
    out = pix.extract(imgs)[0]
    assert out["patch"].shape == (1, 6, 48)
    assert torch.equal(out["patch"][0, 1 * 3 + 2], imgs[0, :, 4:8, 8:12].reshape(-1))
    assert torch.allclose(out["cls"], torch.nn.functional.adaptive_avg_pool2d(imgs, 4).flatten(1))
    f = FrozenFeatures(pix, FeatureSpec(kind="dense", n_last_blocks=4))
    assert f(torch.zeros(1, 3, 8, 12, dtype=torch.uint8)).shape == (1, 48, 2, 3)


def test_depth_head_upsampling_logits_equals_upsampling_features():
    head = LinearDepthHead(5, 0.5, 10.0, n_bins=7).eval()
    x = torch.randn(2, 5, 3, 4)
    up = torch.nn.functional.interpolate(x, scale_factor=4, mode="bilinear", align_corners=False)
    assert torch.allclose(head(x, upsample=4), head(up), atol=1e-5)   # DINOv2 order: features first
