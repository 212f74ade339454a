"""Multi-crop augmentation throughput: uint8-tensor pipeline vs the PIL reference, images/s, side by side.

``run(quick=False) -> {"rows": [...], ...}``. Both pipelines get the same images (PIL images for
:class:`DinoPILMultiCrop`, the same pixels as uint8 CHW tensors for :class:`MultiCropTransform`; decoding
is not timed) with the released DINO ViT-S/16 settings: 2 x 224 px + 10 x 96 px crops. Within each repeat
both are timed in turn, so load on a shared machine hits both alike; reported: median images/s and the
median of the per-repeat ratios (fast / PIL), also from CPU time. One thread each, as in a DataLoader worker (PIL is
single-threaded; torch would otherwise use every core for one image).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch
from PIL import Image

from bench.pil_multicrop import DinoPILMultiCrop
from datamodules.transforms.multicrop import MultiCropTransform, make_config

TARGET = 2.0  # "at least 2x the images/s of a PIL pipeline that follows the official DINO recipe"
FULL = dict(preset="released_vits16", n_images=16, height=375, width=500, repeats=5, overrides={})
QUICK = dict(preset="released_vits16", n_images=2, height=96, width=128, repeats=1,
             overrides=dict(global_size=64, local_size=32, n_local=2))


def photo_like(n: int, height: int, width: int, seed: int = 0) -> list[np.ndarray]:
    """Deterministic test photos (uint8 HWC): smooth colour fields, hard-edged shapes, sensor-like noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width] / max(height, width)
    out = []
    for _ in range(n):
        f = rng.uniform(1, 6, (3, 2))
        ph = rng.uniform(0, 2 * np.pi, 3)
        img = np.stack([0.5 + 0.35 * np.sin(f[c, 0] * xx * 2 * np.pi + f[c, 1] * yy * 2 * np.pi + ph[c])
                        for c in range(3)], -1)
        for _ in range(12):
            cy, cx, r = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.03, 0.2)
            img[(yy - cy * height / max(height, width)) ** 2 + (xx - cx) ** 2 < r * r] = rng.uniform(0, 1, 3)
        img += rng.normal(0, 0.03, img.shape)
        out.append((np.clip(img, 0, 1) * 255 + 0.5).astype(np.uint8))
    return out


def _time(fn, items) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this thread): CPU time is what other processes on a shared machine
    do not inflate."""
    t0, c0 = time.perf_counter(), time.thread_time()
    for it in items:
        fn(it)
    return time.perf_counter() - t0, time.thread_time() - c0


def run(quick: bool = False) -> dict:
    s = QUICK if quick else FULL
    cfg = make_config(s["preset"], **s["overrides"])
    arrays = photo_like(s["n_images"], s["height"], s["width"])
    pil_images = [Image.fromarray(a) for a in arrays]
    tensors = [torch.from_numpy(a).permute(2, 0, 1).contiguous() for a in arrays]
    pil_t, fast_t = DinoPILMultiCrop(cfg), MultiCropTransform(cfg)
    gen = torch.Generator().manual_seed(0)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # warm-up (first-call allocations, lazy imports)
        pil_t(pil_images[0])
        fast_t(tensors[0], generator=gen)
        pil_ips, fast_ips, ratios, cpu_ratios = [], [], [], []
        for _ in range(s["repeats"]):
            tp, cp = _time(pil_t, pil_images)
            tf, cf = _time(lambda x: fast_t(x, generator=gen), tensors)
            pil_ips.append(len(arrays) / tp)
            fast_ips.append(len(arrays) / tf)
            ratios.append(tp / tf)
            cpu_ratios.append(cp / cf)
    finally:
        torch.set_num_threads(threads)

    crops = f"2x{cfg.global_size} + {cfg.n_local}x{cfg.local_size} crops"
    src = f"{s['width']}x{s['height']} images"
    pil_med, fast_med, ratio = statistics.median(pil_ips), statistics.median(fast_ips), statistics.median(ratios)
    return {
        "comparison": "multicrop",
        "rows": [
            {"name": f"PIL reference (DinoPILMultiCrop), {crops}, {src}", "value": pil_med, "unit": "images/s",
             "ratio": 1.0},
            {"name": f"uint8 tensors (MultiCropTransform), {crops}, {src}", "value": fast_med, "unit": "images/s",
             "ratio": ratio, "target": TARGET},
        ],
        "ratio_definition": "images/s of MultiCropTransform / images/s of DinoPILMultiCrop (higher is better); "
                            "median of per-repeat ratios",
        "settings": {**s, "config": cfg.to_dict(), "torch_threads": 1},
        "cpu_time_ratio": statistics.median(cpu_ratios),
        "per_repeat": {"pil_images_per_s": pil_ips, "fast_images_per_s": fast_ips, "ratio": ratios,
                       "cpu_time_ratio": cpu_ratios},
        "meets_target": ratio >= TARGET,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.multicrop", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    a = p.parse_args(argv)
    r = run(quick=a.quick)
    for row in r["rows"]:
        print(f"{row['name']:75s} {row['value']:8.1f} {row['unit']}  ratio {row['ratio']:.2f}")
    print(f"ratio from CPU time (robust to other load): {r['cpu_time_ratio']:.2f}")
    print(json.dumps(r["per_repeat"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
