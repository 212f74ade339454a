"""DepthMetrics against mmsegmentation's DepthMetric and hand-worked numbers."""
import math

import pytest
import torch

from probes.dense.depth_metric import DEPTH_METRICS, DepthMetrics
from tokenmix.mmseg_compat import import_mmseg

import_mmseg()
from mmseg.evaluation import DepthMetric  # noqa: E402


def _mmseg(batches, min_depth, max_depth, crop_type=None):
    """mmseg's metrics under our names (its 'silog' is our 'silog_mmseg'; 'silog_toolbox' is not mmseg's)."""
    m = DepthMetric(min_depth_eval=min_depth, max_depth_eval=max_depth, crop_type=crop_type)
    for pred, gt in batches:
        m.process({}, [{"pred_depth_map": {"data": p[None]}, "gt_depth_map": {"data": g[None]}}
                       for p, g in zip(pred, gt)])
    ref = m.compute_metrics(m.results)
    ref["silog_mmseg"] = ref.pop("silog")
    return ref


MMSEG_METRICS = [k for k in DEPTH_METRICS if k != "silog_toolbox"]


def _nyu_crop(h, w):  # mmseg's 'nyu_crop' (Eigen crop of a 480x640 frame)
    mask = torch.zeros(h, w, dtype=torch.bool)
    mask[45:471, 41:601] = True
    return mask


def test_random_matches_mmseg_with_out_of_range_pixels():
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(3):
        gt = torch.rand(2, 12, 15, generator=g) * 12.0        # 0..12 m: some above max 10, some near 0
        gt[torch.rand(gt.shape, generator=g) < 0.2] = 0.0     # unknown depth
        pred = torch.rand(2, 12, 15, generator=g) * 10 + 0.05
        batches.append((pred, gt))
    ref = _mmseg(batches, 1e-3, 10.0)
    m = DepthMetrics(min_depth=1e-3, max_depth=10.0)
    for pred, gt in batches:
        m.update(pred[:, None], gt)   # (B, 1, H, W) predictions are accepted too
    ours = m.compute()
    for k in MMSEG_METRICS:
        assert ours[k].item() == pytest.approx(ref[k], rel=1e-5, abs=1e-7), k


def test_nyu_crop_matches_mmseg():
    g = torch.Generator().manual_seed(2)
    gt = torch.rand(2, 480, 640, generator=g) * 9 + 0.5
    gt[:, :45] = 3.0        # outside the crop: if counted, rmse changes
    pred = gt + torch.randn(gt.shape, generator=g) * 0.3
    pred = pred.clamp(min=0.1)
    pred[:, :45] = 100.0
    ref = _mmseg([(pred, gt)], 1e-3, 10.0, crop_type="nyu_crop")
    m = DepthMetrics(min_depth=1e-3, max_depth=10.0, crop=_nyu_crop)
    m.update(pred, gt)
    ours = m.compute()
    for k in MMSEG_METRICS:
        assert ours[k].item() == pytest.approx(ref[k], rel=1e-5, abs=1e-7), k
    assert ours["rmse"].item() < 1.0   # the 100 m predictions outside the crop were not counted


def test_hand_worked_and_per_image_mean():
    # image 1: gt (1, 2), pred (2, 2); pixel with gt 20 is beyond max depth 10 and ignored
    gt1 = torch.tensor([[[1.0, 2.0, 20.0]]])
    pred1 = torch.tensor([[[2.0, 2.0, 2.0]]])
    # image 2: perfect
    gt2 = torch.tensor([[[4.0, 4.0, 0.0]]])
    pred2 = torch.tensor([[[4.0, 4.0, 9.0]]])
    m = DepthMetrics(min_depth=1e-3, max_depth=10.0)
    m.update(torch.cat([pred1, pred2]), torch.cat([gt1, gt2]))
    r = m.compute()
    # image 1: rmse sqrt((1+0)/2); abs_rel (1/1 + 0)/2 = 0.5; d1: ratios (2, 1) -> 0.5; image 2 all zeros / ones
    assert r["rmse"].item() == pytest.approx(math.sqrt(0.5) / 2)
    assert r["abs_rel"].item() == pytest.approx(0.25)
    assert r["d1"].item() == pytest.approx(0.75)
    assert r["d3"].item() == pytest.approx(0.75)   # ratio 2 > 1.25^3 = 1.95
    d = torch.tensor([math.log(2.0), 0.0])
    silog1 = math.sqrt((d ** 2).mean().item() - 0.5 * d.mean().item() ** 2)
    assert r["silog_mmseg"].item() == pytest.approx(silog1 / 2)
    assert r["log10"].item() == pytest.approx(math.log10(2) / 2 / 2)
    ref = _mmseg([(torch.cat([pred1, pred2]), torch.cat([gt1, gt2]))], 1e-3, 10.0)
    for k in MMSEG_METRICS:
        assert r[k].item() == pytest.approx(ref[k], rel=1e-6, abs=1e-9), k


def test_image_without_valid_pixels_is_skipped_and_extra_mask():
    m = DepthMetrics(min_depth=0.1, max_depth=10.0)
    m.update(torch.ones(1, 2, 2), torch.zeros(1, 2, 2))      # no valid pixel
    assert math.isnan(m.compute()["rmse"].item())
    m.update(torch.tensor([[[1.0, 5.0]]]), torch.tensor([[[1.0, 2.0]]]), valid=torch.tensor([[[True, False]]]))
    assert m.compute()["rmse"].item() == 0.0 and m.images.item() == 1
