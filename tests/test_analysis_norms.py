"""Patch-norm statistics against numpy, and the high-norm mode on constructed distributions."""
import numpy as np
import pytest
import torch

from analysis.norms import high_norm_mode, norm_stats, otsu_threshold, patch_norms


def test_stats_match_numpy():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 20, 16, generator=g) * torch.rand(3, 20, 1, generator=g) * 5
    st = norm_stats(x)
    n = np.linalg.norm(x.double().numpy(), axis=-1).ravel()
    np.testing.assert_allclose(patch_norms(x).numpy().ravel(), n, rtol=1e-12)
    assert st["count"] == 60
    assert st["mean"] == pytest.approx(n.mean()) and st["std"] == pytest.approx(n.std())
    assert st["median"] == pytest.approx(np.median(n)) and st["max"] == pytest.approx(n.max())
    for q, v in st["quantiles"].items():
        assert v == pytest.approx(np.quantile(n, float(q)))
    assert sum(st["hist_counts"]) == 60
    assert st["share_above_2x_median"] == pytest.approx((n > 2 * np.median(n)).mean())


def test_otsu_brute_force():
    v = np.array([1.0, 1.1, 1.2, 5.0, 5.2, 9.0])
    best, arg = -1, None
    for k in range(1, len(v)):
        a, b = v[:k], v[k:]
        s = k * (len(v) - k) * (a.mean() - b.mean()) ** 2
        if s > best:
            best, arg = s, (v[k - 1] + v[k]) / 2
    assert otsu_threshold(v) == pytest.approx(arg)


def test_outlier_tokens_are_found_exactly():
    # 3% of the tokens scaled x12: the artifact pattern of Darcet et al. (2024)
    g = torch.Generator().manual_seed(1)
    B, N, D = 8, 64, 32
    x = torch.randn(B, N, D, generator=g)
    outlier = torch.rand(B, N, generator=g) < 0.03
    x[outlier] *= 12
    st = norm_stats(x)
    hm = high_norm_mode(patch_norms(x))
    assert hm["bimodal"] and np.array_equal(hm["mask"], outlier.numpy())
    assert st["high_norm_share"] == pytest.approx(outlier.float().mean().item())
    n = patch_norms(x)
    assert n[~outlier].max() < st["high_norm_threshold"] < n[outlier].min()


@pytest.mark.parametrize("name,sample", [
    ("lognormal", lambda r: np.exp(r.normal(2, 0.3, 3000))),
    ("uniform", lambda r: r.uniform(1, 2, 3000)),
    ("exponential", lambda r: r.exponential(1.0, 3000)),
    ("chi", lambda r: np.linalg.norm(r.normal(size=(3000, 64)), axis=1)),
])
def test_unimodal_has_no_high_norm_mode(name, sample):
    for seed in range(3):
        hm = high_norm_mode(sample(np.random.default_rng(seed)))
        assert not hm["bimodal"] and hm["share"] == 0.0 and not hm["mask"].any(), name


def test_majority_high_mode_is_not_an_outlier_mode():
    r = np.random.default_rng(0)
    n = np.concatenate([np.exp(r.normal(1, 0.1, 300)), np.exp(r.normal(3, 0.1, 700))])
    hm = high_norm_mode(n)
    assert not hm["bimodal"] and hm["gmm"]["w_hi"] > 0.5


def test_constant_norm_with_rounding_noise_is_unimodal():
    # LayerNorm output at init: every token has norm sqrt(D) up to float32 rounding
    x = torch.nn.functional.layer_norm(torch.randn(6, 16, 32), (32,))
    st = norm_stats(x)
    assert st["std"] < 1e-4 and not st["bimodal"] and st["high_norm_share"] == 0.0
