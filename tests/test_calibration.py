"""The calibration (analysis/calibration.py, through `make analyze`'s one parser) on the session's shared trained tiny
entmax run: at a = 0 its measures are the numbers the independent online check (DenseProbeCheck, in the run's
summary.json, under the same registry keys) computed on the same checkpoint and images; the dose-response writes,
per measure, Δ(a) with paired intervals at every dose, the smallest detectable dose, the papers' effect and the
dial's manipulation check; the paired statistics against hand-worked numbers and scipy."""
from __future__ import annotations

import json
import math

import pytest
import torch

from helpers import shared_runs

pytestmark = pytest.mark.timeout(300)


def _calibrate(monkeypatch, tmp_path, ckpt, root, *flags):
    from analysis import run
    from tokenmix import paths
    monkeypatch.setattr(paths, "RUNS", tmp_path / "runs")
    return run.main(["--task", "calibration", "--ckpt", str(ckpt), "--data", "demo", "--data-root", str(root),
                     "--no-tensorboard", "--knn-train", "0", *flags])


@pytest.mark.slow
def test_a_zero_equals_the_online_dense_check(entmax_run, monkeypatch, tmp_path):
    c = shared_runs.DENSE_CHECK
    res = _calibrate(monkeypatch, tmp_path, entmax_run.last, entmax_run.small_voc, "--doses", "0,1",
                     "--max-train", str(c["max_samples"]), "--max-val", str(c["max_samples"]), "--img-size",
                     str(c["img_size"]), "--batch-size", str(c["batch_size"]), "--attn-images", str(c["attn_images"]),
                     "--dial-blocks", "2", "--seeds", "1", "--bootstrap", "10")
    [summary] = entmax_run.runs.glob("entmax/pretrain/tiny/version_0/summary.json")
    end = json.loads(summary.read_text())["metrics"]["dense_series"][-1]  # the check on last.ckpt's weights
    got = {k: r["values"][0] for k, r in res["metrics"]["measures"].items()}
    shared = set(got) & set(end)
    assert shared >= {"dense_mIoU", "dense_aAcc", "dense_retrieval_mIoU", "diffusion_pib_cls",
                      "diffusion_cls_patch_cosine", "diffusion_effective_rank", "diffusion_attn_entropy"}
    for key in shared:  # one key per measure in both files
        assert got[key] == pytest.approx(end[key], rel=1e-5, abs=1e-6), key
    assert res["task"] == "calibration" and res["metrics"]["dial"]["blocks"] == [0, 1]
    assert (tmp_path / "runs" / "entmax" / "analysis" / "calibration" / "version_0" / "calibration.png").is_file()


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    """More validation scenes than the shared run's 5, so that the paired intervals are narrow enough to read."""
    from datamodules.demo import DemoSpec, ensure_demo_data
    return ensure_demo_data(tmp_path_factory.mktemp("demo"), spec=DemoSpec(
        cls_train=1, cls_val=1, voc_train=12, voc_val=24, nyu_train=1, nyu_test=1))


@pytest.mark.slow
@pytest.mark.parametrize("dial, doses", [("semantic", [0.0, 0.05, 0.2, 0.4, 0.7, 1.0]), ("lazy", [0.0, 0.1, 0.4])])
def test_dose_response_per_measure(entmax_run, scenes, monkeypatch, tmp_path, dial, doses):
    res = _calibrate(monkeypatch, tmp_path, entmax_run.last, scenes, "--dial", dial, "--doses",
                     ",".join(map(str, doses)), "--img-size", "32", "--seeds", "2", "--bootstrap", "30",
                     "--seed-sd", "dense_mIoU=0.5")["metrics"]
    m = res["measures"]
    for key, r in m.items():
        assert [d["a"] for d in r["deltas"]] == doses[1:] and len(r["values"]) == len(doses), key
        for d, v in zip(r["deltas"], r["values"][1:]):
            assert d["delta"] == pytest.approx(v - r["values"][0], abs=1e-9), key  # Δ against a = 0
            assert d["half_width"] is None or d["lo"] == pytest.approx(d["delta"] - d["half_width"]), key
        star = r["smallest_dose"]
        if star is not None:  # the first dose whose interval excludes 0 on the expected side
            first = next(d for d in r["deltas"] if d["a"] == star)
            assert abs(first["delta"]) > first["half_width"] and r["change_at"] == first["delta"], key
            assert all(abs(d["delta"]) <= d["half_width"] or (d["delta"] > 0) != (r["expected"] == "up")
                       for d in r["deltas"] if d["a"] < star), key
        if r["detectable_change"] and r["n_images"]:  # se ∝ 1/√n to the full VOC val
            assert r["detectable_change_full"] < r["detectable_change"], key
    assert m["dense_mIoU"]["paper_effect"] == 5.98 and m["diffusion_pib_cls"]["paper_effect"] == 12.4
    assert m["dense_mIoU"]["deltas"][0]["seed_sd"] == 0.5  # --seed-sd widens only its measure
    assert m["dense_retrieval_mIoU"]["seeds"] == 1  # the memory holds every patch: one memory, not 2 fake seeds
    assert m["diffusion_attn_zero_share"]["flag"] in ("", "not detected") or not m["diffusion_attn_zero_share"][
        "applicable"]
    checks = res["dial"]["checks"]
    assert [c["a"] for c in checks] == doses and checks[0]["with"] == checks[0]["without"] == 0.0  # a = 0: untouched
    applied = [c["with"] - c["without"] for c in checks[1:]]
    assert all(x > 0 for x in applied) and applied[-1] > applied[0]  # the dose applied grows with a
    if dial == "semantic":  # patches turn towards [CLS]: cos(patch, [CLS]) is seen at some dose
        assert m["diffusion_cls_patch_cosine"]["smallest_dose"] is not None


def test_paired_statistics_against_hand_worked_numbers_and_scipy():
    from scipy import stats

    from tokenmix.noise import Z95, PairedDelta, paired_bootstrap, seed_delta
    x = torch.arange(60, dtype=torch.float64) ** 1.3
    y = x + torch.linspace(-1, 3, 60) ** 2  # per-image paired differences d_i
    d = y - x
    pd = paired_bootstrap(60, lambda i, s: (y if i is None else y[i]).mean().item(),
                          lambda i, s: (x if i is None else x[i]).mean().item(), replicates=3000, seed=2)
    assert pd.delta == pytest.approx(d.mean().item())
    # the paired bootstrap se of a mean difference: the population sd of d_i / √n (the image spread cancels)
    assert pd.se == pytest.approx(d.std(unbiased=False).item() / math.sqrt(60), rel=0.06)
    assert pd.se < (y.std() / math.sqrt(60)).item() / 5  # unpaired would be far wider
    sd = seed_delta([3.0, 4.0, 6.0], [1.0, 1.5, 2.0])  # differences 2, 2.5, 4
    lo, hi = stats.t.interval(0.95, 2, loc=8.5 / 3, scale=stats.sem([2.0, 2.5, 4.0]))
    assert sd.delta - sd.half_width == pytest.approx(lo) and sd.delta + sd.half_width == pytest.approx(hi)
    wide = PairedDelta(2.0, 0.6, 100, 200, "images", seed_sd=0.4)  # 1.96 * sqrt(0.36 + 2 * 0.16) = 1.6163
    assert wide.half_width == pytest.approx(Z95 * math.sqrt(0.68)) and wide.detected("up")
    assert not wide.detected("down") and wide.against("down") and not wide.against("none")
    assert PairedDelta(2.0, 0.6, 100, 200, "images").half_width_at(900) == pytest.approx(Z95 * 0.2)  # 0.6 / 3


def test_report_table_gives_the_smallest_dose_and_flags(tmp_path):
    from analysis.calibration import BLIND, calibration_section
    from analysis.report import collect
    from tokenmix.results import write_results

    def measure(star, change, hw, flag=""):
        return {"smallest_dose": star, "change_at": change, "detectable_change": hw, "flag": flag, "applicable": True}
    metrics = {"dial": {"mode": "semantic", "blocks": [2, 3]},
               "measures": {"dense_mIoU": measure(0.1, -1.84, 0.9), "diffusion_pib_cls": measure(None, None, 20.0,
                                                                                                  "not detected"),
                            "knn_top1": measure(0.4, -2.0, 1.5, BLIND)}}
    write_results(tmp_path / "softmax" / "analysis" / "calibration" / "version_0", task="calibration",
                  variant="softmax", data="demo", metrics=metrics, config={},
                  backbone={"source": "checkpoint", "config": {}, "checkpoint": None, "sha256": None})
    lines = calibration_section(collect(tmp_path))
    row = next(line for line in lines if line.startswith("| softmax | demo | semantic |"))
    cells = dict(zip(lines[lines.index(row) - 2].strip("|").split("|")[3:], row.strip("|").split("|")[3:]))
    cells = {k.strip(): v.strip() for k, v in cells.items()}
    assert cells["ridge seg. mIoU"] == "a* 0.1: -1.84 (±0.9)" and cells["Point-in-Box [CLS]"] == "not detected"
    assert cells["[CLS] k-NN top-1"] == f"a* 0.4: -2 (±1.5) **{BLIND}**" and cells["retrieval mIoU"] == "not run"
    assert calibration_section([]) == []
