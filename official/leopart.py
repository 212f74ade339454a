"""MkuuWaUjinga/leopart (commit 7835701338d477c70d581c0a10e594257dcac198), transcribed: the overclustering
evaluation, the reference of tests/test_probe_cluster.py. vpariza/NeCo (commit 393216026b4d045e2e0b803f70a7d89d9a58937e)
runs the same functions (its ``experiments/utils.py`` differs only in torchmetrics arguments and the
``PredsmIoUKmeans`` seed, which overclustering does not use; ``eval_overcluster.py`` = ``sup_overcluster.py`` plus a
``seed_everything``).

- ``experiments/utils.py``: ``normalize_and_transform``, ``cluster``, ``PredsmIoU.compute_miou``, ``get_score``,
  ``compute_score_matrix``, ``_hungarian_match``, ``_original_match``;
- ``experiments/overcluster/sup_overcluster.py``: ``Overcluster.validation_step`` (the mask part) and
  ``Overcluster.validation_epoch_end``, here ``overcluster_eval``.

Deviations that change no number: ``PredsmIoU`` keeps its gt / pred lists without the torchmetrics base class; the
score matrix is filled by a plain loop instead of joblib's ``Parallel`` (same pairs, same order); prints dropped;
``overcluster_eval`` takes the tokens and masks that ``validation_step`` would have collected and returns the
per-seed mIoU list that the reference prints. Nothing here imports the project.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Tuple

import faiss
import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment
from sklearn.preprocessing import StandardScaler


def normalize_and_transform(feats: torch.Tensor, pca_dim: int) -> torch.Tensor:
    feats = feats.numpy()
    # Iteratively train scaler to normalize data
    bs = 100000
    num_its = (feats.shape[0] // bs) + 1
    scaler = StandardScaler()
    for i in range(num_its):
        scaler.partial_fit(feats[i * bs:(i + 1) * bs])
    for i in range(num_its):
        feats[i * bs:(i + 1) * bs] = scaler.transform(feats[i * bs:(i + 1) * bs])
    # Do PCA
    pca = faiss.PCAMatrix(feats.shape[-1], pca_dim)
    pca.train(feats)
    assert pca.is_trained
    transformed_val = pca.apply_py(feats)
    return torch.from_numpy(transformed_val)


def cluster(pca_dim: int, transformed_feats: np.ndarray, spatial_res: int, k: int, seed: int = 1,
            mask: torch.Tensor = None, spherical: bool = False):
    kmeans = faiss.Kmeans(pca_dim, k, niter=100, nredo=5, verbose=False,
                          gpu=False, spherical=spherical, seed=seed)
    kmeans.train(transformed_feats)
    _, pred_labels = kmeans.index.search(transformed_feats, 1)
    clusters = pred_labels.squeeze()

    # Apply fg mask if provided.
    if mask is not None:
        preds = torch.zeros_like(mask) + k
        preds[mask.bool()] = torch.from_numpy(clusters).float()
    else:
        preds = torch.from_numpy(clusters.reshape(-1, 1, spatial_res, spatial_res))
    return preds


class PredsmIoU:
    def __init__(self, num_pred_classes: int, num_gt_classes: int):
        self.num_pred_classes = num_pred_classes
        self.num_gt_classes = num_gt_classes
        self.gt, self.pred = [], []

    def update(self, gt: torch.Tensor, pred: torch.Tensor) -> None:
        self.gt.append(gt)
        self.pred.append(pred)

    def compute(self, is_global_zero: bool, many_to_one: bool = False, precision_based: bool = False,
                linear_probe: bool = False):
        if is_global_zero:
            pred = torch.cat(self.pred).cpu().numpy().astype(int)
            gt = torch.cat(self.gt).cpu().numpy().astype(int)
            assert len(np.unique(pred)) <= self.num_pred_classes
            assert np.max(pred) <= self.num_pred_classes
            return self.compute_miou(gt, pred, self.num_pred_classes, self.num_gt_classes, many_to_one=many_to_one,
                                     precision_based=precision_based, linear_probe=linear_probe)

    def compute_miou(self, gt: np.ndarray, pred: np.ndarray, num_pred: int, num_gt: int,
                     many_to_one=False, precision_based=False, linear_probe=False):
        assert pred.shape == gt.shape
        tp = [0] * num_gt
        fp = [0] * num_gt
        fn = [0] * num_gt
        jac = [0] * num_gt

        if linear_probe:
            reordered_preds = pred
            matched_bg_clusters = {}
        else:
            if many_to_one:
                match = self._original_match(num_pred, num_gt, pred, gt, precision_based=precision_based)
                # remap predictions
                reordered_preds = np.zeros(len(pred))
                for target_i, matched_preds in match.items():
                    for pred_i in matched_preds:
                        reordered_preds[pred == int(pred_i)] = int(target_i)
                matched_bg_clusters = len(match[0]) / num_pred
            else:
                match = self._hungarian_match(num_pred, num_gt, pred, gt)
                # remap predictions
                reordered_preds = np.zeros(len(pred))
                for target_i, pred_i in zip(*match):
                    reordered_preds[pred == int(pred_i)] = int(target_i)
                # merge all unmatched predictions to background
                for unmatched_pred in np.delete(np.arange(num_pred), np.array(match[1])):
                    reordered_preds[pred == int(unmatched_pred)] = 0
                matched_bg_clusters = 1 / num_gt

        # tp, fp, and fn evaluation
        for i_part in range(0, num_gt):
            tmp_all_gt = (gt == i_part)
            tmp_pred = (reordered_preds == i_part)
            tp[i_part] += np.sum(tmp_all_gt & tmp_pred)
            fp[i_part] += np.sum(~tmp_all_gt & tmp_pred)
            fn[i_part] += np.sum(tmp_all_gt & ~tmp_pred)

        # Calculate IoU per class
        for i_part in range(0, num_gt):
            jac[i_part] = float(tp[i_part]) / max(float(tp[i_part] + fp[i_part] + fn[i_part]), 1e-8)

        return np.mean(jac), tp, fp, fn, reordered_preds.astype(int).tolist(), matched_bg_clusters

    @staticmethod
    def get_score(flat_preds: np.ndarray, flat_targets: np.ndarray, c1: int, c2: int,
                  precision_based: bool = False) -> float:
        tmp_all_gt = (flat_targets == c1)
        tmp_pred = (flat_preds == c2)
        tp = np.sum(tmp_all_gt & tmp_pred)
        fp = np.sum(~tmp_all_gt & tmp_pred)
        if not precision_based:
            fn = np.sum(tmp_all_gt & ~tmp_pred)
            jac = float(tp) / max(float(tp + fp + fn), 1e-8)
            return jac
        else:
            prec = float(tp) / max(float(tp + fp), 1e-8)
            return prec

    def compute_score_matrix(self, num_pred: int, num_gt: int, pred: np.ndarray, gt: np.ndarray,
                             precision_based: bool = False) -> np.ndarray:
        score_mat = [self.get_score(pred, gt, c1, c2, precision_based=precision_based)
                     for c2 in range(num_pred) for c1 in range(num_gt)]
        score_mat = np.array(score_mat)
        return score_mat.reshape((num_pred, num_gt)).T

    def _hungarian_match(self, num_pred: int, num_gt: int, pred: np.ndarray,
                         gt: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        # do hungarian matching. If num_pred > num_gt match will be partial only.
        iou_mat = self.compute_score_matrix(num_pred, num_gt, pred, gt)
        match = linear_sum_assignment(1 - iou_mat)
        return match

    def _original_match(self, num_pred, num_gt, pred, gt, precision_based=False) -> Dict[int, list]:
        score_mat = self.compute_score_matrix(num_pred, num_gt, pred, gt, precision_based=precision_based)
        preds_to_gts = {}
        preds_to_gt_scores = {}
        # Greedily match predicted class to ground-truth class by best score.
        for pred_c in range(num_pred):
            for gt_c in range(num_gt):
                score = score_mat[gt_c, pred_c]
                if (pred_c not in preds_to_gts) or (score > preds_to_gt_scores[pred_c]):
                    preds_to_gts[pred_c] = gt_c
                    preds_to_gt_scores[pred_c] = score
        gt_to_matches = defaultdict(list)
        for k, v in preds_to_gts.items():
            gt_to_matches[v].append(k)
        return gt_to_matches


def overcluster_eval(tokens: torch.Tensor, masks: torch.Tensor, k: int, num_classes: int, spatial_res: int,
                     num_seeds: int = 5, pca_dim: int = 50, ignore_index: int = 255,
                     mask_eval_size: int = 100) -> List[float]:
    """``validation_step`` (masks part) + ``validation_epoch_end``: ``tokens`` (N * spatial_res², D) in image then
    raster order, ``masks`` (N, 1, S, S) float class ids (after the reference's ``masks *= 255``). Returns the mIoU
    of each seed (the reference prints them and their mean)."""
    # Downsample masks to self.masks_eval_size
    if masks.size(3) != mask_eval_size:
        masks = F.interpolate(masks, size=(mask_eval_size, mask_eval_size), mode='nearest')
    normalized_feats = normalize_and_transform(tokens, pca_dim)
    clusterings = []
    for i in range(num_seeds):
        clusterings.append(cluster(pca_dim, normalized_feats.numpy(), spatial_res, k, seed=i))

    results = []
    for clustering in clusterings:
        clustering = F.interpolate(clustering.float(), size=(mask_eval_size, mask_eval_size),
                                   mode='nearest')
        metric = PredsmIoU(k, num_classes)
        metric.update(masks[masks != ignore_index], clustering[masks != ignore_index])
        if k == num_classes:
            results.append(metric.compute(True, many_to_one=False, precision_based=False)[0])
        else:
            results.append(metric.compute(True, many_to_one=True, precision_based=True)[0])
    return results
