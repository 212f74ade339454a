"""Box geometry: mapping GT boxes through Resize + CenterCrop, box -> overlapped patches, IoU.

Boxes are float xyxy pixel edges, 0-based (VOC's 1-based inclusive integers become xmin-1, ymin-1, xmax, ymax).
The resize/crop arithmetic is torchvision's ``Resize(int)`` + ``CenterCrop`` exactly (what the pixels go
through); a patch counts if it shares positive area with the box. Both deviate from LAST-ViT's
``bbox_to_patch_set`` by at most 1 px (docs/analysis.md; ``reference_patch_mask`` is theirs).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ResizeCrop", "resize_crop_params", "map_boxes", "boxes_to_patch_mask", "reference_patch_mask",
           "box_iou", "box_area"]


@dataclass(frozen=True)
class ResizeCrop:
    """Geometry of Resize(short side -> ``resize``) then CenterCrop(``crop``) for one W x H image."""
    sx: float  # x scale original -> resized
    sy: float
    left: int  # crop offset in the resized image (negative when the crop pads)
    top: int
    crop: int


def _resized_size(w: int, h: int, size: int) -> tuple[int, int]:
    # torchvision.transforms.functional._compute_resized_output_size for an int size (no max_size)
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = size, int(size * long / short)
    return (new_short, new_long) if w <= h else (new_long, new_short)


def _crop_offset(size: int, crop: int) -> int:
    if crop > size:  # torchvision pads (crop - size) // 2 on the left/top first
        return -((crop - size) // 2)
    return int(round((size - crop) / 2.0))


def resize_crop_params(w: int, h: int, resize: int = 256, crop: int = 224) -> ResizeCrop:
    if w <= 0 or h <= 0:
        raise ValueError(f"image size must be positive, got {w}x{h}")
    nw, nh = _resized_size(int(w), int(h), int(resize))
    return ResizeCrop(sx=nw / w, sy=nh / h, left=_crop_offset(nw, crop), top=_crop_offset(nh, crop), crop=int(crop))


def map_boxes(boxes: torch.Tensor, rc: ResizeCrop, clip: bool = True) -> torch.Tensor:
    """Boxes (K, 4) in original pixels -> pixels of the crop (clipped to [0, crop] when ``clip``)."""
    b = torch.as_tensor(boxes, dtype=torch.float64).reshape(-1, 4).clone()
    b[:, 0::2] = b[:, 0::2] * rc.sx - rc.left
    b[:, 1::2] = b[:, 1::2] * rc.sy - rc.top
    if clip:
        b = b.clamp(0, rc.crop)
    return b


def boxes_to_patch_mask(boxes: torch.Tensor, grid: tuple[int, int], patch_size: int) -> torch.Tensor:
    """(h*w,) bool, row-major: patches sharing positive area with ANY of the boxes (K, 4) in crop pixels."""
    h, w = int(grid[0]), int(grid[1])
    b = torch.as_tensor(boxes, dtype=torch.float64).reshape(-1, 4)
    p = float(patch_size)
    edges_x = torch.arange(w, dtype=torch.float64) * p  # left edge of each patch column
    edges_y = torch.arange(h, dtype=torch.float64) * p
    mask = torch.zeros(h, w, dtype=torch.bool)
    for x0, y0, x1, y1 in b.tolist():
        cols = (edges_x < x1) & (edges_x + p > x0) & (x1 > x0)
        rows = (edges_y < y1) & (edges_y + p > y0) & (y1 > y0)
        mask |= rows[:, None] & cols[None, :]
    return mask.flatten()


def reference_patch_mask(boxes: torch.Tensor, w: int, h: int, resize: int = 256, crop: int = 224,
                         patch_size: int = 16) -> torch.Tensor:
    """(n*n,) bool: the union over ``boxes`` (K, 4, original pixels) of LaSt-ViT's ``bbox_to_patch_set``
    (``visualization/evaluate_patch_hit.py``) with its arithmetic: ``int()``-truncated sizes, floor-halved crop
    offsets, corners clamped to [0, crop], every patch from the min corner's to the max corner's (``--pib-rule
    reference``; README's deviations)."""
    n = crop // patch_size
    scale = float(resize) / min(w, h)
    left, top = (int(w * scale) - crop) // 2, (int(h * scale) - crop) // 2
    mask = torch.zeros(n, n, dtype=torch.bool)
    for x0, y0, x1, y1 in torch.as_tensor(boxes, dtype=torch.float64).reshape(-1, 4).tolist():
        c = [min(max(v, 0.0), float(crop)) for v in (x0 * scale - left, y0 * scale - top,
                                                   x1 * scale - left, y1 * scale - top)]
        cols = slice(int(c[0] // patch_size), min(int(c[2] // patch_size) + 1, n))
        rows = slice(int(c[1] // patch_size), min(int(c[3] // patch_size) + 1, n))
        mask[rows, cols] = True
    return mask.flatten()


def box_area(b: torch.Tensor) -> torch.Tensor:
    b = torch.as_tensor(b, dtype=torch.float64).reshape(-1, 4)
    return (b[:, 2] - b[:, 0]).clamp_min(0) * (b[:, 3] - b[:, 1]).clamp_min(0)


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU matrix (Ka, Kb) of xyxy boxes in continuous coordinates (no +1 pixel convention, as LOST)."""
    a = torch.as_tensor(a, dtype=torch.float64).reshape(-1, 4)
    b = torch.as_tensor(b, dtype=torch.float64).reshape(-1, 4)
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp_min(0).prod(-1)
    union = box_area(a)[:, None] + box_area(b)[None, :] - inter
    return torch.where(union > 0, inter / union.clamp_min(1e-12), torch.zeros_like(inter))
