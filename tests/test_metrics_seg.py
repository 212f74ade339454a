"""SegmentationMetrics against mmsegmentation's IoUMetric and hand-worked numbers."""
import math

import numpy as np
import pytest
import torch

from probes.dense.seg_metric import SegmentationMetrics
from tokenmix.mmseg_compat import import_mmseg

import_mmseg()
from mmseg.evaluation import IoUMetric  # noqa: E402


def _mmseg(batches, num_classes):
    """mmseg on the same predictions: the public process/compute_metrics path (percent, 2 decimals)
    and the unrounded per-class values from its own intersect/union helpers."""
    metric = IoUMetric(iou_metrics=["mIoU"])
    metric.dataset_meta = {"classes": [f"c{i}" for i in range(num_classes)]}
    for pred, gt in batches:
        metric.process({}, [{"pred_sem_seg": {"data": p[None]}, "gt_sem_seg": {"data": g[None]}}
                            for p, g in zip(pred, gt)])
    rounded = metric.compute_metrics(metric.results)
    inter, union, pred_area, label_area = (sum(x) for x in zip(*metric.results))
    exact = IoUMetric.total_area_to_metrics(inter, union, pred_area, label_area, ["mIoU"])
    return rounded, exact


def _ours(batches, num_classes):
    m = SegmentationMetrics(num_classes)
    for pred, gt in batches:
        m.update(pred, gt)
    return m.compute()


def _compare(batches, num_classes):
    rounded, exact = _mmseg(batches, num_classes)
    ours = _ours(batches, num_classes)
    np.testing.assert_allclose(ours["IoU"].numpy(), np.asarray(exact["IoU"]), rtol=1e-6, equal_nan=True)
    np.testing.assert_allclose(ours["mIoU"].item(), np.nanmean(np.asarray(exact["IoU"])), rtol=1e-6)
    np.testing.assert_allclose(ours["aAcc"].item(), float(exact["aAcc"]), rtol=1e-6)
    np.testing.assert_allclose(ours["mAcc"].item(), np.nanmean(np.asarray(exact["Acc"])), rtol=1e-6)
    assert round(ours["mIoU"].item() * 100, 2) == pytest.approx(rounded["mIoU"], abs=0.011)
    assert round(ours["aAcc"].item() * 100, 2) == pytest.approx(rounded["aAcc"], abs=0.011)
    return ours


def test_random_batches_match_mmseg_with_ignore_and_absent_classes():
    g = torch.Generator().manual_seed(0)
    num_classes = 7
    batches = []
    for _ in range(3):
        gt = torch.randint(0, 5, (2, 17, 23), generator=g)          # classes 5, 6 never in the labels
        gt[torch.rand(gt.shape, generator=g) < 0.2] = 255            # ignored pixels
        pred = torch.randint(0, 6, (2, 17, 23), generator=g)        # 5 is predicted but absent, 6 nowhere
        batches.append((pred, gt))
    ours = _compare(batches, num_classes)
    assert math.isnan(ours["IoU"][6].item())   # union 0: left out of the mean
    assert ours["IoU"][5].item() == 0.0        # predicted but absent: counts as 0


def test_logits_and_class_absent_from_one_batch():
    g = torch.Generator().manual_seed(1)
    gt1 = torch.zeros(1, 8, 8, dtype=torch.long)
    gt2 = torch.full((1, 8, 8), 2, dtype=torch.long)
    gt2[:, :2] = 255
    logits1 = torch.randn(1, 3, 8, 8, generator=g)
    logits2 = torch.randn(1, 3, 8, 8, generator=g)
    ours = SegmentationMetrics(3)
    ours.update(logits1, gt1)
    ours.update(logits2, gt2)
    res = ours.compute()
    rounded, exact = _mmseg([(logits1.argmax(1), gt1), (logits2.argmax(1), gt2)], 3)
    np.testing.assert_allclose(res["IoU"].numpy(), np.asarray(exact["IoU"]), rtol=1e-6, equal_nan=True)


def test_hand_worked():
    # gt:   0 0 | 1 1     pred: 0 1 | 1 1     ignore one extra pixel predicted 0
    gt = torch.tensor([[[0, 0, 1, 1, 255]]])
    pred = torch.tensor([[[0, 1, 1, 1, 0]]])
    res = _ours([(pred, gt)], 3)
    # class 0: I=1, U=2 -> 0.5; class 1: I=2, U=3 -> 2/3; class 2 absent -> NaN
    assert res["IoU"][0].item() == pytest.approx(0.5)
    assert res["IoU"][1].item() == pytest.approx(2 / 3)
    assert math.isnan(res["IoU"][2].item())
    assert res["mIoU"].item() == pytest.approx((0.5 + 2 / 3) / 2)
    assert res["aAcc"].item() == pytest.approx(0.75)
    _compare([(pred, gt)], 3)


def test_bad_labels_raise():
    m = SegmentationMetrics(3)
    with pytest.raises(ValueError, match="outside"):
        m.update(torch.zeros(1, 2, 2, dtype=torch.long), torch.full((1, 2, 2), 5))
    with pytest.raises(ValueError, match="upsample"):
        m.update(torch.zeros(1, 2, 2, dtype=torch.long), torch.zeros(1, 4, 4, dtype=torch.long))


def test_confusion_matrix_unaffected_by_global_deterministic_mode():
    # a deterministic Trainer earlier in the process must not change the result (nor blow up memory:
    # torchmetrics' deterministic fallback builds a pixels x C^2 matrix)
    import torch
    from torchmetrics.classification import MulticlassConfusionMatrix

    from probes.dense.seg_metric import SegmentationMetrics
    g = torch.Generator().manual_seed(0)
    preds = torch.randint(0, 150, (1, 512, 683), generator=g)
    target = torch.randint(0, 150, (1, 512, 683), generator=g)
    target[0, :10] = 255
    ref = MulticlassConfusionMatrix(150, ignore_index=255)
    ref.update(preds, target)
    torch.use_deterministic_algorithms(True)
    ours = SegmentationMetrics(150)
    ours.update(preds, target)
    assert torch.equal(ours.confmat, ref.confmat)
