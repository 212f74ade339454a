"""Photometric kernels of the fast multi-crop pipeline on float tensors in [0, 1], matching PIL / torchvision:
PIL's GaussianBlur kernel, HSV hue rotation, ITU-R 601-2 grayscale and solarize."""
from __future__ import annotations

import math

import torch
import torchvision.transforms.v2.functional as F


def pil_blur_kernel(radius: float, passes: int = 3) -> list[float]:
    """The 1-D kernel of PIL's ``GaussianBlur(radius)``: ``passes`` extended box blurs of total variance radius**2
    (Pillow's BoxBlur.c, after Gwosdek et al. 2011), composed into one kernel. A sampled Gaussian would not do:
    below radius ~0.8 its variance is far below radius**2."""
    sigma2 = radius * radius / passes
    big_l = math.sqrt(12.0 * sigma2 + 1.0)
    l = math.floor((big_l - 1.0) / 2.0)
    a = (2 * l + 1) * (l * (l + 1) - 3 * sigma2) / (6 * (sigma2 - (l + 1) ** 2))
    box = [a] + [1.0] * (2 * l + 1) + [a]
    k = [1.0]
    for _ in range(passes):
        k = [sum(k[i - j] * box[j] for j in range(len(box)) if 0 <= i - j < len(k))
             for i in range(len(k) + len(box) - 1)]
    total = sum(k)
    return [v / total for v in k]


def gaussian_blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """PIL ``GaussianBlur(radius=sigma)`` on a float (..., H, W) tensor, edge pixels repeated. Unlike PIL no 8-bit
    rounding between passes and the edge extended once (a grey level near borders). Shifted weighted sums:
    single-channel conv2d is several times slower on CPU."""
    k = pil_blur_kernel(sigma)
    r = len(k) // 2
    h, w = x.shape[-2], x.shape[-1]
    # replicate-pad by r (index clamping also works when r exceeds the image size)
    cols = torch.arange(-r, w + r).clamp_(0, w - 1)
    xp = x.index_select(-1, cols)
    y = xp[..., :, 0:w] * k[0]
    for d in range(1, 2 * r + 1):
        y.add_(xp[..., :, d:d + w], alpha=k[d])
    rows = torch.arange(-r, h + r).clamp_(0, h - 1)
    yp = y.index_select(-2, rows)
    z = yp[..., 0:h, :] * k[0]
    for d in range(1, 2 * r + 1):
        z.add_(yp[..., d:d + h, :], alpha=k[d])
    return z


_HUE_OFFSETS = torch.tensor([5.0, 3.0, 1.0]).view(3, 1, 1)


def adjust_hue(x: torch.Tensor, hue_factor: float | torch.Tensor) -> torch.Tensor:
    """HSV hue rotation of float RGB (..., 3, H, W) in [0, 1], as ``F.adjust_hue``; ``hue_factor`` a float or a
    tensor broadcasting against (..., 1, H, W). RGB is rebuilt from (h, V, C), which a hue rotation keeps, with
    in-place arithmetic: about 2x faster than the RGB -> HSV -> RGB round trip."""
    if not torch.is_tensor(hue_factor) and hue_factor == 0.0:
        return x
    v, idx = x.max(-3, keepdim=True)  # idx: the max channel (ties give the same hue either way)
    c = v - x.amin(-3, keepdim=True)
    # hue in sextants: 2 * idx + (next channel - previous channel) / c, i.e. (g-b)/c, 2+(b-r)/c, 4+(r-g)/c
    d = x.roll(-1, -3).sub_(x.roll(1, -3))
    h = d.gather(-3, idx).div_(c + (c == 0).to(x.dtype))  # grey pixels (c = 0): any hue, C * ramp = 0
    h.add_(idx.to(x.dtype), alpha=2.0).add_(6.0 * hue_factor)
    h.sub_(torch.floor(h / 6.0).mul_(6.0))  # wrap to [0, 6)
    # channel = V - C * ramp((n + h) mod 6), n = 5, 3, 1 for r, g, b; ramp(k) = clamp(min(k, 4-k), 0, 1).
    # For k = n + h in [1, 11) that is clamp(2 - ||k - 5| - 3|, 0, 1): both periods at once, no mod.
    ramp = (h + _HUE_OFFSETS.to(x.device)).sub_(5.0).abs_().sub_(3.0).abs_().neg_().add_(2.0).clamp_(0.0, 1.0)
    return v - c * ramp


def grayscale(x: torch.Tensor) -> torch.Tensor:
    """ITU-R 601-2 luma (PIL ``convert('L')``), repeated to 3 channels like ``RandomGrayscale``."""
    return F.rgb_to_grayscale(x, num_output_channels=3)


def solarize(x: torch.Tensor, threshold: int = 128) -> torch.Tensor:
    """PIL ``ImageOps.solarize`` on a [0, 1] float tensor: values >= threshold/255 become 1 - value."""
    return torch.where(x >= threshold / 255.0, 1.0 - x, x)
