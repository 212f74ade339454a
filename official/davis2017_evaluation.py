"""davisvideochallenge/davis2017-evaluation (commit ac7c43fca936f9722837b7fbd337d284ba37004b), transcribed: the
semi-supervised DAVIS-2017 scores.

- ``davis2017/metrics.py``: ``db_eval_iou`` (J), ``db_eval_boundary`` / ``f_measure`` (F: boundary precision and
  recall within ``ceil(0.008 * image diagonal)`` pixels, matched with ``cv2.dilate`` by a scikit-image disk) and
  ``_seg2bmap`` (one-pixel boundaries);
- ``davis2017/utils.py``: ``db_statistics`` (mean, recall = share of frames > 0.5, decay = first quarter minus last);
- ``davis2017/davis.py`` ``DAVIS.get_all_masks`` and ``davis2017/results.py`` ``Results.read_masks`` (one boolean
  mask per object; void 255 set to background; the object count from the first annotation);
- ``davis2017/evaluation.py`` ``DAVISEvaluation.evaluate`` / ``_evaluate_semisupervised`` (first and last frame
  left out, no void pixels in semi-supervised mode) and ``evaluation_method.py``'s global table.

``disk`` is scikit-image's ``skimage.morphology.disk`` (scikit-image 0.26.0, ``skimage/morphology/footprints.py``,
``decomposition=None``), which ``f_measure`` imports.

Deviations that change no number: masks are passed as arrays instead of read from PNG folders (the readers'
array code is kept: ``gt_object_masks`` / ``result_object_masks``); ``sys.exit`` on a result with more objects
than the ground truth is a ValueError; the per-object loop is ``evaluate_sequence`` + ``global_table``. Nothing here
imports the project.
"""
from __future__ import annotations

import math
import warnings

import cv2
import numpy as np


def disk(radius, dtype=np.uint8, *, strict_radius=True):
    L = np.arange(-radius, radius + 1)
    X, Y = np.meshgrid(L, L)
    if not strict_radius:
        radius += 0.5
    return np.array((X**2 + Y**2) <= radius**2, dtype=dtype)


def db_eval_iou(annotation, segmentation, void_pixels=None):
    assert annotation.shape == segmentation.shape, \
        f'Annotation({annotation.shape}) and segmentation:{segmentation.shape} dimensions do not match.'
    annotation = annotation.astype(bool)
    segmentation = segmentation.astype(bool)

    if void_pixels is not None:
        assert annotation.shape == void_pixels.shape, \
            f'Annotation({annotation.shape}) and void pixels:{void_pixels.shape} dimensions do not match.'
        void_pixels = void_pixels.astype(bool)
    else:
        void_pixels = np.zeros_like(segmentation)

    # Intersection between all sets
    inters = np.sum((segmentation & annotation) & np.logical_not(void_pixels), axis=(-2, -1))
    union = np.sum((segmentation | annotation) & np.logical_not(void_pixels), axis=(-2, -1))

    j = inters / union
    if j.ndim == 0:
        j = 1 if np.isclose(union, 0) else j
    else:
        j[np.isclose(union, 0)] = 1
    return j


def db_eval_boundary(annotation, segmentation, void_pixels=None, bound_th=0.008):
    assert annotation.shape == segmentation.shape
    if void_pixels is not None:
        assert annotation.shape == void_pixels.shape
    if annotation.ndim == 3:
        n_frames = annotation.shape[0]
        f_res = np.zeros(n_frames)
        for frame_id in range(n_frames):
            void_pixels_frame = None if void_pixels is None else void_pixels[frame_id, :, :, ]
            f_res[frame_id] = f_measure(segmentation[frame_id, :, :, ], annotation[frame_id, :, :],
                                        void_pixels_frame, bound_th=bound_th)
    elif annotation.ndim == 2:
        f_res = f_measure(segmentation, annotation, void_pixels, bound_th=bound_th)
    else:
        raise ValueError(f'db_eval_boundary does not support tensors with {annotation.ndim} dimensions')
    return f_res


def f_measure(foreground_mask, gt_mask, void_pixels=None, bound_th=0.008):
    assert np.atleast_3d(foreground_mask).shape[2] == 1
    if void_pixels is not None:
        void_pixels = void_pixels.astype(bool)
    else:
        void_pixels = np.zeros_like(foreground_mask).astype(bool)

    bound_pix = bound_th if bound_th >= 1 else \
        np.ceil(bound_th * np.linalg.norm(foreground_mask.shape))

    # Get the pixel boundaries of both masks
    fg_boundary = _seg2bmap(foreground_mask * np.logical_not(void_pixels))
    gt_boundary = _seg2bmap(gt_mask * np.logical_not(void_pixels))

    fg_dil = cv2.dilate(fg_boundary.astype(np.uint8), disk(bound_pix).astype(np.uint8))
    gt_dil = cv2.dilate(gt_boundary.astype(np.uint8), disk(bound_pix).astype(np.uint8))

    # Get the intersection
    gt_match = gt_boundary * fg_dil
    fg_match = fg_boundary * gt_dil

    # Area of the intersection
    n_fg = np.sum(fg_boundary)
    n_gt = np.sum(gt_boundary)

    # % Compute precision and recall
    if n_fg == 0 and n_gt > 0:
        precision = 1
        recall = 0
    elif n_fg > 0 and n_gt == 0:
        precision = 0
        recall = 1
    elif n_fg == 0 and n_gt == 0:
        precision = 1
        recall = 1
    else:
        precision = np.sum(fg_match) / float(n_fg)
        recall = np.sum(gt_match) / float(n_gt)

    # Compute F measure
    if precision + recall == 0:
        F = 0
    else:
        F = 2 * precision * recall / (precision + recall)

    return F


def _seg2bmap(seg, width=None, height=None):
    seg = seg.astype(bool)
    seg[seg > 0] = 1

    assert np.atleast_3d(seg).shape[2] == 1

    width = seg.shape[1] if width is None else width
    height = seg.shape[0] if height is None else height

    h, w = seg.shape[:2]

    ar1 = float(width) / float(height)
    ar2 = float(w) / float(h)

    assert not (
        width > w | height > h | abs(ar1 - ar2) > 0.01
    ), "Can" "t convert %dx%d seg to %dx%d bmap." % (w, h, width, height)

    e = np.zeros_like(seg)
    s = np.zeros_like(seg)
    se = np.zeros_like(seg)

    e[:, :-1] = seg[:, 1:]
    s[:-1, :] = seg[1:, :]
    se[:-1, :-1] = seg[1:, 1:]

    b = seg ^ e | seg ^ s | seg ^ se
    b[-1, :] = seg[-1, :] ^ e[-1, :]
    b[:, -1] = seg[:, -1] ^ s[:, -1]
    b[-1, -1] = 0

    if w == width and h == height:
        bmap = b
    else:
        bmap = np.zeros((height, width))
        for x in range(w):
            for y in range(h):
                if b[y, x]:
                    j = 1 + math.floor((y - 1) + height / h)
                    i = 1 + math.floor((x - 1) + width / h)
                    bmap[j, i] = 1

    return bmap


def db_statistics(per_frame_values):
    # strip off nan values
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=RuntimeWarning)
        M = np.nanmean(per_frame_values)
        O = np.nanmean(per_frame_values > 0.5)

    N_bins = 4
    ids = np.round(np.linspace(1, len(per_frame_values), N_bins + 1) + 1e-10) - 1
    ids = ids.astype(np.uint8)

    D_bins = [per_frame_values[ids[i]:ids[i + 1] + 1] for i in range(0, 4)]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=RuntimeWarning)
        D = np.nanmean(D_bins[0]) - np.nanmean(D_bins[3])

    return M, O, D


def gt_object_masks(masks):
    """``DAVIS.get_all_masks(seq, separate_objects_masks=True)`` on the stacked annotations (T, H, W)."""
    masks = np.asarray(masks, dtype=np.float64).copy()
    masks_void = np.zeros_like(masks)
    for i in range(masks.shape[0]):
        masks_void[i, ...] = masks[i, ...] == 255
        masks[i, masks[i, ...] == 255] = 0
    num_objects = int(np.max(masks[0, ...]))
    tmp = np.ones((num_objects, *masks.shape))
    tmp = tmp * np.arange(1, num_objects + 1)[:, None, None, None]
    masks = (tmp == masks[None, ...])
    masks = masks > 0
    return masks, masks_void


def result_object_masks(results):
    """``Results.read_masks`` on the stacked result PNGs (T, H, W)."""
    masks = np.asarray(results, dtype=np.float64)
    num_objects = int(np.max(masks))
    tmp = np.ones((num_objects, *masks.shape))
    tmp = tmp * np.arange(1, num_objects + 1)[:, None, None, None]
    masks = (tmp == masks[None, ...]) > 0
    return masks


def _evaluate_semisupervised(all_gt_masks, all_res_masks, all_void_masks, metric):
    if all_res_masks.shape[0] > all_gt_masks.shape[0]:
        raise ValueError("In your PNG files there is an index higher than the number of objects in the sequence!")
    elif all_res_masks.shape[0] < all_gt_masks.shape[0]:
        zero_padding = np.zeros((all_gt_masks.shape[0] - all_res_masks.shape[0], *all_res_masks.shape[1:]))
        all_res_masks = np.concatenate([all_res_masks, zero_padding], axis=0)
    j_metrics_res, f_metrics_res = np.zeros(all_gt_masks.shape[:2]), np.zeros(all_gt_masks.shape[:2])
    for ii in range(all_gt_masks.shape[0]):
        if 'J' in metric:
            j_metrics_res[ii, :] = db_eval_iou(all_gt_masks[ii, ...], all_res_masks[ii, ...], all_void_masks)
        if 'F' in metric:
            f_metrics_res[ii, :] = db_eval_boundary(all_gt_masks[ii, ...], all_res_masks[ii, ...], all_void_masks)
    return j_metrics_res, f_metrics_res


def evaluate_sequence(gt_labels, res_labels, metric=('J', 'F')):
    """One sequence of ``DAVISEvaluation.evaluate`` (semi-supervised): per object (J, F) per frame and the
    (M, R, D) statistics of each. ``gt_labels`` / ``res_labels``: (T, H, W) index maps of every frame."""
    all_gt_masks, _ = gt_object_masks(gt_labels)
    all_gt_masks = all_gt_masks[:, 1:-1, :, :]
    all_res_masks = result_object_masks(np.asarray(res_labels)[1:-1])
    j_metrics_res, f_metrics_res = _evaluate_semisupervised(all_gt_masks, all_res_masks, None, metric)
    objects = []
    for ii in range(all_gt_masks.shape[0]):
        objects.append({"J": j_metrics_res[ii], "F": f_metrics_res[ii],
                        "J_stats": db_statistics(j_metrics_res[ii]), "F_stats": db_statistics(f_metrics_res[ii])})
    return objects


def global_table(objects):
    """evaluation_method.py's ``g_res``: J&F-Mean, J-Mean, J-Recall, J-Decay, F-Mean, F-Recall, F-Decay over every
    object of every sequence."""
    J = {k: [o["J_stats"][i] for o in objects] for i, k in enumerate("MRD")}
    F = {k: [o["F_stats"][i] for o in objects] for i, k in enumerate("MRD")}
    final_mean = (np.mean(J["M"]) + np.mean(F["M"])) / 2.
    return dict(zip(['J&F-Mean', 'J-Mean', 'J-Recall', 'J-Decay', 'F-Mean', 'F-Recall', 'F-Decay'],
                    [final_mean, np.mean(J["M"]), np.mean(J["R"]), np.mean(J["D"]), np.mean(F["M"]),
                     np.mean(F["R"]), np.mean(F["D"])]))
