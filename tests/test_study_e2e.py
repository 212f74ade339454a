"""`python -m study` end to end with the real command lines: tiny pretraining (2 seeds, a few steps) and the
k-NN probe on a small generated demo set; a second invocation runs nothing; the report holds the mean ± std of
the probes' own results.json values. Needs the full demo data for pretraining (data/demo, generated on first use,
as the pretraining tests do)."""
import csv
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from scipy import stats as st

from datamodules.demo import DemoSpec, ensure_demo_data
from helpers import procs

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_study_runs_resumes_and_reports(tmp_path, demo_data):
    small = ensure_demo_data(tmp_path / "demo", spec=DemoSpec(cls_train=4, cls_val=2, voc_train=2, voc_val=2,
                                                                nyu_train=2, nyu_test=2))
    argv = [sys.executable, "-m", "study", "--name", "e2e", "--root", str(tmp_path / "study"),
            "--out", str(tmp_path / "reports"), "--variants", "softmax entmax", "--seeds", "2",
            "--tasks", "knn", "--preset", "tiny", "--pretrain-args=--trainer.enable_progress_bar=false",
            "--task-data", f"knn=demo:{small}", "--probe-args=--knn-k 2,20", "--no-tensorboard"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    first = procs.run(argv, cwd=REPO, env=env, timeout=600)  # with the second: below the test's 900 s
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "pretraining 4/4, evaluations 4/4" in first.stderr

    # the seeds reached the pretraining: two different checkpoints, each probed
    results = sorted((tmp_path / "study").glob("seed*/softmax/probe/knn/version_*/results.json"))
    assert len(results) == 2
    payloads = [json.loads(p.read_text()) for p in results]
    shas = {p["backbone"]["sha256"] for p in payloads}
    assert len(shas) == 2
    cks = sorted((tmp_path / "study").glob("seed*/softmax/pretrain/tiny/study-*/checkpoints/last.ckpt"))
    assert len(cks) == 2

    second = procs.run(argv, cwd=REPO, env=env, timeout=200)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "done 8/8 cells; to run: 0 pretraining, 0 evaluations" in second.stdout
    assert "running" not in second.stderr
    assert sorted((tmp_path / "study").glob("seed*/softmax/probe/knn/version_*/results.json")) == results

    # a pretraining cell that finished but lost its marker (killed before recording, a requeue): run again, it
    # resumes its finished run, trains nothing and records the same checkpoint; its summary is untouched
    marker = next(m for m in sorted((tmp_path / "study" / "done").rglob("*.json"))
                  if json.loads(m.read_text())["kind"] == "pretrain")
    rec = json.loads(marker.read_text())
    run = Path(rec["run_dir"])
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(run.rglob("*")) if p.is_file()}
    marker.unlink()
    third = procs.run(argv, cwd=REPO, env=env, timeout=200)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "(resuming)" in third.stderr
    log = next(p for p in (tmp_path / "study").rglob("*.log") if str(p).endswith(f"{rec['cell']}.log")).read_text()
    assert "run already finished" in log and "resuming from" not in log.split("run already finished")[-1]
    again = json.loads(marker.read_text())
    assert {k: again[k] for k in ("checkpoint", "ckpt_sha256", "global_step")} == \
        {k: rec[k] for k in ("checkpoint", "ckpt_sha256", "global_step")}
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(run.rglob("*")) if p.is_file()} == before
    # the same checkpoint recorded again: the evaluations of it hold, none runs again
    assert "evaluations 4/4" in third.stderr and f"{rec['cell']}" in third.stderr
    assert sorted((tmp_path / "study").glob("seed*/softmax/probe/knn/version_*/results.json")) == results

    vals = [p["metrics"]["top1"]["20"] for p in payloads]
    md = (tmp_path / "reports" / "study.md").read_text()
    cell = f"{statistics.mean(vals):.2f} ± {statistics.stdev(vals):.2f} (n=2)"
    assert f"| softmax | {cell} |" in md
    for seed, p in enumerate(payloads):
        assert f"| softmax | {seed} | {p['metrics']['top1']['20']:.2f} |" in md

    # study.compare reads the same folder as the report: against itself, the report's cell on both sides, Δ = 0
    from study.compare import main as compare_main
    assert compare_main([str(tmp_path / "study"), str(tmp_path / "study"), "--labels", "a,b",
                         "--out", str(tmp_path / "cmp.md")]) == 0
    assert f"| softmax | ImageNet k-NN top-1 (k=20) | {cell} | {cell} | +0.00" in (tmp_path / "cmp.md").read_text()

    # the CSV's p-values are scipy's on its own values_by_seed: paired where the row says so, else Welch; the
    # adjusted p is Benjamini-Hochberg over the table's tested rows; nothing significant above adjusted 0.05
    with open(tmp_path / "reports" / "study.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["kind"] == "measured"]
    by = {(r["variant"], r["column"]): {int(k): float(v) for k, v in (x.split(":") for x in
                                                                     r["values_by_seed"].split())} for r in rows}
    tested = [r for r in rows if r["p"]]
    assert tested and all(r["variant"] == "entmax" and r["test"] in ("paired", "Welch") for r in tested)
    for r in tested:
        x, y = by[("entmax", r["column"])], by[("softmax", r["column"])]
        ref = (st.ttest_rel([x[s] for s in sorted(x)], [y[s] for s in sorted(y)]) if r["test"] == "paired"
               else st.ttest_ind(list(x.values()), list(y.values()), equal_var=False))
        assert abs(float(r["p"]) - ref.pvalue) <= 1e-9
        lo, hi = ref.confidence_interval()
        assert abs(float(r["ci_low"]) - lo) <= 1e-9 and abs(float(r["ci_high"]) - hi) <= 1e-9
        assert float(r["mde"]) > 0
    q = st.false_discovery_control([float(r["p"]) for r in tested], method="bh")
    assert [float(r["p_adj"]) for r in tested] == pytest.approx(list(q), abs=1e-9)
    assert all((r["significant"] == "true") == (float(r["p_adj"]) <= 0.05) for r in tested)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigterm_stops_the_running_cell(tmp_path):
    """A scheduler's SIGTERM to the study stops the cell it is running too (not left to run on alone), and the
    study exits saying how to resume."""
    import signal
    import time

    from tokenmix.launch import _children
    argv = [sys.executable, "-m", "study", "--name", "sig", "--root", str(tmp_path / "study"),
            "--out", str(tmp_path / "reports"), "--variants", "softmax", "--seeds", "1", "--tasks", "knn",
            "--preset", "tiny", "--pretrain-args=--trainer.enable_progress_bar=false", "--no-tensorboard"]
    log = tmp_path / "study.log"
    with open(log, "w") as out, procs.started(argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                                              stdout=out, stderr=subprocess.STDOUT) as p:
        deadline = time.monotonic() + 120
        while not (kids := _children(p.pid)):  # the pretraining cell has started
            assert p.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(2)
        os.kill(p.pid, signal.SIGTERM)
        assert p.wait(timeout=60) == 130, log.read_text()[-3000:]
    for kid in kids:
        with pytest.raises(ProcessLookupError):  # reaped by the study, not orphaned
            os.kill(kid, 0)
    assert "interrupted: the finished cells are kept" in log.read_text()
