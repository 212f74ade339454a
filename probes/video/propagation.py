"""DAVIS-2017 video object segmentation by label propagation (DINO's ``eval_video_segmentation.py``), batched.

Each frame's label map is the affinity-weighted vote of the first frame and the ``n_last_frames`` previous ones:
L2-normalised patch features, affinity exp(cos / 0.1) to source patches within ``neighbourhood`` patches (a
square of side 2r+1), kept for the top-k sources over all context frames (ties kept, as DINO's threshold), the
weights normalised, the context label maps (the first frame one-hot, then each propagated soft map) averaged.
Then the official post-processing: bilinear ×patch upsampling, per-channel min-max (``norm_mask``), argmax,
nearest resize to the frame size.

The official code builds an (hw)² neighbourhood mask with four nested Python loops per video and multiplies the
dense (context · hw)² affinity; here the neighbourhood is an index table built once per grid (vectorised, cached)
and only its candidates are exponentiated, thresholded and summed. Equal to ``official/dino_video_segmentation.py``
(tests/test_davis.py): identical masks; the soft maps differ only by float summation order.

>>> cfg = PropagationOptions()
>>> input_size(480, 854, cfg.short_side)  # DAVIS 480p: 480 x 832 input, a 30 x 52 grid at patch 16
(480, 832)
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

DINO_MEAN = (0.485, 0.456, 0.406)
DINO_STD = (0.228, 0.224, 0.225)  # eval_video_segmentation's color_normalize (0.229 for red elsewhere)


@dataclass(frozen=True)
class PropagationOptions:
    """DINO's defaults: --n_last_frames 7, --topk 5, --size_mask_neighborhood 12, temperature 0.1, 480 px."""
    n_last_frames: int = 7
    topk: int = 5
    neighbourhood: int = 12   # patches; 0 = every source patch
    temperature: float = 0.1
    short_side: int = 480     # frames resized so; the long side floored to a multiple of 64

    def __post_init__(self):
        if self.n_last_frames < 1 or self.topk < 1 or self.neighbourhood < 0 or self.temperature <= 0 \
                or self.short_side < 1:
            raise ValueError(f"invalid propagation settings {self}: n_last_frames >= 1, topk >= 1, "
                             "neighbourhood >= 0, temperature > 0 and short_side >= 1")

    @classmethod
    def parse(cls, text: str) -> "PropagationOptions":
        """From 'key=value,...' (``make probe ARGS="--davis short_side=64,topk=5"``); '' gives DINO's defaults.

        >>> PropagationOptions.parse("topk=3, temperature=0.05").topk
        3
        """
        kw = {}
        for part in filter(None, (p.strip() for p in (text or "").split(","))):
            key, _, value = part.partition("=")
            if key.strip() not in cls.__dataclass_fields__ or not value.strip():
                raise ValueError(f"--davis {text!r}: {part!r} is not key=value with a key of "
                                 f"{', '.join(cls.__dataclass_fields__)}")
            kw[key.strip()] = type(getattr(cls(), key.strip()))(value.strip())
        return cls(**kw)


def input_size(h: int, w: int, short_side: int = 480) -> tuple[int, int]:
    """(H, W) the network sees: the short side -> ``short_side``, the long side scaled and floored to a multiple
    of 64 (DINO's ``read_frame``; a square frame gets (480, 448), where DINO's ``read_seg`` would disagree)."""
    if h > w:
        return int(((short_side * h) / w // 64) * 64), short_side
    return short_side, int(((short_side * w) / h // 64) * 64)


def prepare_frame(bgr: np.ndarray, size: tuple[int, int]) -> torch.Tensor:
    """uint8 (H, W, 3) BGR -> float (3, *size) RGB normalised: cv2 bilinear resize, /255, DINO's mean/std; the
    same float32 operations as the official ``read_frame``."""
    import cv2
    img = cv2.resize(bgr, (size[1], size[0])).astype(np.float32) / 255.0
    x = torch.from_numpy(np.ascontiguousarray(img[:, :, ::-1].transpose(2, 0, 1)))
    for t, m, s in zip(x, DINO_MEAN, DINO_STD):
        t.sub_(m).div_(s)
    return x


def first_labels(mask: np.ndarray, grid: tuple[int, int], patch: int) -> torch.Tensor:
    """One-hot (C, h, w) of the first annotation at the patch grid: PIL nearest resize to ``grid`` (DINO's
    ``read_seg`` at input size // patch), C = max id + 1 (``to_one_hot``)."""
    small = np.array(Image.fromarray(mask).resize((grid[1], grid[0]), Image.NEAREST)).astype(np.int64)
    labels = torch.from_numpy(small)
    return F.one_hot(labels, int(labels.max()) + 1).permute(2, 0, 1).float()


@lru_cache(maxsize=16)
def neighbourhood(h: int, w: int, radius: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(index (hw, K), valid (hw, K)): for each query patch, the flat indices of the source patches within
    ``radius`` rows and columns (K = (2r+1)², clipped to the grid); invalid slots point at 0. ``radius`` 0: every
    patch (DINO's ``size_mask_neighborhood 0``)."""
    if radius <= 0:
        idx = torch.arange(h * w).expand(h * w, h * w)
        return idx.to(device), torch.ones(h * w, h * w, dtype=torch.bool, device=device)
    ry, rx = min(radius, h - 1), min(radius, w - 1)
    qy, qx = torch.div(torch.arange(h * w), w, rounding_mode="floor"), torch.arange(h * w) % w
    y = qy[:, None, None] + torch.arange(-ry, ry + 1)[None, :, None]
    x = qx[:, None, None] + torch.arange(-rx, rx + 1)[None, None, :]
    valid = ((y >= 0) & (y < h) & (x >= 0) & (x < w)).reshape(h * w, -1)
    idx = (y.clamp(0, h - 1) * w + x.clamp(0, w - 1)).reshape(h * w, -1)
    return idx.to(device), valid.to(device)


def propagate_frame(target: torch.Tensor, ctx_feats: torch.Tensor, ctx_labels: torch.Tensor,
                    nb: tuple[torch.Tensor, torch.Tensor], cfg: PropagationOptions) -> torch.Tensor:
    """Soft labels (C, hw) of one frame. ``target`` (hw, D) and ``ctx_feats`` (n, hw, D) L2-normalised,
    ``ctx_labels`` (n, C, hw): the first frame's one-hot, then the previous frames' soft maps."""
    idx, valid = nb
    n, hw, _ = ctx_feats.shape
    k = idx.shape[1]
    sims = torch.bmm(target.expand(n, hw, -1), ctx_feats.transpose(1, 2))  # (n, query, source)
    aff = torch.exp(sims.gather(2, idx.expand(n, hw, k)) / cfg.temperature)
    aff = torch.where(valid, aff, 0.0).permute(1, 0, 2).reshape(hw, n * k)  # (query, context x neighbour)
    kth = aff.topk(min(cfg.topk, n * k), dim=1).values[:, -1:]
    keep = (aff >= kth) & (aff > 0)  # DINO zeroes what lies below the k-th value: ties stay
    aff = torch.where(keep, aff, 0.0)
    aff = aff / aff.sum(1, keepdim=True)
    rows, cols = keep.nonzero(as_tuple=True)
    ctx, slot = torch.div(cols, k, rounding_mode="floor"), cols % k
    votes = ctx_labels[ctx, :, idx[rows, slot]] * aff[rows, cols, None]  # (kept, C)
    out = torch.zeros(hw, ctx_labels.shape[1], dtype=aff.dtype, device=aff.device).index_add_(0, rows, votes)
    return out.T


@torch.no_grad()
def propagate_video(feats: torch.Tensor, first: torch.Tensor, cfg: PropagationOptions) -> torch.Tensor:
    """Soft label maps (T-1, C, h, w) of frames 1..T-1 from patch features (T, h, w, D) and the first frame's
    one-hot (C, h, w); the context is the first frame plus the ``n_last_frames`` previous ones (a FIFO)."""
    T, h, w, D = feats.shape
    C = first.shape[0]
    if first.shape[1:] != (h, w):
        raise ValueError(f"first-frame labels {tuple(first.shape[1:])} do not match the feature grid {(h, w)}")
    feats = F.normalize(feats.reshape(T, h * w, D).float(), dim=-1, p=2)
    nb = neighbourhood(h, w, cfg.neighbourhood, str(feats.device))
    seg0 = first.reshape(C, h * w).to(feats)
    fifo: deque[tuple[int, torch.Tensor]] = deque(maxlen=cfg.n_last_frames)
    out = []
    for t in range(1, T):
        ctx_feats = feats[[0] + [j for j, _ in fifo]]
        ctx_labels = torch.stack([seg0] + [s for _, s in fifo])
        seg = propagate_frame(feats[t], ctx_feats, ctx_labels, nb, cfg)
        fifo.append((t, seg))
        out.append(seg)
    return torch.stack(out).reshape(T - 1, C, h, w)


def norm_mask(x: torch.Tensor) -> torch.Tensor:
    """DINO's ``norm_mask`` on (N, C, H, W): each channel with a positive maximum min-max scaled to [0, 1]."""
    shifted = x - x.amin(dim=(-2, -1), keepdim=True)
    scaled = shifted / shifted.amax(dim=(-2, -1), keepdim=True)
    return torch.where(x.amax(dim=(-2, -1), keepdim=True) > 0, scaled, x)


@torch.no_grad()
def label_maps(soft: torch.Tensor, patch: int, frame_hw: tuple[int, int], chunk: int = 8) -> np.ndarray:
    """(N, C, h, w) soft maps -> (N, H, W) uint8 object ids at the frame size: bilinear ×patch, ``norm_mask``,
    argmax (first maximum), PIL nearest resize, as the official loop does per frame."""
    out = []
    for part in soft.split(chunk):
        up = F.interpolate(part, scale_factor=patch, mode="bilinear", align_corners=False,
                           recompute_scale_factor=False)
        ids = torch.max(norm_mask(up), dim=1)[1].to(torch.uint8).cpu().numpy()
        out += [np.array(Image.fromarray(m).resize((frame_hw[1], frame_hw[0]), Image.NEAREST)) for m in ids]
    return np.stack(out) if out else np.zeros((0, *frame_hw), np.uint8)


def mask_palette() -> np.ndarray:
    """(256, 3) uint8: the palette DINO writes its masks with (Liusifei/UVC ``libs/data/palette.txt``): the PASCAL
    VOC colour map with 192 written 191 for ids < 22, grey i for id i >= 22. Ids 0..8 are DAVIS's own colours."""
    pal = []
    for i in range(256):
        if i >= 22:
            pal.append((i, i, i))
            continue
        r = g = b = 0
        c = i
        for j in range(8):
            r, g, b = r | ((c & 1) << (7 - j)), g | (((c >> 1) & 1) << (7 - j)), b | (((c >> 2) & 1) << (7 - j))
            c >>= 3
        pal.append(tuple(191 if v == 192 else v for v in (r, g, b)))
    return np.asarray(pal, dtype=np.uint8)


def write_indexed_png(path, ids: np.ndarray, palette: np.ndarray) -> None:
    """An indexed PNG (mode P) of object ids, as DINO's ``imwrite_indexed``."""
    im = Image.fromarray(np.ascontiguousarray(ids, dtype=np.uint8))
    im.putpalette(palette.ravel())
    im.save(path, format="PNG")
