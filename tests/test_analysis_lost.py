"""LOST object discovery and CorLoc on hand-built feature maps where the answer is known."""
import numpy as np
import pytest
import scipy.stats
import torch
from torchvision.ops import box_iou as tv_box_iou

from analysis.boxes import box_iou
from analysis.lost import corloc_hit, last_block_keys, lost


def feature_map(h, w, objects, D=8, noise=0.05, seed=0):
    """Background patches ~ +e0; each object (slice rows, slice cols, direction) gets its own direction,
    slightly anti-correlated with the background (-0.2 e0) and with the other objects (+-0.3 e7 alternating,
    so two objects meet at 0.04 - 0.09 < 0): every object/other similarity is negative."""
    g = torch.Generator().manual_seed(seed)
    f = torch.zeros(h, w, D)
    f[..., 0] = 1.0
    for i, (rows, cols, d) in enumerate(objects):
        v = torch.zeros(D)
        v[d] = 1.0
        v[0] = -0.2
        v[7] = 0.3 if i % 2 == 0 else -0.3
        f[rows, cols] = v
    f += noise * torch.randn(h, w, D, generator=g) * 0.1
    return f.reshape(h * w, D)


def test_single_object_box():
    f = feature_map(6, 8, [(slice(2, 4), slice(3, 6), 1)])
    r = lost(f, (6, 8), patch_size=16)
    assert r.box_patches == (3, 2, 6, 4)
    assert r.box == (48.0, 32.0, 96.0, 64.0)
    assert r.seed in {2 * 8 + 3 + dy * 8 + dx for dy in range(2) for dx in range(3)}
    assert sorted(r.seed_set) == sorted(2 * 8 + 3 + dy * 8 + dx for dy in range(2) for dx in range(3))


def test_seed_is_the_lowest_degree_object_and_only_its_component_counts():
    # a small object (2x2, degree 3) and a larger one (3x3, degree 8): LOST picks the small one
    f = feature_map(8, 8, [(slice(0, 2), slice(0, 2), 1), (slice(4, 7), slice(4, 7), 2)])
    r = lost(f, (8, 8), patch_size=10)
    assert r.box_patches == (0, 0, 2, 2)
    assert r.degree[0] == 3 and r.degree[4 * 8 + 4] == 8
    # same features in two disconnected places: the mask holds both, the box only the seed's component
    f2 = feature_map(8, 8, [(slice(0, 2), slice(0, 2), 3), (slice(6, 7), slice(6, 7), 3)])
    r2 = lost(f2, (8, 8), patch_size=10, seed=0)
    assert r2.seed == 0 and r2.box_patches == (0, 0, 2, 2)
    assert len(r2.seed_set) == 5  # all five similar patches expand the seed...
    assert not r2.mask[6, 6]  # ...but the far one is another component
    assert lost(f2, (8, 8), patch_size=10, seed=54).box_patches == (6, 6, 7, 7)
    # the five share the lowest degree (4): the seed is drawn among them, each about equally often (not patch 0)
    seeds = [lost(f2, (8, 8), 10, generator=torch.Generator().manual_seed(i)).seed for i in range(400)]
    assert set(seeds) == {0, 1, 8, 9, 54} and lost(f2, (8, 8), 10).seed_tied and r.seed in (0, 1, 8, 9)
    assert scipy.stats.chisquare([seeds.count(k) for k in (0, 1, 8, 9, 54)]).pvalue > 1e-3


def test_k_patches_limits_the_seed_set_and_box_is_clipped():
    f = feature_map(4, 4, [(slice(2, 4), slice(2, 4), 1)])
    r = lost(f, (4, 4), patch_size=16, k_patches=1)
    assert r.seed_set == [r.seed]
    # padded input: 4x4 patches of 16 px, real image 60x50 (H, W)
    r2 = lost(f, (4, 4), patch_size=16, image_size=(60, 50))
    assert r2.box == (32.0, 32.0, 50.0, 60.0)


def test_iou_and_corloc():
    a = torch.tensor([[0.0, 0.0, 10.0, 10.0]])
    b = torch.tensor([[5.0, 0.0, 15.0, 10.0], [0.0, 0.0, 10.0, 20.0], [20.0, 20.0, 30.0, 30.0]])
    torch.testing.assert_close(box_iou(a, b), torch.tensor([[1 / 3, 0.5, 0.0]], dtype=torch.float64))
    g = torch.Generator().manual_seed(0)
    p = torch.rand(7, 2, generator=g) * 50
    r = torch.cat([p, p + torch.rand(7, 2, generator=g) * 50 + 1], 1)
    torch.testing.assert_close(box_iou(r, r.flip(0)), tv_box_iou(r, r.flip(0)).double())
    assert not corloc_hit([0, 0, 10, 10], b[:1])
    assert corloc_hit([0, 0, 10, 10], b)  # IoU exactly 0.5 with the second GT box counts (>=)
    assert not corloc_hit([0, 0, 10, 10], torch.zeros(0, 4))


@pytest.mark.parametrize("variant", ["softmax", "registers"])
def test_last_block_keys_match_manual_computation(variant):
    import backbones
    torch.manual_seed(0)
    m = backbones.create_vit("vit_test_patch8", variant).eval()
    x = torch.randn(2, 3, 32, 40)
    k = last_block_keys(m, x)
    with torch.no_grad():
        t = m.norm_pre(m._pos_embed(m.patch_embed(x)))
        for blk in m.blocks[:-1]:
            t = blk(t)
        qkv = m.blocks[-1].attn.qkv(m.blocks[-1].norm1(t))
    D = m.embed_dim
    ref = qkv[:, m.num_prefix_tokens:, D:2 * D]
    assert k.shape == (2, 20, D)
    torch.testing.assert_close(k, ref)


class ColourFeatures(torch.nn.Module):
    """Stand-in backbone: patch feature = mean colour of the patch minus the image's mean patch colour."""
    patch_size = 8

    def grid_size(self, x):
        return x.shape[-2] // 8, x.shape[-1] // 8

    def extract(self, x, **kw):
        f = torch.nn.functional.avg_pool2d(x, 8).flatten(2).transpose(1, 2)
        return [{"cls": f.mean(1), "patch": f - f.mean(1, keepdim=True)}]


def test_corloc_end_to_end_on_hand_built_scenes():
    from analysis.data import Sample
    from analysis.tasks import Options, run_corloc
    from test_analysis_pib import FakeRun, scene

    # red object on patch borders: LOST must return exactly its box (16, 8, 40, 32)
    img = scene(64, 48, (16, 8, 40, 32))
    hit = Sample(0, img, torch.tensor([[16.0, 8.0, 40.0, 32.0], [0.0, 0.0, 5.0, 5.0]]), "a")  # any GT box counts
    off = Sample(1, img, torch.tensor([[40.0, 24.0, 64.0, 48.0]]), "b")  # GT elsewhere: a miss
    near = Sample(2, img, torch.tensor([[16.0, 8.0, 40.0, 20.0]]), "c")  # IoU = 12/24 = 0.5 exactly: a hit
    # odd size: padded to 72x56 for the model, the box is still the object's
    odd = Sample(3, scene(70, 50, (24, 16, 48, 40)), torch.tensor([[24.0, 16.0, 48.0, 40.0]]), "d")
    run = FakeRun()
    res = run_corloc(ColourFeatures(), [hit, off, near, odd], run, Options(lost_features="patch", num_vis=2))
    assert res["n_images"] == 4 and res["corloc"] == 75.0
    assert res["features"] == "last-block patch outputs" and run.figs == ["lost_boxes"]
