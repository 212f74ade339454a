"""DAVIS-2017 semi-supervised scores, as davisvideochallenge/davis2017-evaluation computes them, vectorised over
frames: J (region IoU per object and frame), F (boundary F-measure), and per object their mean, recall (share of
frames above 0.5) and decay (mean of the first quarter of the frames minus the last quarter).

As the tool: the first and last frame are not scored; void (255) counts as background; the objects are the ids
1..max of the first annotation; a frame where an object is absent from both masks scores J = F = 1; F matches
one-pixel boundaries (``boundaries``, the tool's ``_seg2bmap``) within ``ceil(0.008 * image diagonal)`` pixels
(a disk, OpenCV's ``dilate`` as the tool). Tested equal to the transcription in ``official/davis2017_evaluation.py``.

>>> gt = np.zeros((4, 8, 8), np.uint8); gt[:, 2:6, 2:6] = 1
>>> [round(float(o.j_mean), 3) for o in sequence_scores("s", gt, gt)]
[1.0]
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

BOUND_TH = 0.008  # the tool's bound_th: boundary tolerance as a share of the image diagonal
MEASURES = ("J&F-Mean", "J-Mean", "J-Recall", "J-Decay", "F-Mean", "F-Recall", "F-Decay")


@dataclass
class ObjectScore:
    """One object of one sequence: J and F per scored frame and their statistics."""
    sequence: str
    object_id: int
    j: np.ndarray
    f: np.ndarray

    @property
    def j_stats(self) -> tuple[float, float, float]:
        return statistics(self.j)

    @property
    def f_stats(self) -> tuple[float, float, float]:
        return statistics(self.f)

    @property
    def j_mean(self) -> float:
        return self.j_stats[0]

    def to_dict(self) -> dict:
        (jm, jr, jd), (fm, fr, fd) = self.j_stats, self.f_stats
        return {"sequence": self.sequence, "object": self.object_id, "J-Mean": jm, "J-Recall": jr, "J-Decay": jd,
                "F-Mean": fm, "F-Recall": fr, "F-Decay": fd}


def disk(radius: float) -> np.ndarray:
    """scikit-image's ``disk(radius)`` (uint8): the pixels within Euclidean distance ``radius`` of the centre."""
    L = np.arange(-radius, radius + 1)
    X, Y = np.meshgrid(L, L)
    return ((X ** 2 + Y ** 2) <= radius ** 2).astype(np.uint8)


def region_j(gt: np.ndarray, pred: np.ndarray) -> np.ndarray:
    """J per frame of boolean (..., H, W) masks; 1 where both are empty."""
    inter = np.sum(gt & pred, axis=(-2, -1))
    union = np.sum(gt | pred, axis=(-2, -1))
    with np.errstate(invalid="ignore", divide="ignore"):
        j = inter / union
    return np.where(union == 0, 1.0, j)


def boundaries(seg: np.ndarray) -> np.ndarray:
    """One-pixel boundary maps of boolean (..., H, W) masks: a pixel differs from its east, south or south-east
    neighbour (the last row and column compare along themselves only): the tool's ``_seg2bmap`` per frame."""
    e, s, se = np.zeros_like(seg), np.zeros_like(seg), np.zeros_like(seg)
    e[..., :, :-1] = seg[..., :, 1:]
    s[..., :-1, :] = seg[..., 1:, :]
    se[..., :-1, :-1] = seg[..., 1:, 1:]
    b = (seg ^ e) | (seg ^ s) | (seg ^ se)
    b[..., -1, :] = seg[..., -1, :] ^ e[..., -1, :]
    b[..., :, -1] = seg[..., :, -1] ^ s[..., :, -1]
    b[..., -1, -1] = False
    return b


def _dilate(bmaps: np.ndarray, footprint: np.ndarray) -> np.ndarray:
    import cv2  # opencv-python: a dependency of the pinned mmcv-lite / mmengine
    return np.stack([cv2.dilate(b.astype(np.uint8), footprint) for b in bmaps]).astype(bool)


def _crop(gt: np.ndarray, pred: np.ndarray, margin: int) -> tuple[np.ndarray, np.ndarray]:
    """Both (N, H, W) stacks cut to the box around every foreground pixel, ``margin`` wider (clipped to the frame):
    every boundary pixel and its whole disk lie inside, and a cut edge runs through background (the boundary
    rule's last row and column stay the frame's where the box reaches them), so the counts are the frame's."""
    rows, cols = np.nonzero(np.any(gt | pred, axis=(0, 2)))[0], np.nonzero(np.any(gt | pred, axis=(0, 1)))[0]
    if rows.size == 0:
        return gt[:, :1, :1], pred[:, :1, :1]
    y0, y1 = max(0, rows[0] - margin), min(gt.shape[1], rows[-1] + margin + 1)
    x0, x1 = max(0, cols[0] - margin), min(gt.shape[2], cols[-1] + margin + 1)
    return gt[:, y0:y1, x0:x1], pred[:, y0:y1, x0:x1]


def boundary_f(gt: np.ndarray, pred: np.ndarray, bound_th: float = BOUND_TH) -> np.ndarray:
    """F per frame of boolean (N, H, W) masks: boundary precision and recall within the tolerance."""
    radius = bound_th if bound_th >= 1 else np.ceil(bound_th * np.linalg.norm(gt.shape[-2:]))
    footprint = disk(float(radius))
    gt, pred = _crop(gt, pred, int(radius) + 1)
    b_pred, b_gt = boundaries(pred), boundaries(gt)
    fg_match = np.sum(b_pred & _dilate(b_gt, footprint), axis=(-2, -1))
    gt_match = np.sum(b_gt & _dilate(b_pred, footprint), axis=(-2, -1))
    n_fg, n_gt = np.sum(b_pred, axis=(-2, -1)), np.sum(b_gt, axis=(-2, -1))
    with np.errstate(invalid="ignore", divide="ignore"):
        precision = np.where(n_fg == 0, 1.0, fg_match / n_fg.astype(np.float64))
        recall = np.where(n_gt == 0, 1.0, gt_match / n_gt.astype(np.float64))
    precision = np.where((n_fg > 0) & (n_gt == 0), 0.0, precision)
    recall = np.where((n_fg == 0) & (n_gt > 0), 0.0, recall)
    with np.errstate(invalid="ignore", divide="ignore"):
        f = 2 * precision * recall / (precision + recall)
    return np.where(precision + recall == 0, 0.0, f)


def statistics(per_frame: np.ndarray) -> tuple[float, float, float]:
    """(mean, recall, decay) as the tool's ``db_statistics``. Its bin edges are cast to uint8 (they wrap past 255
    scored frames); here they are integers, the same for every DAVIS-2017 sequence (at most 104 frames)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=RuntimeWarning)
        mean, recall = np.nanmean(per_frame), np.nanmean(per_frame > 0.5)
    ids = (np.round(np.linspace(1, len(per_frame), 5) + 1e-10) - 1).astype(np.int64)
    bins = [per_frame[ids[i]:ids[i + 1] + 1] for i in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=RuntimeWarning)
        decay = np.nanmean(bins[0]) - np.nanmean(bins[3])
    return float(mean), float(recall), float(decay)


def sequence_scores(name: str, gt: np.ndarray, pred: np.ndarray) -> list[ObjectScore]:
    """Every object of one sequence. ``gt`` / ``pred``: (T, H, W) integer index maps of all T frames (the
    annotations and the propagated masks as their PNGs hold them); frames 1..T-2 are scored."""
    gt, pred = np.asarray(gt), np.asarray(pred)
    if gt.shape != pred.shape or gt.ndim != 3 or gt.shape[0] < 3:
        raise ValueError(f"sequence {name}: annotations {gt.shape} and masks {pred.shape} must both be (T, H, W) "
                         "with the same frames, T >= 3 (the first and last frame are not scored)")
    gt = np.where(gt == 255, 0, gt)
    n_objects = int(gt[0].max())
    scored_gt, scored_pred = gt[1:-1], pred[1:-1]
    if scored_pred.max() > n_objects:
        raise ValueError(f"sequence {name}: the masks hold object id {int(scored_pred.max())}, but its first "
                         f"annotation has {n_objects} objects")
    out = []
    for k in range(1, n_objects + 1):
        g, p = scored_gt == k, scored_pred == k
        out.append(ObjectScore(name, k, region_j(g, p), boundary_f(g, p)))
    return out


def summarize(objects: list[ObjectScore]) -> dict[str, float]:
    """The tool's global table (``evaluation_method.py``): each measure averaged over every object of every
    sequence; J&F-Mean = (J-Mean + F-Mean) / 2. Figures as fractions, as the tool prints them."""
    if not objects:
        raise ValueError("no object to score")
    j = np.array([o.j_stats for o in objects])
    f = np.array([o.f_stats for o in objects])
    jm, jr, jd = (np.mean(np.ascontiguousarray(j[:, i])) for i in range(3))
    fm, fr, fd = (np.mean(np.ascontiguousarray(f[:, i])) for i in range(3))
    return dict(zip(MEASURES, map(float, [(jm + fm) / 2.0, jm, jr, jd, fm, fr, fd])))
