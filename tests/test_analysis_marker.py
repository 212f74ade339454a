"""The marker positive control's readouts (analysis/marker.py), each recomputed here by another path through the model
(``model.forward``'s classifier, ``attention_maps``, timm's attention mask on the last block) on a small random ViT,
and the cue-conflict batch's geometry by hand."""
from __future__ import annotations

import pytest
import torch
from test_analysis_pib import FakeRun

from analysis.data import Sample
from analysis.marker import cls_keys_only, conflict_batch, extract_marker, finish_marker
from analysis.shards import Options, run_local
from backbones import create_vit
from datamodules.demo import scenes
from tokenmix.diffusion import patch_scores

pytestmark = pytest.mark.timeout(120)
N = 12  # scenes


def test_conflict_batch_geometry():
    x, c, c2, obj, mk = conflict_batch([0, 9, 30])
    assert x.shape == (3, 3, 64, 64) and obj.shape == (3, 64)
    for j, i in enumerate([0, 9, 30]):
        img, cls, mcls, mask, box = scenes.cue_conflict(0, i)
        assert (int(c[j]), int(c2[j])) == (cls, mcls)
        assert int(mk[j]) == (box[1] // 8) * 8 + box[0] // 8  # row-major cell of the 8 x 8 grid
        for cell in range(64):  # a cell is an object patch iff one of its 64 pixels is object
            r, q = divmod(cell, 8)
            assert bool(obj[j, cell]) == bool(mask[8 * r:8 * r + 8, 8 * q:8 * q + 8].any())
        assert not obj[j, int(mk[j])]


@pytest.fixture(scope="module")
def model():
    return create_vit("vit_test_patch8", "softmax", seed=0, num_classes=8).eval()


def test_cls_restriction_zeroes_the_object_keys_only(model):
    x, _, _, obj, _ = conflict_batch(list(range(4)))
    allowed = torch.cat([torch.ones(4, 1, dtype=torch.bool), ~obj], 1)
    first, before = model.attention_maps(x)
    with cls_keys_only(model, allowed):
        inside = model.attention_maps(x)[-1]
    after = model.attention_maps(x)[-1]
    assert torch.equal(before, after)  # restored
    assert (inside[:, :, 0][~allowed[:, None].expand(-1, 2, -1)] == 0).all()
    torch.testing.assert_close(inside[:, :, 0].sum(-1), torch.ones(4, 2))
    torch.testing.assert_close(inside[:, :, 1:], before[:, :, 1:])  # the patch rows as they were
    assert not torch.allclose(inside[:, :, 0], before[:, :, 0])
    with cls_keys_only(model, allowed, range(2)):
        every = model.attention_maps(x)
    assert all((a[:, :, 0][~allowed[:, None].expand(-1, 2, -1)] == 0).all() for a in every)
    assert not torch.equal(every[0], first) and torch.equal(model.attention_maps(x)[0], first)  # every block, restored


def test_readouts_match_an_independent_recomputation(model):
    res = run_local(extract_marker, finish_marker, model, [Sample(i, None, None, "") for i in range(N)], FakeRun(),
                    Options(batch_size=5, num_vis=0))
    x, c, c2, obj, mk = conflict_batch(list(range(N)))
    with torch.no_grad():
        pred = model(x).argmax(1)  # the classifier's own forward
        y = model.forward_features(x)
        s = patch_scores(y[:, 0], y[:, 1:])
        attn = model.attention_maps(x)[-1][:, :, 0].mean(1)  # (B, T)
        # the known positive through timm's attention mask on the last block, not the normaliser wrapper
        h = model.norm_pre(model._pos_embed(model.patch_embed(x)))
        for blk in model.blocks[:-1]:
            h = blk(h)
        mask = torch.ones(N, 1, 65, 65, dtype=torch.bool)
        mask[:, 0, 0, 1:] = ~obj
        yr = model.norm(model.blocks[-1](h, attn_mask=mask))
        sr = patch_scores(yr[:, 0], yr[:, 1:])
        pred_r = model.head(yr[:, 0]).argmax(1)
    contrast = lambda sc: torch.stack([sc[j][obj[j]].mean() - sc[j][~obj[j]].mean() for j in range(N)]).mean()  # noqa: E731
    assert res["n_images"] == N
    assert res["follows_marker"] == pytest.approx(100 * (pred == c2).float().mean().item(), abs=1e-3)
    assert res["follows_object"] == pytest.approx(100 * (pred == c).float().mean().item(), abs=1e-3)
    assert res["pib_marker"] == pytest.approx(100 * (s.argmax(1) == mk).float().mean().item(), abs=1e-3)
    assert res["pib_object"] == pytest.approx(100 * obj.gather(1, s.argmax(1)[:, None]).float().mean().item(), abs=1e-3)
    assert res["cls_attention_marker"] == pytest.approx(attn.gather(1, 1 + mk[:, None]).mean().item(), abs=1e-5)
    assert res["patch_score_contrast"] == pytest.approx(contrast(s).item(), abs=1e-5)
    r = res["restricted"]
    assert r["cls_attention_object"] == 0.0
    assert r["patch_score_contrast"] == pytest.approx(contrast(sr).item(), abs=1e-5)
    assert r["follows_marker"] == pytest.approx(100 * (pred_r == c2).float().mean().item(), abs=1e-3)
    assert res["chance"]["pib_marker"] == pytest.approx(100 / 64, abs=1e-3)
