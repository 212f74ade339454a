"""DINOHead / MultiCropWrapper against the official head (official/vit.py, torch weight_norm)."""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from lightning_modules.dino_head import DINOHead, MultiCropWrapper


def official_head(in_dim, out_dim, hidden, bottleneck):
    """facebookresearch/dino's DINOHead (official/vit.py: torch's own weight_norm, keys last_layer.weight_g /
    weight_v), as a trained head is: norm_last_layer=False."""
    from official.vit import DINOHead as OfficialHead
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated but still the official layer
        return OfficialHead(in_dim, out_dim, norm_last_layer=False, nlayers=3, hidden_dim=hidden,
                            bottleneck_dim=bottleneck)


def test_official_weights_load_and_give_the_same_output():
    torch.manual_seed(0)
    ref = official_head(24, 50, 40, 16)
    with torch.no_grad():
        ref.last_layer.weight_g.uniform_(0.5, 2.0)  # a trained head (norm_last_layer=False) has gains != 1
    sd = ref.state_dict()
    assert {"last_layer.weight_g", "last_layer.weight_v"} <= set(sd)
    head = DINOHead(24, 50, norm_last_layer=False, nlayers=3, hidden_dim=40, bottleneck_dim=16)
    head.load_state_dict(sd, strict=True)
    x = torch.randn(7, 24)
    assert torch.allclose(head(x), ref(x), atol=1e-6)
    assert set(head.state_dict()) == set(sd)
    # the weight-normalised last layer is torch's weight_norm bit for bit, forward and backward
    z = torch.randn(7, 16)
    ours, theirs = head.last_layer(z), ref.last_layer(z)
    assert torch.equal(ours, theirs) and torch.equal(head.last_layer.weight, ref.last_layer.weight)
    ours.square().sum().backward()
    theirs.square().sum().backward()
    for name in ("weight_g", "weight_v"):
        assert torch.equal(getattr(head.last_layer, name).grad, getattr(ref.last_layer, name).grad), name


def test_forward_equals_hand_computation_and_init():
    torch.manual_seed(1)
    head = DINOHead(12, 30, hidden_dim=20, bottleneck_dim=8)
    x = torch.randn(5, 12)
    l0, l1, l2 = head.mlp[0], head.mlp[2], head.mlp[4]
    h = F.gelu(x @ l0.weight.T + l0.bias)
    h = F.gelu(h @ l1.weight.T + l1.bias)
    z = h @ l2.weight.T + l2.bias
    z = z / z.norm(dim=1, keepdim=True)
    v = head.last_layer.weight_v
    w = v / v.norm(dim=1, keepdim=True)  # g == 1
    assert torch.allclose(head(x), z @ w.T, atol=1e-6)
    # norm_last_layer: gain fixed to 1 and not trained; trunc_normal(0.02) weights, zero biases
    assert not head.last_layer.weight_g.requires_grad and torch.all(head.last_layer.weight_g == 1)
    assert all(m.bias.abs().sum() == 0 for m in (l0, l1, l2))
    # official trunc_normal_(std=.02) truncates at the absolute bounds (-2, 2), i.e. effectively N(0, 0.02)
    big = DINOHead(256, 4, hidden_dim=512, bottleneck_dim=8).mlp[0].weight
    assert 0.019 < big.std().item() < 0.021 and abs(big.mean().item()) < 1e-3


def test_use_bn_and_one_layer_structures():
    assert isinstance(DINOHead(8, 4, use_bn=True, hidden_dim=6, bottleneck_dim=3).mlp[1], nn.BatchNorm1d)
    one = DINOHead(8, 4, nlayers=1, bottleneck_dim=3)
    assert isinstance(one.mlp, nn.Linear) and one(torch.randn(2, 8)).shape == (2, 4)


class CountingBackbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 6)
        self.calls = []

    def forward(self, x):
        self.calls.append(tuple(x.shape))
        return self.proj(x.mean(dim=(2, 3)))


def test_multicrop_wrapper_runs_backbone_once_per_resolution():
    bb = CountingBackbone()
    wrapper = MultiCropWrapper(bb, nn.Identity())
    crops = [torch.randn(2, 3, 16, 16), torch.randn(2, 3, 16, 16)] + [torch.randn(2, 3, 8, 8) for _ in range(3)]
    out = wrapper(crops)
    assert bb.calls == [(4, 3, 16, 16), (6, 3, 8, 8)]
    expected = torch.cat([bb.proj(c.mean(dim=(2, 3))) for c in crops])  # crop-major order, as the loss chunks it
    assert torch.allclose(out, expected, atol=1e-6)
