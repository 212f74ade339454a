"""SUN RGB-D and KITTI depth evaluation against the depth toolbox's own functions, on the real fixtures.

The ``_tb_*`` functions are transcribed from zhyever/Monocular-Depth-Estimation-Toolbox (commit d8aff50):
``depth/core/evaluation/metrics.py`` (calculate, metrics, pre_eval_to_metrics), ``depth/datasets/sunrgbd.py``
(eval_mask, pre_eval), ``depth/datasets/kitti.py`` (eval_kb_crop, eval_mask with garg_crop, pre_eval) and
``depth/datasets/pipelines/transforms.py`` (KBCrop). They read the files with PIL/numpy, not our loaders.
"""
from collections import OrderedDict

import numpy as np
import pytest
import torch
from PIL import Image

from datamodules import build_dataset
from probes.dense.depth_metric import DepthMetrics
from probes.core.task_table import depth_eval_settings

# --------------------------------------------------------------------------- toolbox, transcribed


def _tb_calculate(gt, pred):
    if gt.shape[0] == 0:
        return np.nan, np.nan, np.nan, np.nan, np.nan, np.nan, np.nan, np.nan, np.nan
    thresh = np.maximum((gt / pred), (pred / gt))
    a1 = (thresh < 1.25).mean()
    a2 = (thresh < 1.25 ** 2).mean()
    a3 = (thresh < 1.25 ** 3).mean()
    abs_rel = np.mean(np.abs(gt - pred) / gt)
    sq_rel = np.mean(((gt - pred) ** 2) / gt)
    rmse = (gt - pred) ** 2
    rmse = np.sqrt(rmse.mean())
    rmse_log = (np.log(gt) - np.log(pred)) ** 2
    rmse_log = np.sqrt(rmse_log.mean())
    err = np.log(pred) - np.log(gt)
    silog = np.sqrt(np.mean(err ** 2) - np.mean(err) ** 2) * 100
    if np.isnan(silog):
        silog = 0
    log_10 = (np.abs(np.log10(gt) - np.log10(pred))).mean()
    return a1, a2, a3, abs_rel, rmse, log_10, rmse_log, silog, sq_rel


def _tb_metrics(gt, pred, min_depth=1e-3, max_depth=80):
    mask = np.logical_and(gt > min_depth, gt < max_depth)
    return _tb_calculate(gt[mask], pred[mask])


def _tb_pre_eval_to_metrics(pre_eval_results):
    r = tuple(zip(*pre_eval_results))
    names = ["a1", "a2", "a3", "abs_rel", "rmse", "log_10", "rmse_log", "silog", "sq_rel"]
    return OrderedDict((n, np.nanmean(r[i])) for i, n in enumerate(names))


def _tb_sun_eval_mask(depth_gt, min_depth=1e-3, max_depth=10):
    depth_gt = np.squeeze(depth_gt)
    valid_mask = np.logical_and(depth_gt > min_depth, depth_gt < max_depth)
    eval_mask = np.zeros(valid_mask.shape)
    eval_mask[45:471, 41:601] = 1
    valid_mask = np.logical_and(valid_mask, eval_mask)
    return np.expand_dims(valid_mask, axis=0)


def _tb_sun_pre_eval(pred, depth_map):
    depthVisData = np.asarray(Image.open(depth_map, 'r'), np.uint16)
    depthInpaint = np.bitwise_or(np.right_shift(depthVisData, 3), np.left_shift(depthVisData, 16 - 3))
    depthInpaint = depthInpaint.astype(np.single) / 1000
    depthInpaint[depthInpaint > 8] = 8
    pred[pred > 8] = 8
    depth_map_gt = np.expand_dims(depthInpaint.astype(np.float32), axis=0)
    valid_mask = _tb_sun_eval_mask(depth_map_gt)
    return _tb_metrics(depth_map_gt[valid_mask], pred[valid_mask])


def _tb_kb_crop_image(img, height=352, width=1216):  # KBCrop(depth=False) on the (H, W, 3) image
    top_margin = int(img.shape[0] - height)
    left_margin = int((img.shape[1] - width) / 2)
    return img[top_margin:top_margin + height, left_margin:left_margin + width, :]


def _tb_kitti_eval_kb_crop(depth_gt):
    height, width = depth_gt.shape[0], depth_gt.shape[1]
    top_margin = int(height - 352)
    left_margin = int((width - 1216) / 2)
    depth_cropped = depth_gt[top_margin: top_margin + 352, left_margin: left_margin + 1216]
    return np.expand_dims(depth_cropped, axis=0)


def _tb_kitti_eval_mask(depth_gt, min_depth=1e-3, max_depth=80):  # garg_crop=True
    depth_gt = np.squeeze(depth_gt)
    valid_mask = np.logical_and(depth_gt > min_depth, depth_gt < max_depth)
    gt_height, gt_width = depth_gt.shape
    eval_mask = np.zeros(valid_mask.shape)
    eval_mask[int(0.40810811 * gt_height):int(0.99189189 * gt_height),
              int(0.03594771 * gt_width):int(0.96405229 * gt_width)] = 1
    valid_mask = np.logical_and(valid_mask, eval_mask)
    return np.expand_dims(valid_mask, axis=0)


def _tb_kitti_pre_eval(pred, depth_map, depth_scale=256):
    depth_map_gt = np.asarray(Image.open(depth_map), dtype=np.float32) / depth_scale
    depth_map_gt = _tb_kitti_eval_kb_crop(depth_map_gt)
    valid_mask = _tb_kitti_eval_mask(depth_map_gt)
    return _tb_metrics(depth_map_gt[valid_mask], pred[valid_mask], min_depth=1e-3, max_depth=80)


# --------------------------------------------------------------------------- ours vs the toolbox

_OURS_TO_TB = {"d1": "a1", "d2": "a2", "d3": "a3", "abs_rel": "abs_rel", "sq_rel": "sq_rel", "rmse": "rmse",
               "rmse_log": "rmse_log", "log10": "log_10", "silog_toolbox": "silog"}


def _ours(dataset, preds, gts):
    lo, hi, crop, clip = depth_eval_settings(dataset)
    m = DepthMetrics(min_depth=lo, max_depth=hi, crop=crop, clip=clip)
    for p, g in zip(preds, gts):
        m.update(p[None], g[None])
    return {k: v.item() for k, v in m.compute().items()}


def _assert_equal(ours, ref):
    for k, tk in _OURS_TO_TB.items():
        assert ours[k] == pytest.approx(float(ref[tk]), rel=1e-4, abs=1e-6), k


def _predictions(gt: np.ndarray, seed: int, scale: float) -> list[np.ndarray]:
    """Plausible predictions of one gt map: noisy, biased, and one far too deep (many values > 8 m)."""
    rng = np.random.default_rng(seed)
    base = np.where(gt > 0, gt, scale).astype(np.float32)
    return [(base * np.exp(rng.normal(0, s, gt.shape))).astype(np.float32) + off
            for s, off in ((0.1, 0.0), (0.3, 0.5), (0.05, scale))]


def test_sunrgbd_protocol_matches_toolbox(fixtures_root):
    root = fixtures_root / "sunrgbd"
    ds = build_dataset("sunrgbd", root, "test")
    depth_file = root / open(root / "SUNRGBD_val_splits.txt").read().split()[1]
    gt = ds[0]["depth"]
    assert gt.shape == (480, 640) and float(gt.max()) > 8.0  # the fixture has depths beyond the 8 m clip
    preds = _predictions(gt.numpy(), 0, 3.0)
    ref = _tb_pre_eval_to_metrics([_tb_sun_pre_eval(p[None].copy(), depth_file) for p in preds])
    ours = _ours("sunrgbd", [torch.from_numpy(p) for p in preds], [gt] * len(preds))
    _assert_equal(ours, ref)
    # decisive: without the clip, or without the crop, the numbers differ
    no_clip = DepthMetrics(min_depth=1e-3, max_depth=10.0, crop=depth_eval_settings("sunrgbd")[2])
    no_crop = DepthMetrics(min_depth=1e-3, max_depth=10.0, clip=8.0)
    for m in (no_clip, no_crop):
        for p in preds:
            m.update(torch.from_numpy(p)[None], gt[None])
        assert abs(m.compute()["rmse"].item() - ours["rmse"]) > 1e-3


def test_sunrgbd_eigen_crop_is_absolute_on_other_frame_sizes():
    # SUN frames are not all 480x640 (e.g. 530x730): the toolbox slices [45:471, 41:601] as is
    gt = torch.full((530, 730), 3.0)
    ref = _tb_sun_eval_mask(gt.numpy()[None])[0]
    from datamodules.depth_protocol import eval_depth_mask
    assert torch.equal(eval_depth_mask("sunrgbd", gt), torch.from_numpy(ref))
    assert int(eval_depth_mask("sunrgbd", torch.full((300, 400), 12.0)).sum()) == (300 - 45) * (400 - 41)


def test_kitti_kb_crop_and_garg_protocol_match_toolbox(fixtures_root):
    root = fixtures_root / "kitti"
    line = open(root / "splits/eigen_test_files_with_gt.txt").read().split()
    rgb_file = root / "raw" / line[0]
    depth_file = next(root.glob(f"depth/*/{line[1]}"))
    item = build_dataset("kitti", root, "test")[0]
    # input and gt KB-cropped to 352x1216 from the 375x1242 frame (top 23, left 13)
    raw = np.asarray(Image.open(rgb_file).convert("RGB"))
    assert raw.shape == (375, 1242, 3)
    assert torch.equal(item["image"], torch.from_numpy(_tb_kb_crop_image(raw).copy()).permute(2, 0, 1))
    tb_gt = _tb_kitti_eval_kb_crop(np.asarray(Image.open(depth_file), dtype=np.float32) / 256)[0]
    assert torch.equal(item["depth"], torch.from_numpy(tb_gt.copy()))
    gt = item["depth"]
    preds = _predictions(gt.numpy(), 1, 20.0)
    ref = _tb_pre_eval_to_metrics([_tb_kitti_pre_eval(p[None], depth_file) for p in preds])
    _assert_equal(_ours("kitti", [torch.from_numpy(p) for p in preds], [gt] * len(preds)), ref)
    # the Garg fractions of the cropped map (352x1216): rows 143:349, cols 43:1172
    from datamodules.depth_protocol import crop_mask
    m = crop_mask("garg", 352, 1216)
    assert m.nonzero()[:, 0].min() == 143 and m.nonzero()[:, 0].max() == 348
    assert m.nonzero()[:, 1].min() == 43 and m.nonzero()[:, 1].max() == 1171


def test_kitti_kb_crop_can_be_turned_off_and_small_frames_refused(fixtures_root):
    item = build_dataset("kitti", fixtures_root / "kitti", "test", kb_crop=False)[0]
    assert item["image"].shape[-2:] == (375, 1242) and item["depth"].shape == (375, 1242)
    from datamodules.depth_protocol import kb_crop_box
    assert kb_crop_box(375, 1242) == (23, 13, 352, 1216) and kb_crop_box(376, 1241) == (24, 12, 352, 1216)
    with pytest.raises(ValueError, match="at least 352x1216"):
        kb_crop_box(350, 1242)


def test_two_silogs_hand_worked():
    # d = log(pred/gt) = (log 2, 0): mmseg sqrt(mean d^2 - 0.5 mean(d)^2); toolbox 100 sqrt(var d)
    gt, pred = torch.tensor([[[1.0, 2.0]]]), torch.tensor([[[2.0, 2.0]]])
    m = DepthMetrics(max_depth=10.0)
    m.update(pred, gt)
    r = m.compute()
    l2 = float(np.log(2))
    assert r["silog_mmseg"].item() == pytest.approx(np.sqrt(l2 ** 2 / 2 - 0.5 * (l2 / 2) ** 2))
    assert r["silog_toolbox"].item() == pytest.approx(100 * l2 / 2)
    assert _tb_calculate(gt.numpy().ravel(), pred.numpy().ravel())[7] == pytest.approx(100 * l2 / 2)


def test_kitti_eigen_crop_is_kittis_own_not_nyus():
    """``crop='eigen'`` on KITTI: BTS's / the toolbox's ``eigen_crop`` for KITTI (transcribed here), not NYU's
    fractions (before: silently NYU's rows 45/480..471/480)."""
    from datamodules.depth_protocol import eval_depth_mask
    gt = torch.full((352, 1216), 5.0)
    gt[300, 600] = 0.0  # invalid pixel inside the crop
    gt_height, gt_width = gt.shape
    ref = np.zeros((gt_height, gt_width), dtype=bool)
    ref[int(0.3324324 * gt_height):int(0.91351351 * gt_height),
        int(0.0359477 * gt_width):int(0.96405229 * gt_width)] = 1
    ref &= (gt.numpy() > 1e-3) & (gt.numpy() < 80)
    assert np.array_equal(eval_depth_mask("kitti", gt, crop="eigen").numpy(), ref)
    assert not np.array_equal(eval_depth_mask("nyuv2", gt, crop="eigen").numpy(), ref)
