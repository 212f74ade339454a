"""One results schema (tokenmix/results.py): `make probe TASK=voc DATA=demo CKPT=random` and
`make analyze TASK=pca DATA=demo CKPT=random` write results.json with the same top-level keys, on tiny demo data."""
import json
import math

import pytest

from tokenmix import paths
from tokenmix.results import KEYS, backbone_entry, write_results

EXPECTED = {"task", "variant", "data", "backbone", "metrics", "config", "created", "host"}  # written out by hand


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from datamodules.demo import DemoSpec, ensure_demo_data
    return ensure_demo_data(tmp_path_factory.mktemp("demo"), spec=DemoSpec(cls_train=3, cls_val=2, voc_train=4,
                                                                             voc_val=3, nyu_train=2, nyu_test=2))


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_probe_and_analysis_results_have_the_same_top_level_keys(demo, tmp_path, monkeypatch):
    import datamodules.demo
    from analysis import run as analysis_run
    from probes import run as probe_run
    monkeypatch.setattr(paths, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(datamodules.demo, "ensure_demo_data", lambda *a, **k: demo)  # analysis: the tiny demo
    probe_path = probe_run.main(["--task", "voc", "--data", "demo", "--ckpt", "random", "--data-root", str(demo),
                                 "--arch", "vit_test_patch8", "--max-epochs", "1", "--batch-size", "2"])
    analysis_run.main(["--task", "pca", "--data", "demo", "--ckpt", "random", "--arch", "vit_test_patch8",
                       "--no-tensorboard", "--num-vis", "2", "--max-images", "3"])
    probe = json.loads(probe_path.read_text())
    analysis_path, = (tmp_path / "runs" / "softmax_random" / "analysis" / "pca").glob("version_*/results.json")
    analysis = json.loads(analysis_path.read_text())
    assert set(probe) == set(analysis) == EXPECTED == set(KEYS)
    for r, task in ((probe, "voc"), (analysis, "pca")):
        assert r["task"] == task and r["variant"] == "softmax_random" and r["data"] == "demo"
        assert set(r["backbone"]) == {"source", "config", "checkpoint", "sha256"}
        assert r["backbone"]["source"] == "random" and r["backbone"]["config"]["arch"] == "vit_test_patch8"
        assert r["backbone"]["checkpoint"] is None and r["backbone"]["sha256"] is None
    assert "mIoU" in probe["metrics"] and len(analysis["metrics"]["explained_variance_ratio"]) == 3
    assert analysis["metrics"]["figures"] and probe["config"]["dataset"] == "demo_voc"


def test_writer_cleans_values_and_never_merges_two_runs(tmp_path):
    fields = dict(task="knn", variant="softmax", data="", metrics={"top1": {20: float("nan")}, "x": math.inf},
                  config={"img_size": (8, 8), "root": tmp_path}, backbone=backbone_entry({"arch": "a"}, tmp_path / "c",
                                                                                        "ab" * 32))
    path = write_results(tmp_path, **fields)
    r = json.loads(path.read_text())
    assert r["metrics"] == {"top1": {"20": None}, "x": None} and r["config"] == {"img_size": [8, 8],
                                                                                 "root": str(tmp_path)}
    assert r["data"] == "demo" and r["backbone"]["checkpoint"] == str(tmp_path / "c")
    with pytest.raises(FileExistsError, match="fresh version folder"):
        write_results(tmp_path, **fields)
    write_results(tmp_path, overwrite=True, **{**fields, "task": "pretrain"})
    assert json.loads(path.read_text())["task"] == "pretrain"
    with pytest.raises(ValueError, match="backbone entry lacks"):
        write_results(tmp_path / "x", **{**fields, "backbone": {"checkpoint_sha256": "0"}})
