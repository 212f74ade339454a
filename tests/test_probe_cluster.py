"""Overclustering probe: equal, seed by seed, to a transcription of Leopart's / NeCo's own evaluation
(official/leopart.py) on features with uneven patch norms and channel scales; the probe end to end on the VOC
fixture (every K, LAYER=all); 2 processes equal to 1."""
from __future__ import annotations

import json

import pytest
import torch

from official.leopart import overcluster_eval
from probes.headfree.overcluster import ClusterSettings, kmeans_labels, overcluster, resolve_ks
from probes.run import main

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _one_faiss_thread():
    """faiss' OpenMP threads spin on a loaded 2-core machine (18x slower); its k-means does not depend on them."""
    import faiss
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(before)


def _scene(n=8, C=4, D=64, grid=8, patch=8, seed=0):
    """(N, D, grid, grid) features and (N, grid*patch, grid*patch) masks: rectangles of classes, a band of ignored
    pixels; each patch = its majority class's prototype + noise, channels on log-normal scales and every patch
    multiplied by its own log-normal norm (standardising and L2-normalising then disagree)."""
    g = torch.Generator().manual_seed(seed)
    size = grid * patch
    masks = torch.randint(0, C, (n, 1, 1), generator=g).expand(n, size, size).clone()
    for i in range(n):
        for _ in range(3):
            c = int(torch.randint(0, C, (1,), generator=g))
            y, x = torch.randint(0, size * 3 // 4, (2,), generator=g).tolist()
            hh, ww = torch.randint(size // 8, size * 5 // 8, (2,), generator=g).tolist()
            masks[i, y:y + hh, x:x + ww] = c
    masks[:, :2] = 255
    cells = masks.clamp(max=C - 1).reshape(n, grid, patch, grid, patch).permute(0, 1, 3, 2, 4).reshape(n, grid, grid, -1)
    protos = 2 * torch.randn(C, D, generator=g)
    chan = torch.exp(torch.randn(D, generator=g))
    norms = torch.exp(torch.randn(n, grid, grid, 1, generator=g))
    feats = (protos[cells.mode(-1).values] + 1.5 * torch.randn(n, grid, grid, D, generator=g)) * chan * norms
    return feats.permute(0, 3, 1, 2).contiguous(), masks


def test_overcluster_equals_leopart_evaluation_seed_by_seed():
    C = 4
    feats, masks = _scene(C=C)
    n, d, h, w = feats.shape
    ks = [C, 2 * C, 5 * C]
    ours = overcluster(feats, masks, C, ks)
    for k in ks:
        tokens = feats.permute(0, 2, 3, 1).reshape(-1, d).clone()  # the reference standardises in place
        ref = overcluster_eval(tokens, masks[:, None].float(), k, C, spatial_res=h)
        assert ours[k]["seeds"] == pytest.approx(ref, abs=1e-12)
        assert ours[k]["mIoU"] == pytest.approx(sum(ref) / len(ref), abs=1e-12)
        assert ours[k]["matching"] == ("hungarian" if k == C else "many-to-one") and ours[k]["pca_dim"] == 50
    # the seeds differ (k-means from different starts), and more clusters fit the classes better
    assert len(set(ours[2 * C]["seeds"])) > 1 and ours[C]["mIoU"] < ours[5 * C]["mIoU"]


def test_settings_pca_capped_and_errors():
    feats, masks = _scene(n=2, C=3, D=12, grid=4, patch=2)
    res = overcluster(feats, masks, 3, [3], ClusterSettings(seeds=2, eval_size=8))
    assert res[3]["pca_dim"] == 12 and len(res[3]["seeds"]) == 2 and res[3]["std"] >= 0
    assert resolve_ks("1x,2x,300", 21) == [21, 42, 300]
    with pytest.raises(ValueError, match="--cluster-k"):
        resolve_ks("0", 21)
    with pytest.raises(ValueError, match="needs at least 40 patches"):
        kmeans_labels(feats.permute(0, 2, 3, 1).reshape(-1, 12).numpy(), 40, 0)


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
    assert [v["matching"] for v in m.values()] == ["hungarian", "many-to-one", "many-to-one"]
    assert all(0 < v["mIoU"] <= 100 and len(v["seeds"]) == 5 and v["std"] >= 0 for v in m.values())
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
