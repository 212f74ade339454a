"""DINO multi-crop in batch, on whatever device the batch is on (the GPU path of ``data.augment_on=gpu``).

A DataLoader worker decodes the image and draws its crops' :class:`CropParams` with ``MultiCropTransform.plan``
(the CPU path's code, so the draws and the resume contract are the same); :func:`collate_decoded` packs a batch
into one flat uint8 buffer (one host-to-device copy). :class:`BatchedMultiCrop` then runs crop + resize + flip
(``resample.py``) and the photometric ops, each op once over the crops that draw it (index lists built on the
host: no device sync, no per-crop launch). Given the same CropParams each crop equals
``MultiCropTransform.apply`` up to float rounding: bound 2.4 grey levels per pixel, measured under 1
(tests/test_batched_multicrop.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torchvision.transforms.v2.functional as F
from torch.utils.data import get_worker_info

from .crop_plan import CropParams
from .multicrop_config import MultiCropConfig
from .photometric import adjust_hue, grayscale, pil_blur_kernel, solarize
from .resample import chunk_rows, resize_crops

# columns of a packed crop row (float64; integers and booleans are exact)
TOP, LEFT, HEIGHT, WIDTH, FLIP = 0, 1, 2, 3, 4
ORDER = slice(5, 9)  # applied jitter op ids in order, -1 = none
FACTORS = slice(9, 13)  # brightness, contrast, saturation, hue
GRAY, SOLARIZE, SIGMA = 13, 14, 15  # SIGMA: NaN = no blur


def blur_taps(cfg: MultiCropConfig) -> int:
    """Kernel length for the largest blur radius of the recipe (PIL's kernel grows with the radius)."""
    return len(pil_blur_kernel(cfg.blur_radius[1]))


def pil_blur_kernels(sigma: torch.Tensor, taps: int) -> torch.Tensor:
    """:func:`photometric.pil_blur_kernel` for many radii at once: (n,) float64 -> (n, taps), each kernel centred
    and zero-padded. The same extended box (integer radius l, end weights a) composed three times."""
    s2 = sigma * sigma / 3.0
    l = torch.floor((torch.sqrt(12.0 * s2 + 1.0) - 1.0) / 2.0)
    a = (2 * l + 1) * (l * (l + 1) - 3 * s2) / (6 * (s2 - (l + 1) ** 2))
    width = (taps + 2) // 3  # box length of the largest radius: taps = 3 * width - 2
    t = (torch.arange(width, device=sigma.device, dtype=sigma.dtype) - width // 2).abs()[None, :]
    box = torch.where(t <= l[:, None], 1.0, torch.where(t == l[:, None] + 1, a[:, None], 0.0))
    k = box[None]  # (1, n, width); a symmetric box: conv1d's correlation is the convolution
    for _ in range(2):
        k = torch.nn.functional.conv1d(k, box[:, None, :], padding=width - 1, groups=len(sigma))
    return (k / k.sum(-1, keepdim=True))[0]


def pack_params(params: Sequence[CropParams]) -> np.ndarray:
    """One float64 row per crop (the columns above): cheap, it runs in the DataLoader worker."""
    return np.array([[*p.box, p.flip, *p.jitter_order, *[-1] * (4 - len(p.jitter_order)), *p.jitter_factors,
                      p.grayscale, p.solarize, np.nan if p.blur_sigma is None else p.blur_sigma] for p in params],
                    dtype=np.float64)


def unpack_params(rows: np.ndarray, cfg: MultiCropConfig) -> list[CropParams]:
    """The CropParams of one sample back from its rows (globals first, as ``sample_params`` orders them)."""
    out = []
    for n, r in enumerate(rows):
        kind = ("global1", "global2")[n] if n < 2 else "local"
        out.append(CropParams(kind, cfg.global_size if n < 2 else cfg.local_size,
                              tuple(int(v) for v in r[[TOP, LEFT, HEIGHT, WIDTH]]), flip=bool(r[FLIP]),
                              jitter_order=[int(v) for v in r[ORDER] if v >= 0],
                              jitter_factors=tuple(float(v) for v in r[FACTORS]), grayscale=bool(r[GRAY]),
                              blur_sigma=None if np.isnan(r[SIGMA]) else float(r[SIGMA]),
                              solarize=bool(r[SOLARIZE])))
    return out


@dataclass
class DecodedBatch:
    """Decoded images and their drawn crops. ``pixels``: flat uint8, each image's (3, H, W) bytes end to end, then
    zero padding; ``shapes`` (B, 2) and ``params`` (B, n_crops, columns) stay numpy on the host (Lightning moves
    only tensors), so reading them needs no device sync."""
    pixels: torch.Tensor
    shapes: np.ndarray
    params: np.ndarray
    labels: torch.Tensor

    def pin_memory(self) -> "DecodedBatch":  # DataLoader(pin_memory=True) calls this
        return DecodedBatch(self.pixels.pin_memory(), self.shapes, self.params, self.labels.pin_memory())


def collate_decoded(samples: Sequence[tuple[torch.Tensor, np.ndarray, int]]) -> DecodedBatch:
    """(uint8 (3, H, W), packed rows, label) samples -> :class:`DecodedBatch`; images of any size."""
    imgs, rows, labels = zip(*samples)
    pad = max(int(im.shape[-1]) for im in imgs)  # a crop row read never runs past the end
    numel = sum(im.numel() for im in imgs) + pad
    if get_worker_info() is not None:  # as default_collate: straight into shared memory, no copy on the way out
        flat = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(numel))
    else:
        flat = torch.empty(numel, dtype=torch.uint8)
    pos = 0
    for im in imgs:
        flat[pos:pos + im.numel()].view(im.shape).copy_(im)  # also materialises an expanded grey image
        pos += im.numel()
    flat[pos:].zero_()
    shapes = np.array([tuple(im.shape[-2:]) for im in imgs], dtype=np.int64)
    return DecodedBatch(flat, shapes, np.stack(rows), torch.tensor(labels, dtype=torch.int64))


def _blend(x: torch.Tensor, other: torch.Tensor, r: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """torchvision's ``_blend`` (ratio * x + (1 - ratio) * other, clamped) with one ratio per crop; ``a`` is
    1 - ratio computed in float64, as from the Python float of the CPU path."""
    return x.mul(r).add_(other * a).clamp_(0.0, 1.0)


def _brightness(x, r, a):
    return x.mul(r).clamp_(0.0, 1.0)


def _contrast(x, r, a):
    mean = F.rgb_to_grayscale(x, num_output_channels=1).mean(dim=(-3, -2, -1), keepdim=True)
    return _blend(x, mean, r, a)


def _saturation(x, r, a):
    return _blend(x, F.rgb_to_grayscale(x, num_output_channels=1), r, a)


def _hue(x, r, a):
    return adjust_hue(x, r)


_JITTER = (_brightness, _contrast, _saturation, _hue)  # op ids of CropParams.jitter_order


def blur_per_crop(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``photometric.gaussian_blur`` with one (centred, zero-padded) PIL kernel per crop: x (n, C, H, W),
    k (n, taps). Same separable shifted sums with edge pixels repeated."""
    r = k.shape[1] // 2
    h, w = x.shape[-2], x.shape[-1]
    kk = k.to(x.dtype)[:, :, None, None, None]  # (n, taps, 1, 1, 1)
    xp = x.index_select(-1, torch.arange(-r, w + r, device=x.device).clamp_(0, w - 1))
    y = xp[..., 0:w] * kk[:, 0]
    for d in range(1, 2 * r + 1):
        y.addcmul_(xp[..., d:d + w], kk[:, d])
    yp = y.index_select(-2, torch.arange(-r, h + r, device=x.device).clamp_(0, h - 1))
    z = yp[..., 0:h, :] * kk[:, 0]
    for d in range(1, 2 * r + 1):
        z.addcmul_(yp[..., d:d + h, :], kk[:, d])
    return z


def _to(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """A small host table on the device without a sync: through pinned memory on CUDA (a copy from pageable
    memory may wait for the stream, i.e. for the previous training step)."""
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)


class BatchedMultiCrop:
    """``t(batch: DecodedBatch) -> [global1, global2, *locals]``, each (B, 3, size, size) float32 on the
    batch's device, normalised: what the CPU path's DataLoader yields, crop for crop."""

    def __init__(self, config: MultiCropConfig, normalize: bool = True, chunk_waste: float = 1.5):
        self.cfg, self.normalize, self.chunk_waste = config, normalize, chunk_waste
        self.taps = blur_taps(config)
        self._norm: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}  # device -> (mean, std), made once

    def _mean_std(self, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The normalisation's mean and std as (3, 1, 1) tensors on ``dev``, copied there once per device (a copy
        from pageable memory every batch may wait for the stream)."""
        if dev not in self._norm:
            ms = np.asarray([self.cfg.mean, self.cfg.std], dtype=np.float32)
            self._norm[dev] = tuple(_to(ms, dev).view(2, 3, 1, 1).unbind(0))
        return self._norm[dev]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.cfg})"

    def __call__(self, batch: DecodedBatch) -> list[torch.Tensor]:
        with torch.no_grad(), torch.autocast(batch.pixels.device.type, enabled=False):  # float32 passes
            return self._crops(batch)

    def _crops(self, batch: DecodedBatch) -> list[torch.Tensor]:
        B, n = batch.params.shape[:2]
        if n != self.cfg.n_crops:
            raise ValueError(f"batch has {n} crops per image, the recipe {self.cfg.n_crops}")
        H, W = batch.shapes[:, 0], batch.shapes[:, 1]
        off = np.concatenate([[0], np.cumsum(3 * H * W)[:-1]])
        out = []
        for first, stop, size in ((0, 2, self.cfg.global_size), (2, n, self.cfg.local_size)):
            m = stop - first
            if m == 0:
                continue
            rows = batch.params[:, first:stop].transpose(1, 0, 2).reshape(m * B, -1)  # crop-major: k * B + b
            img = np.tile(np.arange(B), m)
            y = self._group(batch.pixels, rows, np.stack([off[img], H[img], W[img]], 1), size)
            out += list(y.view(m, B, 3, size, size).unbind(0))
        return out

    def _group(self, pixels: torch.Tensor, rows: np.ndarray, where: np.ndarray, size: int) -> torch.Tensor:
        """All crops of one output size; computed in chunk order (similar sizes together), returned in row order."""
        dev = pixels.device
        chunks = chunk_rows(rows[:, HEIGHT], rows[:, WIDTH], waste=self.chunk_waste)
        perm = np.concatenate(chunks)
        rows, where = rows[perm], where[perm]
        geom = np.concatenate([where, rows[:, [TOP, LEFT, HEIGHT, WIDTH, FLIP]].astype(np.int64)], 1)
        geom_d = _to(geom, dev)
        rows_d = _to(rows, dev)
        stops = np.cumsum([len(c) for c in chunks])
        bounds = [(int(b - len(c)), int(b), int(rows[b - len(c):b, HEIGHT].max()),
                   int(rows[b - len(c):b, WIDTH].max())) for c, b in zip(chunks, stops)]
        x = resize_crops(pixels, geom_d, size, bounds).div_(255.0)
        x = self._photometric(x, rows, rows_d)
        if self.normalize:
            mean, std = self._mean_std(dev)
            x = (x - mean) / std
        inv = _to(np.argsort(perm), dev)
        return x.index_select(0, inv)

    def _photometric(self, x: torch.Tensor, rows: np.ndarray, rows_d: torch.Tensor) -> torch.Tensor:
        """Each op on the crops that drew it, in the CPU path's order: jitter slot by slot (a crop's k-th
        op is ``jitter_order[k]``), grayscale, blur, solarize."""
        steps = []
        for slot in range(4):
            for op in range(4):
                sel = rows[:, ORDER.start + slot] == op
                if op == 3:
                    sel &= rows[:, FACTORS.start + 3] != 0.0  # adjust_hue(x, 0.0) is skipped on CPU
                steps.append((sel, op))
        blur = ~np.isnan(rows[:, SIGMA])
        if blur.any() and rows[blur, SIGMA].max() > self.cfg.blur_radius[1]:
            raise ValueError(f"blur radius {rows[blur, SIGMA].max()} is above the recipe's maximum "
                             f"{self.cfg.blur_radius[1]}: params drawn with another MultiCropConfig?")
        steps += [(rows[:, GRAY] > 0, "gray"), (blur, "blur"), (rows[:, SOLARIZE] > 0, "sol")]
        sels = [np.flatnonzero(s) for s, _ in steps]
        pool = _to(np.concatenate(sels), x.device)
        ratio = rows_d[:, FACTORS].to(x.dtype)  # float32 factors, and 1 - factor from float64
        rest = (1.0 - rows_d[:, FACTORS]).to(x.dtype)
        a = 0
        for sel, (_, op) in zip(sels, steps):
            if not len(sel):
                continue
            idx = pool[a:a + len(sel)]
            a += len(sel)
            sub = x.index_select(0, idx)
            if op == "gray":
                sub = grayscale(sub)
            elif op == "blur":
                sub = blur_per_crop(sub, pil_blur_kernels(rows_d.index_select(0, idx)[:, SIGMA], self.taps))
            elif op == "sol":
                sub = solarize(sub, self.cfg.solarize_threshold)
            else:
                r, q = (t.index_select(0, idx)[:, op].view(-1, 1, 1, 1) for t in (ratio, rest))
                sub = _JITTER[op](sub, r, q)
            x.index_copy_(0, idx, sub.contiguous())
        return x
