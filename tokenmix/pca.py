"""PCA maps of patch features: the first principal components of the patch tokens shown as RGB (the entmax
paper's figures, DINOv2's visualisation; protocol: docs/analysis.md, "PCA maps"). Signs are fixed (largest
loading positive, as scikit-learn's ``svd_flip``) so colours do not flip between runs; for the foreground split
the first component is oriented so the image border scores low, else the threshold would pick background half
the time.
"""
from __future__ import annotations

import torch

__all__ = ["pca_fit", "pca_rgb", "foreground_mask"]


def pca_fit(x: torch.Tensor, n_components: int = 3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PCA of the rows of ``x`` (M, D) -> (mean (D,), components (k, D), explained variance (k,)): orthonormal,
    by decreasing variance, sign-fixed; missing directions (M - 1 or D < k) are zero."""
    if x.ndim != 2:
        raise ValueError(f"pca_fit expects a (M, D) matrix, got shape {tuple(x.shape)}")
    x = x.detach().to(torch.float64)  # fp64: small variance gaps between components are common in ViT features
    mean = x.mean(0)
    xc = x - mean
    # SVD of the centred data: right singular vectors = principal axes
    _, s, vh = torch.linalg.svd(xc, full_matrices=False)
    k = min(n_components, vh.shape[0])
    comps = vh[:k]
    var = s[:k] ** 2 / max(x.shape[0] - 1, 1)
    # deterministic sign
    idx = comps.abs().argmax(1)
    signs = torch.sign(comps[torch.arange(k), idx])
    signs[signs == 0] = 1
    comps = comps * signs[:, None]
    if k < n_components:
        pad = n_components - k
        comps = torch.cat([comps, comps.new_zeros(pad, x.shape[1])])
        var = torch.cat([var, var.new_zeros(pad)])
    return mean, comps, var


def _minmax(v: torch.Tensor, dim: int | tuple[int, ...]) -> torch.Tensor:
    lo = v.amin(dim=dim, keepdim=True)
    hi = v.amax(dim=dim, keepdim=True)
    rng = hi - lo
    # a constant component carries no information: map it to 0 instead of dividing by zero
    return torch.where(rng > 0, (v - lo) / rng.clamp_min(torch.finfo(v.dtype).tiny), torch.zeros_like(v))


def _border_mask(grid: tuple[int, int], device) -> torch.Tensor:
    h, w = grid
    m = torch.zeros(h, w, dtype=torch.bool, device=device)
    m[0, :] = m[-1, :] = m[:, 0] = m[:, -1] = True
    return m.flatten()


def _check(patch: torch.Tensor, grid: tuple[int, int]) -> tuple[int, int]:
    if patch.ndim != 3:
        raise ValueError(f"expected patch tokens of shape (B, N, D), got {tuple(patch.shape)}")
    h, w = int(grid[0]), int(grid[1])
    if h * w != patch.shape[1]:
        raise ValueError(f"grid {h}x{w} = {h * w} patches does not match N = {patch.shape[1]} patch tokens")
    return h, w


def foreground_mask(patch: torch.Tensor, grid: tuple[int, int], threshold: float = 0.5,
                    joint: bool = True) -> torch.Tensor:
    """(B, N) foreground: the first component, oriented so border patches score lower, min-max scaled, > threshold."""
    h, w = _check(patch, grid)
    B, N, D = patch.shape
    border = _border_mask((h, w), patch.device)
    x = patch.detach().to(torch.float64)
    groups = [x.reshape(B * N, D)] if joint else [x[b] for b in range(B)]
    scores = []
    for g in groups:
        mean, comps, _ = pca_fit(g, 1)
        s = ((g - mean) @ comps[0]).reshape(-1, N)
        if border.any() and (~border).any() and s[:, border].mean() > s[:, ~border].mean():
            s = -s
        scores.append(s)
    s = torch.cat(scores)
    s = _minmax(s, dim=(0, 1)) if joint else _minmax(s, dim=1)
    return s > threshold


def pca_rgb(patch: torch.Tensor, grid: tuple[int, int], n_components: int = 3,
            fg_threshold: float | None = None, joint: bool = True) -> torch.Tensor:
    """The first principal components of ``patch`` (B, N, D; row-major over the grid) as (B, n_components, h, w) in
    [0, 1]: one PCA over all images (``joint``) or one per image; with ``fg_threshold`` the background is black
    and the colours come from a PCA of the foreground patches only."""
    h, w = _check(patch, grid)
    if n_components < 1:
        raise ValueError(f"n_components must be >= 1, got {n_components}")
    B, N, D = patch.shape
    x = patch.detach().to(torch.float64)
    fg = foreground_mask(patch, (h, w), fg_threshold, joint) if fg_threshold is not None else \
        torch.ones(B, N, dtype=torch.bool, device=patch.device)
    out = torch.zeros(B, N, n_components, dtype=torch.float64, device=patch.device)
    groups = [torch.arange(B)] if joint else [torch.tensor([b]) for b in range(B)]
    for bs in groups:
        sel = fg[bs]  # (b, N)
        rows = x[bs][sel]  # (M, D) foreground patches of this group
        if rows.shape[0] == 0:
            continue
        mean, comps, _ = pca_fit(rows, n_components)
        proj = _minmax((rows - mean) @ comps.T, dim=0)
        sub = out[bs]
        sub[sel] = proj
        out[bs] = sub
    return out.permute(0, 2, 1).reshape(B, n_components, h, w).to(torch.float32)
