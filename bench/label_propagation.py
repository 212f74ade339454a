"""DAVIS label propagation: the transcribed official loop (``official/dino_video_segmentation.py``: the (hw)²
neighbourhood mask from four nested Python loops once per video, the dense (context·hw)² affinity per frame)
against ``probes/video/propagation.py`` (an index table per grid, only the neighbourhood's candidates), on the same
features of one fixture-like sequence at DAVIS's grid, backbone excluded (both would run the same one).

``run(quick=False) -> {"rows": [...], "speedup_val": official / ours, "identical_masks": ...}``. Full: 6 frames at a
30 x 52 grid (DAVIS 480p, 480 x 832 input at patch 16), D = 384 (ViT-S), 3 objects; quick: a 12 x 20 grid.
Also times our metrics per object-frame at 480 x 854 and a ViT-S/16 forward per frame at 480 x 832, the counts the
prediction of a full DAVIS val run in docs/probes/video.md multiplies.
"""
from __future__ import annotations

import copy
import queue
import time
from types import SimpleNamespace

import numpy as np
import torch

FULL = dict(frames=6, h=30, w=52, dim=384, objects=3, patch=16)
QUICK = dict(frames=4, h=12, w=20, dim=64, objects=2, patch=8)


def _inputs(cfg: dict):
    g = torch.Generator().manual_seed(0)
    T, h, w, D = cfg["frames"], cfg["h"], cfg["w"], cfg["dim"]
    base = torch.randn(1, h, w, D, generator=g)  # frames share structure, as a video does, with uneven norms
    feats = (base + 0.5 * torch.randn(T, h, w, D, generator=g)) * (0.5 + 4 * torch.rand(T, h, w, 1, generator=g))
    labels = torch.zeros(h, w, dtype=torch.long)
    for k in range(1, cfg["objects"] + 1):
        labels[k * h // (cfg["objects"] + 2):(k + 1) * h // (cfg["objects"] + 2), k * 3:k * 3 + w // 3] = k
    first = torch.nn.functional.one_hot(labels, cfg["objects"] + 1).permute(2, 0, 1).float()
    return feats, first


def official_loop(feats: torch.Tensor, first: torch.Tensor, patch: int, frame_hw) -> np.ndarray:
    """The official per-frame loop (eval_video_tracking_davis) on given features: soft maps -> label maps."""
    from PIL import Image

    from official import dino_video_segmentation as off
    T, h, w, D = feats.shape
    args = SimpleNamespace(n_last_frames=7, size_mask_neighborhood=12, topk=5, patch_size=patch)
    calls = iter(range(T))
    model = SimpleNamespace(patch_embed=SimpleNamespace(patch_size=patch), get_intermediate_layers=lambda x, n=1: [
        torch.cat([torch.zeros(1, 1, D), feats[next(calls)].reshape(1, h * w, D)], 1)])
    frame = torch.zeros(3, h * patch, w * patch)
    frame1_feat = off.extract_feature(model, frame).T
    que, mask, out = queue.Queue(args.n_last_frames), None, []
    for _ in range(1, T):
        used_feats = [frame1_feat] + [p[0] for p in list(que.queue)]
        used_segs = [first[None]] + [p[1] for p in list(que.queue)]
        avg, feat_tar, mask = off.label_propagation(args, model, frame, used_feats, used_segs, mask)
        if que.qsize() == args.n_last_frames:
            que.get()
        que.put([feat_tar, copy.deepcopy(avg)])
        up = torch.nn.functional.interpolate(avg, scale_factor=patch, mode="bilinear", align_corners=False,
                                             recompute_scale_factor=False)[0]
        seg = torch.max(off.norm_mask(up), dim=0)[1].numpy().astype(np.uint8)
        out.append(np.array(Image.fromarray(seg).resize((frame_hw[1], frame_hw[0]), 0)))
    return np.stack(out)


def ours(feats: torch.Tensor, first: torch.Tensor, patch: int, frame_hw) -> np.ndarray:
    from probes.video.propagation import PropagationOptions, label_maps, neighbourhood, propagate_video
    neighbourhood.cache_clear()  # the per-grid table counts, as the official mask does once per video
    return label_maps(propagate_video(feats, first, PropagationOptions()), patch, frame_hw)


def _metrics_per_object_frame(frames: int = 8) -> float:
    from probes.video.davis_metrics import sequence_scores
    gt = np.zeros((frames + 2, 480, 854), np.uint8)
    gt[:, 100:300, 200:500] = 1
    pred = np.roll(gt, 7, axis=2)
    t0 = time.perf_counter()
    sequence_scores("bench", gt, pred)
    return (time.perf_counter() - t0) / frames


def _vit_s16_frame_seconds(reps: int = 2) -> float:
    from backbones import create_vit
    vit = create_vit("vit_small_patch16", "softmax", seed=0).eval()
    x = torch.randn(1, 3, 480, 832)
    with torch.no_grad():
        vit.extract(x)
        t0 = time.perf_counter()
        for _ in range(reps):
            vit.extract(x)
    return (time.perf_counter() - t0) / reps


def run(quick: bool = False) -> dict:
    """Rows: the official mask build (once per video) and per-frame time, ours, and both projected to DAVIS val's
    counts (30 videos, 1999 frames, 1969 of them propagated) at this grid: ratio = ours / official."""
    from official import dino_video_segmentation as off
    cfg = QUICK if quick else FULL
    feats, first = _inputs(cfg)
    frame_hw = (cfg["h"] * cfg["patch"], cfg["w"] * cfg["patch"] + 22)  # 480 x 854 at full size
    t0 = time.perf_counter()
    off.restrict_neighborhood(cfg["h"], cfg["w"], SimpleNamespace(size_mask_neighborhood=12))
    t_mask = time.perf_counter() - t0
    t0 = time.perf_counter()
    a = official_loop(feats, first, cfg["patch"], frame_hw)
    t_off = time.perf_counter() - t0
    t0 = time.perf_counter()
    b = ours(feats, first, cfg["patch"], frame_hw)
    t_ours = time.perf_counter() - t0
    n = cfg["frames"] - 1
    off_frame = max(t_off - t_mask, 0.0) / n
    val_off, val_ours = 30 * t_mask + 1969 * off_frame, 1969 * t_ours / n
    rows = [{"name": f"official mask build, {cfg['h']}x{cfg['w']} grid (once per video)", "value": t_mask, "unit": "s"},
            {"name": "official propagation per frame", "value": off_frame, "unit": "s"},
            {"name": "probes/video/propagation.py per frame (index table included)", "value": t_ours / n, "unit": "s",
             "ratio": t_ours / n / off_frame},
            {"name": "DAVIS val counts at this grid: official", "value": val_off, "unit": "s"},
            {"name": "DAVIS val counts at this grid: probes/video/propagation.py", "value": val_ours, "unit": "s",
             "ratio": val_ours / val_off}]
    out = {"bench": "label_propagation", "config": cfg, "rows": rows, "speedup_val": val_off / val_ours,
           "identical_masks": bool(np.array_equal(a, b)), "official_mask_s": t_mask, "official_s_per_frame": off_frame,
           "ours_s_per_frame": t_ours / n}
    if not quick:
        out["metrics_s_per_object_frame"] = _metrics_per_object_frame()
        out["vit_s16_s_per_frame_480x832"] = _vit_s16_frame_seconds()
        rows += [{"name": "J+F per object-frame, 480x854", "value": out["metrics_s_per_object_frame"], "unit": "s"},
                 {"name": "ViT-S/16 forward per frame, 480x832 (fp32)", "value": out["vit_s16_s_per_frame_480x832"],
                  "unit": "s"}]
    return out


if __name__ == "__main__":
    import json
    import sys
    print(json.dumps(run(quick="--quick" in sys.argv[1:]), indent=2, default=str))
