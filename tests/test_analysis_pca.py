"""PCA maps against a direct numpy computation (eigendecomposition of the covariance)."""
import numpy as np
import pytest
import torch

from tokenmix.pca import foreground_mask, pca_fit, pca_rgb


def numpy_pca_maps(x: np.ndarray, k: int = 3) -> np.ndarray:
    """(M, D) -> (M, k) projections on the top-k covariance eigenvectors, sign-fixed, min-max scaled per component."""
    xc = x - x.mean(0)
    cov = xc.T @ xc / (x.shape[0] - 1)
    w, v = np.linalg.eigh(cov)
    v = v[:, np.argsort(w)[::-1][:k]]
    v *= np.sign(v[np.abs(v).argmax(0), np.arange(k)])  # largest |loading| positive
    p = xc @ v
    return (p - p.min(0)) / (p.max(0) - p.min(0))


def features(B=3, h=4, w=5, D=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    # anisotropic so the top components are well separated (no near-ties that make eigenvectors unstable)
    scale = torch.tensor([8.0, 5.0, 3.0] + [0.5] * (D - 3))
    mix = torch.linalg.qr(torch.randn(D, D, generator=g))[0]
    return (torch.randn(B, h * w, D, generator=g) * scale) @ mix.T + 2.0, (h, w)


def test_joint_pca_matches_numpy():
    x, grid = features()
    B, N, D = x.shape
    out = pca_rgb(x, grid, joint=True)
    assert out.shape == (B, 3, *grid)
    ref = numpy_pca_maps(x.reshape(-1, D).double().numpy()).reshape(B, N, 3)
    got = out.permute(0, 2, 3, 1).reshape(B, N, 3).numpy()
    np.testing.assert_allclose(got, ref, atol=1e-5)
    # min-max over the set: every channel reaches 0 and 1 somewhere in the set
    assert np.allclose(got.reshape(-1, 3).min(0), 0) and np.allclose(got.reshape(-1, 3).max(0), 1)


def test_per_image_pca_matches_numpy():
    x, grid = features(seed=1)
    B, N, D = x.shape
    out = pca_rgb(x, grid, joint=False).permute(0, 2, 3, 1).reshape(B, N, 3).numpy()
    for b in range(B):
        np.testing.assert_allclose(out[b], numpy_pca_maps(x[b].double().numpy()), atol=1e-5)
    # per-image fits differ from the joint fit
    joint = pca_rgb(x, grid, joint=True).permute(0, 2, 3, 1).reshape(B, N, 3).numpy()
    assert not np.allclose(out, joint, atol=1e-3)


def test_pca_fit_components_and_variance():
    x, _ = features(seed=2)
    m = x.reshape(-1, x.shape[-1]).double()
    mean, comps, var = pca_fit(m, 3)
    np.testing.assert_allclose(comps @ comps.T, np.eye(3), atol=1e-10)
    w = np.sort(np.linalg.eigvalsh(np.cov(m.numpy().T)))[::-1][:3]
    np.testing.assert_allclose(var.numpy(), w, rtol=1e-8)


def test_foreground_threshold_separates_object_and_fits_pca_on_it():
    h = w = 6
    g = torch.Generator().manual_seed(3)
    B, D = 2, 10
    x = torch.randn(B, h * w, D, generator=g) * 0.3
    fg = torch.zeros(h, w, dtype=torch.bool)
    fg[2:5, 1:4] = True  # an interior "object": the border is all background
    fg = fg.flatten()
    x[:, fg] += 6.0 * torch.nn.functional.normalize(torch.ones(D), dim=0)  # the object differs along one axis
    x[:, fg, 1] += torch.randn(B, int(fg.sum()), generator=g) * 2  # variance inside the object
    mask = foreground_mask(x, (h, w), threshold=0.5)
    assert torch.equal(mask, fg.expand(B, -1))
    out = pca_rgb(x, (h, w), fg_threshold=0.5, joint=True).permute(0, 2, 3, 1).reshape(B, h * w, 3)
    assert torch.all(out[:, ~fg] == 0)  # background black
    ref = numpy_pca_maps(x[:, fg].reshape(-1, D).double().numpy()).reshape(B, -1, 3)
    np.testing.assert_allclose(out[:, fg].numpy(), ref, atol=1e-5)
    # flipping the global sign of the features must not turn the background into foreground
    assert torch.equal(foreground_mask(-x, (h, w), threshold=0.5), mask)


def test_degenerate_and_bad_input():
    const = torch.ones(2, 16, 8)
    out = pca_rgb(const, (4, 4))
    assert torch.isfinite(out).all() and torch.all(out == 0)
    with pytest.raises(ValueError, match="grid 3x3"):
        pca_rgb(torch.randn(1, 16, 8), (3, 3))
    with pytest.raises(ValueError, match=r"\(B, N, D\)"):
        pca_rgb(torch.randn(16, 8), (4, 4))
    # fewer dimensions than components: the missing components are zero channels
    out2 = pca_rgb(torch.randn(1, 16, 2), (4, 4))
    assert out2.shape == (1, 3, 4, 4) and torch.all(out2[:, 2] == 0)
