"""The semantic-diffusion measures (tokenmix.diffusion, the attention statistics DenseProbeCheck logs) and the
closed-form segmentation probe (probes.dense.ridge), each against a case worked out by hand or an independent solve."""
import math

import numpy as np
import pytest
import torch

from probes.dense.ridge import RidgeSegProbe, patch_targets
from tokenmix.attention_stats import attention_stats
from tokenmix.diffusion import (boxes_patch_mask, cls_patch_cosine, effective_rank, effective_rank_from_gram,
                                mask_boxes, patch_scores, pib_hits, score_contrast)


def test_pib_and_cosine_hand_case():
    cls = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    # image 0: patches at 0°, 90°, 45° to [CLS] -> cosines 1, 0, 1/√2; top patch 0
    # image 1: patches (1, 0), (0, -1), (1, 1) vs (0, 2) -> cosines 0, -1, 1/√2; top patch 2
    patch = torch.tensor([[[3.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [[1.0, 0.0], [0.0, -1.0], [1.0, 1.0]]])
    r = 1 / math.sqrt(2)
    assert torch.allclose(patch_scores(cls, patch), torch.tensor([[1.0, 0.0, r], [0.0, -1.0, r]]), atol=1e-6)
    assert torch.allclose(cls_patch_cosine(cls, patch), torch.tensor([(1 + r) / 3, (-1 + r) / 3]), atol=1e-6)
    boxes = torch.tensor([[True, False, False], [True, True, False]])  # image 1's top patch (2) is outside
    assert pib_hits(patch_scores(cls, patch), boxes).tolist() == [True, False]
    # contrast: image 0 scores inside {1}, outside {0, r}; image 1 inside {0, -1}, outside {r}
    c = score_contrast(patch_scores(cls, patch), boxes)
    assert torch.allclose(c, torch.tensor([1 - (0 + r) / 2, -0.5 - r]), atol=1e-6)
    assert score_contrast(patch_scores(cls, patch), torch.ones(2, 3, dtype=torch.bool)).isnan().all()


def test_effective_rank_hand_cases():
    # singular values 3, 1 -> p = (3/4, 1/4), H = -(3/4 ln 3/4 + 1/4 ln 1/4) = 0.5623, exp(H) = 1.7548
    x = torch.tensor([[3.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert effective_rank(x) == pytest.approx(math.exp(h), rel=1e-12)
    assert effective_rank(torch.eye(5)) == pytest.approx(5.0, rel=1e-12)  # equal singular values: the rank
    assert effective_rank(torch.ones(4, 3)) == pytest.approx(1.0, rel=1e-9)  # rank one
    # the Gram form adds up over shards: rows split in two give the same number
    g = torch.randn(50, 6, dtype=torch.float64)
    assert effective_rank_from_gram(g[:20].T @ g[:20] + g[20:].T @ g[20:]) == pytest.approx(effective_rank(g))
    s = np.linalg.svd(g.numpy(), compute_uv=False)  # independent: numpy's SVD
    p = s / s.sum()
    assert effective_rank(g) == pytest.approx(float(np.exp(-(p * np.log(p)).sum())), rel=1e-10)


def test_attention_entropy_and_zero_share_hand_case():
    # one head, 2 query rows over 4 keys: [1/2, 1/2, 0, 0] (entropy ln 2, 2 zeros), uniform (ln 4, none)
    a = torch.tensor([[[[0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]]]])
    a = torch.cat([a, a.new_zeros(1, 1, 2, 4) + 0.25], dim=2)  # (1, 1, 4, 4): two more uniform rows
    st = attention_stats(a)
    assert st["entropy"].item() == pytest.approx((math.log(2) + 3 * math.log(4)) / 4, rel=1e-6)
    assert st["zero_share"].item() == pytest.approx(2 / 16)


def test_mask_boxes_and_patch_mask_hand_case():
    m = torch.zeros(8, 8, dtype=torch.long)
    m[1:3, 2:5] = 3       # class 3: rows 1-2, columns 2-4 -> box (2, 1, 5, 3)
    m[6, 7] = 255         # ignored
    m[5:7, 0:2] = 1       # class 1: box (0, 5, 2, 7)
    boxes = mask_boxes(m)
    assert boxes.tolist() == [[0.0, 5.0, 2.0, 7.0], [2.0, 1.0, 5.0, 3.0]]
    # 4x4 patches of 2x2 pixels: box (2,1,5,3) overlaps patch rows 0-1, columns 1-2; box (0,5,2,7) rows 2-3, col 0
    pm = boxes_patch_mask(boxes, (4, 4), (2.0, 2.0)).reshape(4, 4)
    want = torch.zeros(4, 4, dtype=torch.bool)
    want[0:2, 1:3] = True
    want[2:4, 0] = True
    assert torch.equal(pm, want)
    assert not boxes_patch_mask(torch.tensor([[0.0, 0.0, 2.0, 2.0]]), (2, 2), (2.0, 2.0)).reshape(2, 2)[0, 1]


def test_patch_targets_are_class_fractions():
    m = torch.tensor([[[0, 0, 1, 1], [0, 255, 1, 2], [2, 2, 2, 2], [2, 2, 2, 2]]])
    y, keep = patch_targets(m, (2, 2), 3)
    # top-left patch: 0, 0, 0, ignored -> (1, 0, 0); top-right: 1, 1, 1, 2 -> (0, 3/4, 1/4); bottom: all 2
    assert torch.allclose(y, torch.tensor([[1, 0, 0], [0, 0.75, 0.25], [0, 0, 1], [0, 0, 1]], dtype=torch.float64))
    assert keep.tolist() == [True] * 4


def test_ridge_equals_an_independent_standardised_least_squares():
    torch.manual_seed(0)
    feats = torch.randn(3, 5, 4, 4)  # (B, C, h, w), 1-pixel patches
    masks = torch.randint(0, 3, (3, 4, 4))
    lam = 0.1
    probe = RidgeSegProbe(3, lam)
    probe.add_train(feats[:2], masks[:2])  # two batches: the statistics add up
    probe.add_train(feats[2:], masks[2:])
    probe.solve()
    # numpy: standardise with the population std, ridge with penalty lam * n on the weights, unpenalised bias
    x = feats.permute(0, 2, 3, 1).reshape(-1, 5).double().numpy()
    y = np.eye(3)[masks.reshape(-1).numpy()]
    z = (x - x.mean(0)) / x.std(0)
    n = len(x)
    w = np.linalg.solve(z.T @ z + lam * n * np.eye(5), z.T @ (y - y.mean(0)))
    logits = (z @ w + y.mean(0)).reshape(3, 4, 4, 3).transpose(0, 3, 1, 2)
    assert np.allclose(probe.logits(feats).numpy(), logits, atol=1e-10)
    probe.add_val(feats, list(masks))
    pred = logits.argmax(1)
    gt = masks.numpy()
    ious = [((pred == c) & (gt == c)).sum() / ((pred == c) | (gt == c)).sum() for c in range(3)
            if ((pred == c) | (gt == c)).any()]
    assert probe.metrics()["mIoU"] == pytest.approx(100 * float(np.mean(ious)), rel=1e-6)  # torchmetrics: fp32
