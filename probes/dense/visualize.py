"""Prediction images for TensorBoard: coloured masks and depth maps next to the input."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def palette(n: int = 256) -> torch.Tensor:
    """The PASCAL VOC colour map (bit-interleaved), (n, 3) uint8; 255 (ignore) is white."""
    pal = torch.zeros(n, 3, dtype=torch.uint8)
    for i in range(n):
        c, r, g, b = i, 0, 0, 0
        for j in range(8):
            r |= ((c >> 0) & 1) << (7 - j)
            g |= ((c >> 1) & 1) << (7 - j)
            b |= ((c >> 2) & 1) << (7 - j)
            c >>= 3
        pal[i] = torch.tensor([r, g, b])
    if n > 255:
        pal[255] = 255
    return pal


_PAL = palette()


def colour_mask(mask: torch.Tensor) -> torch.Tensor:
    """(H, W) int labels -> (3, H, W) float [0, 1]."""
    m = mask.long().clamp(0, 255).cpu()
    return _PAL[m].permute(2, 0, 1).float() / 255.0


def colour_depth(depth: torch.Tensor, vmax: float) -> torch.Tensor:
    """(H, W) metres -> (3, H, W) float, near = yellow, far = dark purple (viridis-like ramp); 0 = black."""
    d = (depth.float().cpu() / max(vmax, 1e-6)).clamp(0, 1)
    stops = torch.tensor([[0.99, 0.91, 0.14], [0.13, 0.57, 0.55], [0.27, 0.0, 0.33]])  # near -> far
    pos = d * (len(stops) - 1)
    lo = pos.floor().long().clamp(max=len(stops) - 2)
    t = (pos - lo.float())[..., None]
    rgb = stops[lo] * (1 - t) + stops[lo + 1] * t
    rgb[depth <= 0] = 0
    return rgb.permute(2, 0, 1)


def panel(image: torch.Tensor, *maps: torch.Tensor) -> torch.Tensor:
    """Input image (uint8 or float) and coloured maps side by side at the maps' size."""
    h, w = maps[0].shape[-2:]
    img = image.float() / 255.0 if image.dtype == torch.uint8 else image.float()
    img = F.interpolate(img[None].cpu(), size=(h, w), mode="bilinear", align_corners=False)[0].clamp(0, 1)
    return torch.cat([img, *[m.cpu() for m in maps]], dim=2)
