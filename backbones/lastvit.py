"""LaSt-ViT selective aggregation: the [CLS] output built from frequency-stable patch tokens.

Following ``dense_vit.forward`` of ChengShiest/LAST-ViT and REFERENCE.md §3: X (B, N, D) = final normalised
patch tokens; L = low-pass of X along the *channel* axis (FFT over D, centred Gaussian window exp(-½(n/σ)²),
inverse FFT, real part); S = X / |L − X|; per channel the top-K patches by S, their X averaged → [CLS] (D,).

Deviations (README): the window peaks exactly on DC (the reference's is one bin left for even D) and |L − X|
gets a 1e-6 epsilon (no inf/NaN); K defaults to 1 as released (the paper reports K=7 slightly better).
``reference=True`` undoes both: the released forward bit for bit (``lastvit_reference=True``).
"""
from __future__ import annotations

import math

import torch
from torch import nn


def gaussian_window(dim: int, sigma: float, device=None, dtype=torch.float32, reference: bool = False) -> torch.Tensor:
    """Window in ``fftshift`` order (DC at index dim // 2), peak exactly 1 on DC. ``reference``: the released
    ``arange(-dim // 2 + 1, dim // 2 + 1)`` offsets, whose peak is one bin left of DC for even ``dim``."""
    start = (-dim) // 2 + 1 if reference else -(dim // 2)
    n = torch.arange(start, start + dim, device=device, dtype=dtype)
    w = torch.exp(-0.5 * (n / sigma) ** 2)
    return w / w.max() if reference else w


def channel_lowpass(x: torch.Tensor, sigma: float, reference: bool = False) -> torch.Tensor:
    window = gaussian_window(x.shape[-1], sigma, device=x.device, reference=reference)
    spec = torch.fft.fftshift(torch.fft.fft(x.float(), dim=-1), dim=-1) * window
    return torch.fft.ifft(torch.fft.ifftshift(spec, dim=-1), dim=-1).real


class FrequencyTopKPooling(nn.Module):
    """Parameter-free; returns ``(cls (B, D), votes (B, N))``: votes[b, n] = channels that chose patch n."""

    def __init__(self, dim: int, k: int = 1, sigma: float | None = None, eps: float = 1e-6,
                 reference: bool = False) -> None:
        super().__init__()
        if k < 1:
            raise ValueError(f"lastvit_k must be >= 1, got {k}")
        self.dim, self.k, self.reference = dim, k, reference
        self.eps = 0.0 if reference else eps  # the released score x / |L - x| has no epsilon
        self.sigma = float(sigma) if sigma is not None else math.sqrt(dim)

    def forward(self, patch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, N, D = patch.shape
        k = min(self.k, N)
        with torch.no_grad():  # the selection is discrete; only the gathered values carry gradient
            low = channel_lowpass(patch, self.sigma, self.reference)
            score = patch.float() / ((low - patch.float()).abs() + self.eps)
            idx = score.topk(k, dim=1).indices  # (B, k, D): per channel, the k most stable patches
            votes = torch.zeros(B, N, device=patch.device, dtype=torch.long)
            votes.scatter_add_(1, idx.flatten(1), torch.ones_like(idx.flatten(1)))
        cls = patch.gather(1, idx).mean(dim=1)
        return cls, votes

    def extra_repr(self) -> str:
        return f"dim={self.dim}, k={self.k}, sigma={self.sigma:.3f}" + (", reference=True" if self.reference else "")
