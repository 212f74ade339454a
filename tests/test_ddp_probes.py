"""Probes with 2 processes on CPU (gloo, Lightning DDP): sharded + gathered features, k-NN equal to 1 process,
linear / segmentation / depth probes write results.json with metrics over the whole validation set."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import procs
from datamodules.demo import DemoSpec, ensure_demo_data
from probes.core.features import gather_shards, shard_indices
from probes.run import main

REPO = Path(__file__).resolve().parents[1]
TINY = ["--arch", "vit_test_patch8", "--ckpt", "random", "--data", "demo", "--batch-size", "4"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return ensure_demo_data(tmp_path_factory.mktemp("demo"), spec=DemoSpec(cls_train=3, cls_val=2, voc_train=4,
                                                                          voc_val=3, nyu_train=4, nyu_test=3))


def _probe2(runs: Path, *argv: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "probes.run", "--runs-dir", str(runs), "--devices", "2", *TINY, *argv]
    p = procs.run(cmd, cwd=REPO, env=env, timeout=400)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    found = sorted(runs.glob("*/probe/*/version_*/results.json"))
    assert len(found) == 1, found  # one folder for the run, not one per process
    return json.loads(found[0].read_text())


def test_gather_shards_restores_dataset_order_without_duplicates():
    n, world = 7, 3
    full = torch.arange(n * 2).reshape(n, 2)  # hand-made: row i = (2i, 2i+1)
    shards = [full[shard_indices(n, r, world)] for r in range(world)]
    assert sorted(sum((shard_indices(n, r, world) for r in range(world)), [])) == list(range(n))
    per = -(-n // world)

    def fake_all_gather(t):  # what every rank receives: each rank's padded shard, stacked
        return torch.stack([torch.cat([s, s.new_zeros(per - len(s), 2)]) for s in shards])
    for r in range(world):
        assert torch.equal(gather_shards(shards[r], n, r, world, fake_all_gather), full)


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_knn_two_processes_equals_one(demo, tmp_path):
    one = json.loads(main(["--runs-dir", str(tmp_path / "one"), "--task", "knn", *TINY, "--data-root", str(demo),
                           "--knn-k", "1,3,10"]).read_text())
    t0 = time.perf_counter()
    two = _probe2(tmp_path / "two", "--task", "knn", "--data-root", str(demo), "--knn-k", "1,3,10")
    print(f"2-process k-NN probe: {time.perf_counter() - t0:.1f} s")
    assert two["metrics"]["num_train"] == one["metrics"]["num_train"] == 24
    assert two["metrics"]["num_val"] == one["metrics"]["num_val"] == 16
    assert two["metrics"]["top1"] == one["metrics"]["top1"]
    assert two["metrics"]["top5"] == one["metrics"]["top5"]


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_trained_probes_two_processes_write_results(demo, tmp_path):
    # linear (cached features), segmentation and depth probes, one 2-process session for the three
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}", OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(REPO / "tests" / "ddp_helpers.py"), "probes", "--runs-dir", str(tmp_path),
           "--devices", "2", *TINY, "--data-root", str(demo), "--max-epochs", "2", "--", "imagenet", "voc", "nyuv2"]
    t0 = time.perf_counter()
    p = procs.run(cmd, cwd=REPO, env=env, timeout=500)
    print(f"2-process linear + seg + depth probes: {time.perf_counter() - t0:.1f} s")
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    for task, metric in (("imagenet", "best_top1"), ("voc", "mIoU"), ("nyuv2", "rmse")):
        found = sorted(tmp_path.glob(f"*/probe/{task}/*"))
        assert [f.name for f in found] == ["version_0"], found  # one folder per run, none per process
        res = json.loads((found[0] / "results.json").read_text())
        m = res["metrics"]
        assert m[metric] == m[metric] and len(m["history"]) == 2  # finite (not NaN), one entry per epoch
        assert res["config"]["devices"] == "2" and res["config"]["num_val"] == {"imagenet": 16, "voc": 3,
                                                                                  "nyuv2": 3}[task]
