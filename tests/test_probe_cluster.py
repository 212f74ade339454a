"""Overclustering probe: k-means equal to scikit-learn's given the same init, matching + mIoU equal to an
independent scikit-learn / scipy / numpy computation, the probe end to end on the VOC fixture (every K, LAYER=all)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from probes.overcluster import init_centres, kmeans, overcluster, resolve_ks
from probes.run import main

sklearn = pytest.importorskip("sklearn")  # dev extra (pyproject.toml)


def _blobs(n_per=40, k=6, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(k, d, generator=g, dtype=torch.float64) * 3
    return (centres[:, None] + torch.randn(k, n_per, d, generator=g, dtype=torch.float64)).reshape(-1, d)


@pytest.mark.parametrize("k", [3, 6, 11])
def test_kmeans_equals_sklearn_from_the_same_init(k):
    from sklearn.cluster import KMeans
    x = _blobs()
    init = init_centres(x, k, seed=3)
    labels, centres = kmeans(x, k, init=init, max_iter=300)
    ref = KMeans(n_clusters=k, init=init.numpy(), n_init=1, max_iter=300, tol=0.0, algorithm="lloyd").fit(x.numpy())
    assert np.array_equal(labels.numpy(), ref.labels_)
    assert np.allclose(centres.numpy(), ref.cluster_centers_, atol=1e-10)


def _independent(feats, masks, C, ks, seed, max_iter):
    """The same protocol with scikit-learn's KMeans (from our seeded init), its confusion matrix, scipy's Hungarian
    matching, numpy majority vote and IoU."""
    from scipy.optimize import linear_sum_assignment
    from sklearn.cluster import KMeans
    from sklearn.metrics import confusion_matrix
    n, d, h, w = feats.shape
    x = F.normalize(feats.permute(0, 2, 3, 1).reshape(-1, d).double(), dim=1)
    scale = masks.shape[-1] // w
    out = {}
    for k in ks:
        km = KMeans(n_clusters=k, init=init_centres(x, k, seed).numpy(), n_init=1, max_iter=max_iter, tol=0.0,
                    algorithm="lloyd").fit(x.numpy())
        pred = km.labels_.reshape(n, h, w).repeat(scale, 1).repeat(scale, 2)  # nearest upsampling by `scale`
        gt = masks.numpy()
        keep = gt != 255
        cm = confusion_matrix(gt[keep], pred[keep], labels=range(max(C, k)))[:C, :k].astype(np.float64)
        if k <= C:
            iou = cm / np.maximum(cm.sum(1, keepdims=True) + cm.sum(0, keepdims=True) - cm, 1e-8)
            rows, cols = linear_sum_assignment(-iou)
            to_class = np.zeros(k, dtype=int)
            to_class[cols] = rows
        else:
            to_class = cm.argmax(0)
        folded = np.stack([cm[:, to_class == c].sum(1) for c in range(C)], 1)
        tp = np.diag(folded)
        out[k] = float(np.mean(tp / np.maximum(folded.sum(0) + folded.sum(1) - tp, 1e-8)))
    return out


def test_overcluster_equals_independent_implementation():
    g = torch.Generator().manual_seed(0)
    C, n, h, w = 4, 6, 4, 4
    masks = torch.randint(0, C, (n, h, w), generator=g)
    masks = masks.repeat_interleave(2, 1).repeat_interleave(2, 2)  # labels at 2x the feature grid
    masks[:, 0, 0] = 255                                            # some ignored pixels
    protos = torch.randn(C, 8, generator=g, dtype=torch.float64)
    feats = protos[masks[:, ::2, ::2].clamp(max=C - 1)] + 0.8 * torch.randn(n, h, w, 8, generator=g,
                                                                           dtype=torch.float64)
    feats = feats.permute(0, 3, 1, 2)
    ks = [C, 2 * C, 10]
    ours = overcluster(feats, masks, C, ks, seed=1, max_iter=300)
    ref = _independent(feats, masks, C, ks, seed=1, max_iter=300)
    for k in ks:
        assert ours[k]["mIoU"] == pytest.approx(ref[k], abs=1e-12)
    assert ours[C]["matching"] == "hungarian" and ours[2 * C]["matching"] == "majority"
    assert 0.3 < ours[C]["mIoU"] < 1.0  # informative features: well above chance, not trivially perfect


def test_resolve_ks_and_errors():
    assert resolve_ks("1x,2x,300", 21) == [21, 42, 300]
    with pytest.raises(ValueError, match="--cluster-k"):
        resolve_ks("0", 21)
    with pytest.raises(ValueError, match="needs at least 5 patches"):
        init_centres(torch.zeros(4, 2), 5, 0)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_overcluster_probe_on_voc_fixture_and_layer_all(fixtures_root, tmp_path):
    argv = ["--runs-dir", str(tmp_path), "--task", "voc", "--kind", "overcluster", "--arch", "vit_test_patch8",
            "--ckpt", "random", "--batch-size", "2", "--data", "voc", "--data-root", str(fixtures_root / "voc"),
            "--img-size", "64", "--cluster-k", "1x,2x,50"]
    res = json.loads(main(argv).read_text())
    assert res["task"] == "voc_overcluster" and res["metrics"]["num_val"] == 1
    m = res["metrics"]["mIoU"]
    assert list(m) == ["21", "42", "50"]
    assert [v["matching"] for v in m.values()] == ["hungarian", "majority", "majority"]
    assert all(0 < v["mIoU"] <= 100 for v in m.values())
    path = main([*argv, "--layer", "all", "--cluster-k", "1x"])
    layers = json.loads(path.read_text())["metrics"]["layers"]
    assert list(layers) == ["block_0", "block_1"] and all(list(v["mIoU"]) == ["21"] for v in layers.values())
    assert (path.parent / "depth_profile.png").stat().st_size > 1000


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_overcluster_two_processes_equal_one(tmp_path):
    import os
    import sys
    from pathlib import Path

    from datamodules.demo import DemoSpec, ensure_demo_data
    from helpers import procs
    repo = Path(__file__).resolve().parents[1]
    demo = ensure_demo_data(tmp_path / "demo", spec=DemoSpec(cls_train=2, cls_val=2, voc_train=2, voc_val=3,
                                                             nyu_train=2, nyu_test=2))
    common = ["--task", "voc", "--kind", "overcluster", "--arch", "vit_test_patch8", "--ckpt", "random",
              "--batch-size", "2", "--data", "demo", "--data-root", str(demo), "--img-size", "32",
              "--cluster-k", "1x,2x"]
    one = json.loads(main(["--runs-dir", str(tmp_path / "one"), *common]).read_text())["metrics"]
    env = dict(os.environ, PYTHONPATH=str(repo), OMP_NUM_THREADS="1")
    p = procs.run([sys.executable, "-m", "probes.run", "--runs-dir", str(tmp_path / "two"), "--devices", "2", *common],
                  cwd=repo, env=env, timeout=500)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    found = sorted((tmp_path / "two").glob("*/probe/*/version_*/results.json"))
    assert len(found) == 1, found
    two = json.loads(found[0].read_text())["metrics"]
    assert one["num_val"] == two["num_val"] == 3 and one["mIoU"] == two["mIoU"]
