"""The two multi-crop paths of ``data.augment_on``: what a DataLoader worker costs per image on each, and what the
batched augmentation costs per batch.

``run(quick=False) -> {"rows": [...]}``, one thread (a worker's core), CPU time of the thread, median of repeats:
  * worker img/s per core on real JPEGs (the fixtures' ImageNet photos when ../shared is there, else 500x375
    JPEGs written at start from ``photo_like``): PIL decode alone; the gpu path's worker (decode + draw the crops
    + pack + collate: ``DecodedMultiCropDataset``); the cpu path's worker (decode + ``MultiCropTransform`` +
    collate: ``MultiCropDataset``). Target: decode-only >= 5x the full CPU augmentation;
  * the resize stage of one batch, per-crop ``F.interpolate`` (uint8, the CPU path) vs the batched matmuls;
  * ``BatchedMultiCrop`` on one batch on CPU, and predicted for 64 images on a GPU (none here): the GPU work
    (FLOPs and bytes of the same chunks at assumed H200 rates, written in the row) and the host time to launch
    its kernels (counted on CPU: the op sequence does not depend on the device).
Released ViT-S/16 recipe: 2 x 224 + 10 x 96 crops.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, default_collate

from bench.multicrop import photo_like
from datamodules.datasets.base import image_tensor, load_rgb
from datamodules.pretraining import DecodedMultiCropDataset, MultiCropDataset
from datamodules.transforms.batched import BatchedMultiCrop, collate_decoded, unpack_params
from datamodules.transforms.multicrop import MultiCropTransform, make_config
from datamodules.transforms.resample import chunk_rows, resize_crops

TARGET = 5.0  # decode-only workers >= 5x the img/s per core of full CPU augmentation: a GPU node's cores then feed
# the step (docs/scale.md, "Data-bound or compute-bound")
FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "real"
FULL = dict(n_images=32, batch=16, repeats=3, overrides={})
QUICK = dict(n_images=4, batch=4, repeats=1, overrides=dict(global_size=64, local_size=32, n_local=2))
# H200 assumptions for the prediction (spec sheet: 67 TFLOP/s fp32 without tensor cores, 4.8 TB/s HBM3e)
GPU_FP32, GPU_BW, LAUNCH_S = 0.5 * 67e12, 0.6 * 4.8e12, 5e-6


class JpegFiles(Dataset):
    """Items as the real datasets give them: ``load_rgb`` (PIL, grey/CMYK converted) -> uint8 (3, H, W)."""

    def __init__(self, files):
        self.files = list(files)

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        return {"image": image_tensor(load_rgb(self.files[i])), "label": 0}


def jpegs(n: int, tmp: Path) -> tuple[list[Path], str]:
    real = sorted((FIXTURES / "imagenet_samples").glob("*.JPEG")) + sorted((FIXTURES / "imagenet").rglob("*.JPEG"))
    real = [f for f in real if max(Image.open(f).size) <= 800][:n]
    if len(real) == n:
        return real, f"{n} real ImageNet JPEGs (fixtures)"
    files = []
    for i, a in enumerate(photo_like(n, 375, 500)):
        files.append(tmp / f"img_{i:03d}.JPEG")
        Image.fromarray(a).save(files[-1], quality=90)
    return files, f"{n} 500x375 JPEGs written at start (photo_like, quality 90)"


def _worker_time(ds, batch: int, collate, n: int) -> float:
    """Thread CPU seconds to make every batch of ``ds`` as a DataLoader worker does (items, then collate)."""
    c0 = time.thread_time()
    for s in range(0, n - batch + 1, batch):
        collate([ds[(0, i)] for i in range(s, s + batch)])
    return time.thread_time() - c0


def _geometry(batch, cfg) -> list[tuple[int, int, int, int]]:
    """(crops, pad_h, pad_w, size) of every chunk BatchedMultiCrop runs for this batch."""
    out = []
    for first, stop, size in ((0, 2, cfg.global_size), (2, cfg.n_crops, cfg.local_size)):
        rows = batch.params[:, first:stop].reshape(-1, batch.params.shape[2])
        for c in chunk_rows(rows[:, 2], rows[:, 3]):
            out.append((len(c), int(rows[c, 2].max()), int(rows[c, 3].max()), size))
    return out


def predicted_gpu_ms(geometry) -> tuple[float, float]:
    """(ms, GFLOP) of GPU work for one batch: the two matmul passes at GPU_FP32, the main tensors' traffic at
    GPU_BW (crop gather, weights, pass outputs, ~25 passes of the photometric ops over the crops)."""
    flop = sum(2 * n * (3 * h * w * s + s * h * 3 * s) for n, h, w, s in geometry)
    elems = sum(n * (3 * h * w * 3 + s * (w + h) * 3 + 3 * h * s * 2 + 3 * s * s * 25) for n, h, w, s in geometry)
    return 1e3 * (flop / GPU_FP32 + 4 * elems / GPU_BW), flop / 1e9


def kernel_count(fn) -> int:
    """ATen ops that launch a kernel (views excluded) while ``fn()`` runs: the same sequence on CPU and GPU."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view:
                Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n


def run(quick: bool = False) -> dict:
    s = QUICK if quick else FULL
    cfg = make_config("released_vits16", **s["overrides"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        files, source = jpegs(s["n_images"], Path(tmp))
        base, n, bs = JpegFiles(files), len(files), s["batch"]
        decoded = DecodedMultiCropDataset(base, MultiCropTransform(cfg))
        full = MultiCropDataset(base, MultiCropTransform(cfg))
        try:
            _worker_time(decoded, bs, collate_decoded, bs)  # warm-up
            _worker_time(full, bs, default_collate, bs)
            dec, wd, wf = [], [], []
            for _ in range(s["repeats"]):
                c0 = time.thread_time()
                for i in range(n):
                    base[i]
                dec.append(n / (time.thread_time() - c0))
                wd.append((n // bs) * bs / _worker_time(decoded, bs, collate_decoded, n))
                wf.append((n // bs) * bs / _worker_time(full, bs, default_collate, n))
            batch = collate_decoded([decoded[(0, i)] for i in range(bs)])
            resize_rows, aug_ms = _resize_and_batch(cfg, base, batch, s["repeats"])
        finally:
            torch.set_num_threads(threads)
    d_med, wd_med, wf_med = statistics.median(dec), statistics.median(wd), statistics.median(wf)
    big = collate_decoded([decoded[(0, i % n)] for i in range(64)]) if not quick else batch
    gpu_ms, gflop = predicted_gpu_ms(_geometry(big, cfg))
    launches = kernel_count(lambda: BatchedMultiCrop(cfg)(big))
    crops = f"2x{cfg.global_size} + {cfg.n_local}x{cfg.local_size}"
    rows = [
        {"name": f"PIL decode only, {source}", "value": d_med, "unit": "img/s per core", "ratio": d_med / wf_med},
        {"name": "augment_on=gpu worker: decode + draw crops + pack + collate", "value": wd_med,
         "unit": "img/s per core", "ratio": wd_med / wf_med, "target": TARGET},
        {"name": f"augment_on=cpu worker: decode + MultiCropTransform ({crops}) + collate", "value": wf_med,
         "unit": "img/s per core", "ratio": 1.0},
        *resize_rows,
        {"name": f"BatchedMultiCrop on CPU (1 thread), batch of {bs}", "value": aug_ms, "unit": "ms per batch",
         "ratio": None},
        {"name": f"BatchedMultiCrop PREDICTED on one H200, batch of 64 ({gflop:.0f} GFLOP fp32 at "
                 f"{GPU_FP32 / 1e12:.0f} TFLOP/s, bytes at {GPU_BW / 1e12:.1f} TB/s)", "value": gpu_ms,
         "unit": "ms per batch (predicted)", "ratio": None},
        {"name": f"BatchedMultiCrop host side, batch of {len(big.shapes)}: {launches} kernel launches x "
                 f"{LAUNCH_S * 1e6:.0f} us (counted on CPU, the same op sequence)", "value": 1e3 * launches * LAUNCH_S,
         "unit": "ms per batch (predicted)", "ratio": None},
    ]
    return {"comparison": "multicrop_batched", "rows": rows, "meets_target": wd_med / wf_med >= TARGET,
            "settings": {**s, "images": source, "config": cfg.to_dict(), "torch_threads": 1},
            "per_repeat": {"decode": dec, "decode_only_worker": wd, "full_cpu_worker": wf}}


def _resize_and_batch(cfg, base, batch, repeats: int) -> tuple[list[dict], float]:
    """The resize stage per crop (the CPU path's interpolate) vs batched, and the whole batched augmentation."""
    imgs = [base[i]["image"] for i in range(len(batch.shapes))]
    geom = _geometry(batch, cfg)
    t = BatchedMultiCrop(cfg)
    loop, mm, whole = [], [], []
    params = [unpack_params(r, cfg) for r in batch.params]
    H, W = batch.shapes[:, 0], batch.shapes[:, 1]
    off = np.concatenate([[0], np.cumsum(3 * H * W)[:-1]])
    for _ in range(repeats):
        c0 = time.thread_time()
        for img, ps in zip(imgs, params):
            x = img.unsqueeze(0).contiguous(memory_format=torch.channels_last)
            for p in ps:
                MultiCropTransform.crop_resize(x, p)
        loop.append(time.thread_time() - c0)
        c0 = time.thread_time()
        for first, stop, size in ((0, 2, cfg.global_size), (2, cfg.n_crops, cfg.local_size)):
            rows = batch.params[:, first:stop].reshape(-1, batch.params.shape[2])
            img = np.repeat(np.arange(len(imgs)), stop - first)
            chunks = chunk_rows(rows[:, 2], rows[:, 3])
            c = np.concatenate(chunks)
            g = np.concatenate([np.stack([off[img[c]], H[img[c]], W[img[c]]], 1), rows[c][:, :5]], 1)
            stops = np.cumsum([len(k) for k in chunks])
            bounds = [(int(e - len(k)), int(e), int(rows[k, 2].max()), int(rows[k, 3].max()))
                      for k, e in zip(chunks, stops)]
            resize_crops(batch.pixels, torch.from_numpy(g.astype(np.int64)), size, bounds)
        mm.append(time.thread_time() - c0)
        c0 = time.thread_time()
        t(batch)
        whole.append(time.thread_time() - c0)
    n = cfg.n_crops * len(imgs)
    lm, bm = 1e3 * statistics.median(loop), 1e3 * statistics.median(mm)
    return [
        {"name": f"resize stage, per-crop F.interpolate uint8 (CPU path), {n} crops, {len(geom)} chunks",
         "value": lm, "unit": "ms per batch", "ratio": 1.0},
        {"name": f"resize stage, batched matmuls (GPU path) on CPU, {n} crops", "value": bm, "unit": "ms per batch",
         "ratio": bm / lm},
    ], 1e3 * statistics.median(whole)


if __name__ == "__main__":
    import argparse
    import json
    p = argparse.ArgumentParser(prog="python -m bench.multicrop_batched", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    r = run(quick=p.parse_args().quick)
    for row in r["rows"]:
        print(f"{row['name']:110s} {row['value']:9.1f} {row['unit']}")
    print(json.dumps(r["per_repeat"]))
