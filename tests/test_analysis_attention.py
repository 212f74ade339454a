"""Attention statistics on hand-worked cases, against scipy/numpy, and on the real backbones."""
import math

import numpy as np
import pytest
import torch
from scipy.stats import entropy as scipy_entropy

from tokenmix.attention_stats import attention_stats, attention_stats_per_layer, cls_attention_maps


def test_hand_worked_rows():
    # 1 image, 2 heads, 3 tokens
    a = torch.tensor([[[[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.25, 0.25, 0.5]],
                       [[1 / 3, 1 / 3, 1 / 3]] * 3]])
    st = attention_stats(a)
    # head 0: zeros 2 + 1 + 0 of 9; support (1 + 2 + 3) / 3; entropy (0 + ln2 + 1.5 ln2) / 3
    assert st["zero_share"].tolist() == pytest.approx([3 / 9, 0.0])
    assert st["support_size"].tolist() == pytest.approx([2.0, 3.0])
    assert st["entropy"].tolist() == pytest.approx([(math.log(2) + 1.5 * math.log(2)) / 3, math.log(3)], rel=1e-6)
    # queries="cls" looks at row 0 only, "patch" at rows >= num_prefix
    assert attention_stats(a, queries="cls")["support_size"].tolist() == pytest.approx([1.0, 3.0])
    assert attention_stats(a, queries="patch", num_prefix=1)["zero_share"].tolist() == pytest.approx([1 / 6, 0.0])


def test_against_entmax_and_scipy():
    from entmax import entmax15
    g = torch.Generator().manual_seed(0)
    a = entmax15(torch.randn(3, 4, 10, 10, generator=g) * 3, dim=-1)
    st = attention_stats(a)
    p = a.numpy()
    np.testing.assert_allclose(st["zero_share"].numpy(), (p == 0).mean(axis=(0, 2, 3)), rtol=1e-6)
    np.testing.assert_allclose(st["support_size"].numpy(), (p > 0).sum(-1).mean(axis=(0, 2)), rtol=1e-6)
    ent = np.apply_along_axis(scipy_entropy, -1, p).mean(axis=(0, 2))
    np.testing.assert_allclose(st["entropy"].numpy(), ent, rtol=1e-5)
    assert (st["zero_share"] > 0).all()  # entmax-1.5 gives exact zeros


def test_cls_maps_are_row_zero_without_prefix():
    B, H, P, h, w = 2, 3, 2, 3, 4
    T = P + h * w
    a = torch.rand(B, H, T, T)
    a[:, :, 0, P:] = torch.arange(h * w, dtype=torch.float32)  # value = row-major patch index
    m = cls_attention_maps(a, P, (h, w))
    assert m.shape == (B, H, h, w)
    assert m[1, 2, 2, 1].item() == 2 * w + 1 and m[0, 0, 0, 3].item() == 3
    with pytest.raises(ValueError, match="grid 4x4"):
        cls_attention_maps(a, P, (4, 4))


def test_real_backbones_softmax_dense_entmax_sparse():
    import backbones
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, 32)
    soft = backbones.create_vit("vit_test_patch8", "softmax").eval()
    ent = backbones.create_vit("vit_test_patch8", "entmax").eval()
    with torch.no_grad():  # sharpen q.k so entmax has room for zeros in this tiny random-init model
        for blk in soft.blocks:
            blk.attn.qkv.weight.mul_(4)
    ent.load_state_dict(soft.state_dict())
    s_soft = attention_stats_per_layer(soft.attention_maps(x))
    s_ent = attention_stats_per_layer(ent.attention_maps(x))
    T = 1 + 16
    assert s_soft["zero_share"].shape == (2, 2)
    assert torch.all(s_soft["zero_share"] == 0) and torch.allclose(s_soft["support_size"], torch.full((2, 2), float(T)))
    assert torch.all(s_ent["support_size"] < T) and torch.all(s_ent["entropy"] < s_soft["entropy"])
    maps = cls_attention_maps(soft.get_last_selfattention(x), soft.num_prefix_tokens, soft.grid_size(x))
    assert maps.shape == (2, 2, 4, 4) and torch.all(maps.sum((-1, -2)) < 1)
