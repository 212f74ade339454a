"""make report: results.json files -> Markdown + CSV with deltas, paper rows and 'not run' cells."""
import csv
import json
from pathlib import Path

import pytest

from analysis import report


def result(task, metrics, created="2026-01-01T00:00:00+00:00", data="demo", sha="a" * 64, variant=None):
    """A results.json in the one schema (tokenmix/results.py), written out by hand."""
    return {"task": task, "variant": variant, "data": data, "metrics": metrics, "config": {}, "created": created,
            "host": "h", "backbone": {"source": "checkpoint", "config": {}, "checkpoint": "x.ckpt", "sha256": sha}}


probe = analysis = result


def put(runs: Path, variant: str, kind: str, task: str, version: int, payload: dict) -> None:
    d = runs / variant / kind / task / f"version_{version}"
    d.mkdir(parents=True)
    (d / "results.json").write_text(json.dumps({**payload, "variant": payload["variant"] or variant}))


@pytest.fixture
def runs(tmp_path):
    r = tmp_path / "runs"
    put(r, "softmax", "probe", "knn", 0, probe("knn", {"top1": {"10": 50.0, "20": 52.0}}))
    put(r, "entmax", "probe", "knn", 0, probe("knn", {"top1": {"10": 54.0, "20": 55.5}}))
    # an older entmax VOC run and a newer one: the newer wins
    put(r, "entmax", "probe", "voc", 0, probe("voc", {"mIoU": 10.0}, created="2026-01-01T00:00:00+00:00"))
    put(r, "entmax", "probe", "voc", 1, probe("voc", {"mIoU": 20.0}, created="2026-01-02T00:00:00+00:00"))
    put(r, "softmax", "probe", "voc", 0, probe("voc", {"mIoU": 17.5}))
    put(r, "softmax", "probe", "nyuv2", 0, probe("nyuv2", {"rmse": 0.5, "abs_rel": 0.1}))
    put(r, "entmax", "probe", "nyuv2", 0, probe("nyuv2", {"rmse": 0.45}))
    # a layer sweep feeds the per-layer plot, not the main cell
    put(r, "entmax", "probe", "voc", 2, probe("voc", {"layers": {"block_0": {"mIoU": 5.0}, "block_1": {"mIoU": 9.0}}},
                                              created="2026-01-03T00:00:00+00:00"))
    put(r, "softmax", "analysis", "pib", 0, analysis("pib", {"pib": 40.0, "pib_per_layer": [30.0, 40.0]}))
    put(r, "entmax", "analysis", "pib", 0, analysis("pib", {"pib": 55.0, "pib_per_layer": [35.0, 55.0]}))
    put(r, "entmax", "analysis", "corloc", 0, analysis("corloc", {"corloc": 33.3}, sha="b" * 64))
    put(r, "entmax", "analysis", "norms", 0, analysis("norms", {"high_norm_share": 0.02,
                                                               "high_norm_share_per_layer": [0, 0.02]}))
    # a real-data run of the same variant is its own row
    put(r, "softmax", "analysis", "pib", 1, analysis("pib", {"pib": 44.0, "pib_per_layer": [40, 44]},
                                                     data="imagenet"))
    # a file of the old probe schema (no variant/data/host, backbone.checkpoint_sha256) is not read
    (r / "old" / "probe" / "knn" / "version_0").mkdir(parents=True)
    (r / "old" / "probe" / "knn" / "version_0" / "results.json").write_text(json.dumps(
        {"task": "knn", "metrics": {"top1": {"20": 99.0}}, "config": {"data": "demo"}, "created": "2026",
         "backbone": {"checkpoint_sha256": "c" * 64}}))
    (r / "broken" / "probe" / "knn" / "version_0").mkdir(parents=True)
    (r / "broken" / "probe" / "knn" / "version_0" / "results.json").write_text("{not json")
    return r


def test_report_table_csv_and_plots(runs, tmp_path):
    out = tmp_path / "reports"
    md_path = report.main(["--runs", str(runs), "--out", str(out)])
    md = md_path.read_text()
    rows = {r["row"]: r for r in csv.DictReader(open(out / "report.csv"))}
    ent, soft = rows["entmax [demo data]"], rows["softmax [demo data]"]
    assert float(ent["imagenet_knn"]) == 55.5 and float(ent["imagenet_knn_delta_vs_baseline"]) == pytest.approx(3.5)
    assert float(ent["voc_miou"]) == 20.0 and float(ent["voc_miou_delta_vs_baseline"]) == pytest.approx(2.5)
    assert float(ent["nyuv2_rmse_delta_vs_baseline"]) == pytest.approx(-0.05)
    assert float(ent["pib_voc"]) == 55.0 and float(ent["pib_voc_delta_vs_baseline"]) == pytest.approx(15.0)
    assert float(ent["corloc_voc"]) == pytest.approx(33.3) and soft["corloc_voc"] == "not run"
    assert float(ent["high_norm_share"]) == pytest.approx(2.0)
    assert soft["imagenet_linear"] == "not run" and soft["voc_miou_delta_vs_baseline"] == ""
    # the real-data softmax run is a separate row; its ImageNet PiB does not leak into the demo rows
    real = rows["softmax [real data]"]
    assert float(real["pib_imagenet"]) == 44.0 and real["pib_voc"] == "not run" and soft["pib_imagenet"] == "not run"
    # paper rows: published numbers, their own baseline differences, 'not reported' elsewhere
    p = rows["paper: Entmax-1.5 (entmax paper, DINO ViT-S/16 200 ep)"]
    assert p["kind"] == "paper" and float(p["voc_miou"]) == 48.78
    assert float(p["voc_miou_delta_vs_baseline"]) == pytest.approx(5.98) and p["nyuv2_rmse"] == "not reported"
    assert float(rows["paper: DINO-v1 + LaSt (LaSt-ViT paper)"]["pib_imagenet"]) == 69.7
    # entmax's CorLoc came from another checkpoint than its other cells: the row says so
    assert "| entmax [demo data] (2 checkpoints, see Sources) | not run | 55.50 (+3.50) | 20.00 (+2.50) |" in md
    assert ent["checkpoints_sha256"] == "a" * 64 + " " + "b" * 64 and soft["checkpoints_sha256"] == "a" * 64
    assert "(checkpoint bbbbbbbbbbbb)" in md
    assert "not run" in md and "*paper: CLS baseline" in md and not any(k.startswith("old") for k in rows)
    for png in ("pib_per_layer.png", "probe_per_layer_voc.png", "high_norm_share_per_layer.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG" and png in md


def test_report_without_runs_says_not_run(tmp_path):
    out = tmp_path / "r"
    report.main(["--runs", str(tmp_path / "nothing"), "--out", str(out)])
    rows = list(csv.DictReader(open(out / "report.csv")))
    assert rows and all(r["kind"] == "paper" for r in rows)  # only the reference rows, nothing made up


def test_report_variants_filter_and_depth_columns(runs, tmp_path, capsys):
    """The former probes.compare table: chosen rows, the depth probe's RMSE and δ1."""
    put(runs, "pixels", "probe", "nyuv2", 0, probe("nyuv2", {"rmse": 0.9, "d1": 0.25}, sha=None))
    out = tmp_path / "r"
    report.main(["--runs", str(runs), "--out", str(out), "--variants", "entmax", "pixels"])
    rows = {r["row"]: r for r in csv.DictReader(open(out / "report.csv")) if r["kind"] == "measured"}
    assert set(rows) == {"entmax [demo data]", "pixels [demo data]"}
    assert float(rows["pixels [demo data]"]["nyuv2_d1"]) == 0.25 and rows["entmax [demo data]"]["nyuv2_d1"] == "not run"
    assert rows["pixels [demo data]"]["checkpoints_sha256"] == ""  # a baseline: no checkpoint
    assert "not the results schema" in capsys.readouterr().err
