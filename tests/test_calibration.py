"""The calibration (analysis/calibration.py) on the session's shared trained tiny entmax run: at a = 0 its measures
are the numbers the independent online check (DenseProbeCheck, in the run's summary.json) computed on the same
checkpoint and images; from a = 0 to a = 1 of the diffusion dial every dense measure moves in its stated direction
beyond its own noise band, and the one that cannot (exact zeros: this barely trained entmax has none) is flagged
blind; the noise rule against hand-worked numbers."""
from __future__ import annotations

import json
import math

import pytest
import torch

from helpers import shared_runs

pytestmark = pytest.mark.timeout(300)


def _calibrate(monkeypatch, tmp_path, ckpt, root, *flags):
    from analysis import calibration
    from tokenmix import paths
    monkeypatch.setattr(paths, "RUNS", tmp_path / "runs")
    return calibration.main(["--ckpt", str(ckpt), "--data", "demo", "--data-root", str(root), "--no-tensorboard",
                             "--knn-train", "0", *flags])


@pytest.mark.slow
def test_a_zero_equals_the_online_dense_check(entmax_run, monkeypatch, tmp_path):
    c = shared_runs.DENSE_CHECK
    res = _calibrate(monkeypatch, tmp_path, entmax_run.last, entmax_run.small_voc, "--levels", "0,1",
                     "--max-train", str(c["max_samples"]), "--max-val", str(c["max_samples"]), "--img-size",
                     str(c["img_size"]), "--batch-size", str(c["batch_size"]), "--attn-images", str(c["attn_images"]),
                     "--dial-blocks", "2", "--seeds", "1", "--bootstrap", "10")
    [summary] = entmax_run.runs.glob("entmax/pretrain/tiny/version_0/summary.json")
    end = json.loads(summary.read_text())["metrics"]["dense_series"][-1]  # the check on last.ckpt's weights
    got = {k: r["values"][0] for k, r in res["metrics"]["measures"].items()}
    for ours, theirs in (("ridge_mIoU", "dense/mIoU"), ("retrieval_mIoU", "dense/retrieval_mIoU"),
                         ("pib", "diffusion/pib_cls"), ("cls_patch_cosine", "diffusion/cls_patch_cosine"),
                         ("effective_rank", "diffusion/effective_rank"), ("attn_entropy", "diffusion/attn_entropy"),
                         ("attn_zero_share", "diffusion/attn_zero_share")):
        assert got[ours] == pytest.approx(end[theirs], rel=1e-5, abs=1e-6), ours
    assert res["task"] == "calibration" and res["metrics"]["dial"]["blocks"] == [0, 1]
    assert (tmp_path / "runs" / "entmax" / "analysis" / "calibration" / "version_0" / "calibration.png").is_file()


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    """More validation scenes than the shared run's 5, so that bootstrap bands are narrow enough to read."""
    from datamodules.demo import DemoSpec, ensure_demo_data
    return ensure_demo_data(tmp_path_factory.mktemp("demo"), spec=DemoSpec(
        cls_train=1, cls_val=1, voc_train=24, voc_val=48, nyu_train=1, nyu_test=1))


@pytest.mark.slow
def test_every_dense_measure_moves_beyond_its_noise_band(entmax_run, scenes, monkeypatch, tmp_path):
    res = _calibrate(monkeypatch, tmp_path, entmax_run.last, scenes, "--levels", "0,1", "--dial-mode", "tokens",
                     "--img-size", "64", "--seeds", "2", "--bootstrap", "50")
    m = res["metrics"]["measures"]
    expected = {"ridge_mIoU": "down", "retrieval_mIoU": "down", "overcluster_mIoU": "down", "pib": "down",
                "patch_score_spread": "down", "cls_patch_cosine": "up", "effective_rank": "down",
                "attn_entropy": "up", "attn_zero_share": "down"}
    assert {k: r["expected"] for k, r in m.items()} == expected
    for key, r in m.items():
        band = r["noise"]
        assert band["sd"] is not None and band["half_width"] == pytest.approx(2 * band["sd"]), key
        if key == "attn_zero_share":  # no exact zero at a = 0: nothing to lose, and the report says so
            assert r["values"] == [0.0, 0.0] and r["blind"] and key in res["metrics"]["blind"]
            continue
        delta = r["values"][-1] - r["values"][0]
        assert (delta > 0) == (r["expected"] == "up"), (key, r["values"])
        assert abs(delta) > band["half_width"], (key, delta, band)
        assert r["verdict"] == "moves" and not r["blind"], key
    # at a = 1 every block input token is the mean token: the patches are one vector, the map is flat
    assert m["cls_patch_cosine"]["values"][-1] == pytest.approx(1.0, abs=1e-5)
    assert m["patch_score_spread"]["values"][-1] == pytest.approx(0.0, abs=1e-5)


def test_noise_rule_and_bands_against_hand_worked_numbers():
    from tokenmix.noise import Direction, NoiseBand, bootstrap, combine, inside_noise, noise_band, verdict
    band = noise_band([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0], "seeds")  # sample sd = sqrt(32 / 7)
    assert band.sd == pytest.approx(math.sqrt(32 / 7)) and band.half_width == pytest.approx(2 * math.sqrt(32 / 7))
    assert combine(NoiseBand(3.0, 5, "seeds"), NoiseBand(4.0, 100, "bootstrap")).sd == pytest.approx(5.0)
    assert inside_noise(0.4, 0.2) and not inside_noise(-0.41, 0.2)
    assert verdict(-0.41, NoiseBand(0.2, 5, "seeds"), Direction.DOWN).value == "moves"
    assert verdict(0.41, NoiseBand(0.2, 5, "seeds"), Direction.DOWN).value == "wrong way"
    assert verdict(5.0, NoiseBand(None, 1, "seeds"), Direction.UP).value == "blind"
    # the bootstrap sd of a mean of n values: sd / sqrt(n) (population sd), within the resampling error
    x = torch.arange(50, dtype=torch.float64) ** 1.5
    reps = bootstrap(50, lambda i: x[i].mean().item(), replicates=2000, seed=1)
    assert noise_band(reps, "bootstrap").sd == pytest.approx(x.std(unbiased=False).item() / math.sqrt(50), rel=0.08)
    assert bootstrap(50, lambda i: x[i].mean().item(), 5, seed=3) == bootstrap(50, lambda i: x[i].mean().item(), 5,
                                                                                    seed=3)


def test_report_table_marks_blind_and_wrong_way(tmp_path):
    from analysis.calibration import calibration_section
    from analysis.report import collect
    from tokenmix.results import write_results

    def measure(delta, half, verdict):
        return {"label": "x", "expected": "down", "values": [1.0, 1.0 + delta], "response": delta, "verdict": verdict,
                "noise": {"sd": half / 2, "half_width": half}, "blind": verdict == "blind", "wrong_way_at": []}
    metrics = {"dial": {"mode": "tokens", "blocks": [2, 3]},
               "measures": {"ridge_mIoU": measure(-12.5, 2.8, "moves"), "pib": measure(1.0, 5.5, "blind"),
                            "effective_rank": measure(3.0, 0.2, "wrong way")}}
    write_results(tmp_path / "softmax" / "analysis" / "calibration" / "version_0", task="calibration",
                  variant="softmax", data="demo", metrics=metrics, config={},
                  backbone={"source": "checkpoint", "config": {}, "checkpoint": None, "sha256": None})
    lines = calibration_section(collect(tmp_path))
    row = next(line for line in lines if line.startswith("| softmax | demo | tokens [2, 3] |"))
    cells = [c.strip() for c in row.strip("|").split("|")][3:]
    assert cells[0] == "-12.5 ± 2.8" and cells[3] == "+1 ± 5.5 **blind**" and cells[6] == "+3 ± 0.2 *wrong way*"
    assert cells[1] == "not run"  # retrieval was not in this run
    assert calibration_section([]) == []
