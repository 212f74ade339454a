"""The study's planner, resume logic, report and TensorBoard run with the subprocesses replaced by a fake that
writes what each CLI writes (checkpoint layout of the pretraining CLI, results.json of probes and analyses in
their own schemas). Numbers are chosen so the report's statistics can be worked out by hand."""
import csv
import hashlib
import json
from pathlib import Path

import pytest
from scipy import stats as st

import study.local
from study.__main__ import main
from tokenmix import paths
from tokenmix.results import backbone_entry, results_payload

# k-NN top-1 / mIoU / PiB each variant's seed yields (independent of the code under test)
KNN = {("softmax", 0): 80.0, ("softmax", 1): 82.0, ("entmax", 0): 85.0, ("entmax", 1): 89.0}
VOC = {("softmax", 0): 30.0, ("softmax", 1): 30.0, ("entmax", 0): 31.0, ("entmax", 1): 31.0}
PIB = {("softmax", 0): 40.0, ("softmax", 1): 50.0, ("entmax", 0): 45.0, ("entmax", 1): 47.0}
# AT: the values at the end of epoch 1 (the end of the 2-epoch tiny schedule gives the tables above)
KNN_E1 = {("softmax", 0): 84.0, ("softmax", 1): 83.0, ("entmax", 0): 86.0, ("entmax", 1): 88.0}
VOC_E1 = {k: 30.0 for k in VOC}
# retrieval mIoU (task voc_retrieval: probes.run --task voc --kind retrieval) at the end and at epoch 1
RET = {("softmax", 0): 40.0, ("softmax", 1): 42.0, ("entmax", 0): 44.0, ("entmax", 1): 48.0}
RET_E1 = {("softmax", 0): 41.0, ("softmax", 1): 45.0, ("entmax", 0): 40.0, ("entmax", 1): 42.0}


def _flag(cmd, name):
    for i, a in enumerate(cmd):
        if a == name:
            return cmd[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def _next_version(folder: Path) -> Path:
    n = len(list(folder.glob("version_*"))) if folder.is_dir() else 0
    (folder / f"version_{n}").mkdir(parents=True)
    return folder / f"version_{n}"


class FakeCLIs:
    """Stands in for subprocess.Popen; ``fail`` = cell prefixes whose pretraining exits 1 (once)."""

    def __init__(self, fail=()):
        self.calls, self.fail = [], set(fail)
        self.top1 = None  # (variant, seed) -> val top-1 the pretraining writes into its summary.json

    def __call__(self, cmd, stdout=None, stderr=None, cwd=None, env=None):
        self.calls.append(list(cmd))
        module, variant, seed = cmd[2], _flag(cmd, "--variant"), None
        rc = 0
        if module == "lightning_modules.pretrain":
            seed = int(_flag(cmd, "--seed_everything"))
            # the pretraining CLI's layout: <runs-dir>/<variant>/pretrain/<preset>/<logger version>/checkpoints/
            ck = (Path(_flag(cmd, "--runs-dir")) / variant / "pretrain" / _flag(cmd, "--preset")
                  / _flag(cmd, "--trainer.logger.version") / "checkpoints" / "last.ckpt")
            ck.parent.mkdir(parents=True, exist_ok=True)
            ck.write_bytes(f"{variant}/{seed}/{'resumed' if '--resume' in cmd else 'fresh'}".encode())
            epochs = _flag(cmd, "--trainer.callbacks.epochs")  # KeepCheckpoints: at_epoch<N>.ckpt beside last.ckpt
            for e in (epochs or "[]").strip("[]").split(","):
                if e:
                    (ck.parent / f"at_epoch{int(e):04d}.ckpt").write_bytes(f"{variant}/{seed}/e{e}".encode())
            if self.top1:  # the run's own summary.json, beside checkpoints/ (RunSummary / SupervisedSummary)
                body = results_payload(task="pretrain", variant=variant, data="demo",
                                       metrics={"val_top1": self.top1[(variant, seed)]}, config={},
                                       backbone=backbone_entry({}, str(ck), None))
                (ck.parent.parent / "summary.json").write_text(json.dumps(body))
            if (variant, seed) in self.fail:
                self.fail.discard((variant, seed))
                rc = 1
        else:
            ckpt = Path(_flag(cmd, "--ckpt"))
            sha = hashlib.sha256(ckpt.read_bytes()).hexdigest()
            variant, seed, tag = ckpt.read_bytes().decode().split("/")[:3]
            key, task = (variant, int(seed)), _flag(cmd, "--task")
            knn, voc = (KNN_E1, VOC_E1) if tag == "e1" else (KNN, VOC)
            if module == "probes.run":
                kind = _flag(cmd, "--kind")
                task = f"{task}_{kind}" if kind else task  # the probe CLI's run name (voc_retrieval)
                out = _next_version(Path(_flag(cmd, "--runs-dir")) / variant / "probe" / task)
                metrics = {"top1": {"10": 0.0, "20": knn[key]}} if task == "knn" else {"mIoU": voc[key]}
                if kind == "retrieval":  # mIoU per memory size; the largest memory is the report's
                    ret = RET_E1 if tag == "e1" else RET
                    metrics = {"mIoU": {"1024": {"mIoU": 1.0, "memory": 1024},
                                        "102400": {"mIoU": ret[key], "memory": 76800}}}
                body = results_payload(task=task, variant=variant, data="demo", metrics=metrics,
                                       backbone=backbone_entry({}, str(ckpt), sha),
                                       config={"dataset": "demo_cls", "seed": int(_flag(cmd, "--seed"))})
            else:  # analysis.run: no --runs-dir, it writes under $TOKENMIX_RUNS
                out = _next_version(Path(env["TOKENMIX_RUNS"]) / variant / "analysis" / task)
                body = results_payload(task=task, variant=variant, data="demo", backbone=backbone_entry({}, str(ckpt),
                                       sha), metrics={"pib": PIB[key], "n_images": 100}, config={})
            (out / "results.json").write_text(json.dumps(body))
        self.returncode = rc
        return self

    def poll(self):
        return self.returncode

    def wait(self):
        return self.returncode

    def terminate(self):
        pass


@pytest.fixture
def fake(monkeypatch):
    f = FakeCLIs()
    monkeypatch.setattr(study.local.subprocess, "Popen", f)
    monkeypatch.setattr(study.local.time, "sleep", lambda s: None)
    return f


def _argv(tmp_path, name="s", *extra):
    return ["--name", name, "--root", str(tmp_path / name), "--out", str(tmp_path / f"report_{name}"),
            "--variants", "softmax entmax", "--seeds", "2", "--tasks", "knn voc pib", "--preset", "tiny", *extra]


def _modules(calls):
    return sorted(c[2] for c in calls)


def test_runs_everything_once_then_reuses_and_reports(tmp_path, fake, capsys):
    assert main(_argv(tmp_path)) == 0
    assert _modules(fake.calls) == ["analysis.run"] * 4 + ["lightning_modules.pretrain"] * 4 + ["probes.run"] * 8
    # every pretraining ran before any evaluation, with the seed in both seed flags
    kinds = [c[2] == "lightning_modules.pretrain" for c in fake.calls]
    assert kinds == [True] * 4 + [False] * 12
    seeds = sorted((_flag(c, "--variant"), _flag(c, "--seed_everything"), _flag(c, "--data.seed"))
                   for c in fake.calls[:4])
    assert seeds == [("entmax", "0", "0"), ("entmax", "1", "1"), ("softmax", "0", "0"), ("softmax", "1", "1")]
    out, err = capsys.readouterr()
    assert "pretraining 4/4, evaluations 12/12" in err and "ETA" in err
    # before launching: what 2 seeds detect, in seed sd (no earlier report yet)
    assert "[study] 2 seeds a side detect |Δ| ≥ 5.65 seed sd (two-sided t-test, α = 0.05, power 0.8); no earlier" in out
    fake.calls.clear()
    assert main(_argv(tmp_path)) == 0  # nothing new to run
    assert fake.calls == []
    out = capsys.readouterr().out
    assert "done 16/16 cells; to run: 0 pretraining, 0 evaluations" in out
    # now at the last report's seed sd: PiB sd pooled from 7.07 and 1.41 (n = 2 each): sqrt((50 + 2) / 2) = 5.10;
    # MDE 5.65 sd = 28.8; 12.4 = 2.43 sd needs 4 seeds a side (tests/test_study_stats.py checks the power figures)
    assert "At the seed sd of " in out and "PiB VOC ([CLS]): sd 5.1, |Δ| ≥ 28.8; the paper's +12.4 needs 4 seeds" in out
    assert "VOC mIoU:" not in out  # sd 0 (constant over seeds): nothing to say

    md = (tmp_path / "report_s" / "study.md").read_text()
    # softmax k-NN 80, 82: mean 81, std sqrt(2) = 1.41; entmax 85, 89: mean 87, std 2.83. Same seeds: paired
    # (differences 5, 7), p of scipy's ttest_rel; PiB: 45, 47 vs 40, 50 (differences 5, -3); BH over the two
    assert "| softmax | 81.00 ± 1.41 (n=2) |" in md
    assert "| entmax | 87.00 ± 2.83 (n=2) |" in md
    knn, pib = st.ttest_rel([85.0, 89.0], [80.0, 82.0]), st.ttest_rel([45.0, 47.0], [40.0, 50.0])
    q = st.false_discovery_control([knn.pvalue, pib.pvalue], method="bh")
    lo, hi = knn.confidence_interval()
    assert (f"entmax vs softmax: Δ = +6.00 [{lo:+.2f}, {hi:+.2f}], p = {knn.pvalue:.2g} (adj. {q[0]:.2g}), paired: "
            "not significant; detectable at these seeds: |Δ| ≥ ") in md
    assert "45.00 ± 7.07 (n=2)" in md and f"+1.00 [{pib.confidence_interval()[0]:+.2f}, " in md
    assert f"p = {pib.pvalue:.2g} (adj. {q[1]:.2g}), paired: not significant" in md
    # VOC: both variants constant over seeds (std 0): no test (scipy's 0/0), never significant
    assert "entmax vs softmax: Δ = +1.00, no spread on either side: no test" in md
    assert "inside" not in md and "outside" not in md
    # probability of improvement across the dense tasks (VOC only: 31, 31 against 30, 30): 1 in every resample
    assert "across the dense tasks (VOC mIoU;" in md and "- entmax: 1.00 [1.00, 1.00]" in md
    # the papers' rows (analysis.report's reference table) and the per-seed values
    assert "*paper: Entmax-1.5 (entmax paper, DINO ViT-S/16 200 ep)* | not reported | 48.78 |" in md
    assert "| entmax | 1 | 89.00 | 31.00 | 47.00 |" in md
    with open(tmp_path / "report_s" / "study.csv") as f:
        rows = {(r["kind"], r["variant"], r["column"]): r for r in csv.DictReader(f)}
    r = rows[("measured", "entmax", "imagenet_knn")]
    assert (r["n"], r["mean"], r["delta_vs_baseline"], r["test"], r["significant"], r["values_by_seed"]) == \
        ("2", "87", "6", "paired", "false", "0:85.0 1:89.0")
    assert (float(r["p"]), float(r["p_adj"]), float(r["ci_low"])) == pytest.approx((knn.pvalue, q[0], lo), rel=1e-12)
    assert rows[("measured", "entmax", "voc_miou")]["test"] == "no spread"
    assert rows[("paper", "paper: CLS baseline (entmax paper, DINO ViT-S/16 200 ep)", "voc_miou")]["mean"] == "42.8"
    assert (tmp_path / "report_s" / "study_imagenet_knn.png").stat().st_size > 1000

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(tmp_path / "s" / "tensorboard"))
    acc.Reload()
    tags = acc.Tags()
    assert "imagenet_knn/mean/entmax" in tags["scalars"] and "progress/evaluations_done" in tags["scalars"]
    assert [e.value for e in acc.Scalars("imagenet_knn/seeds/entmax")] == [85.0, 89.0]
    assert any("study/cells" in t for t in tags["tensors"])


def test_changed_marker_config_and_checkpoint_rerun_only_what_changed(tmp_path, fake):
    assert main(_argv(tmp_path)) == 0
    root = tmp_path / "s"
    [marker] = (root / "done" / "knn.entmax.seed1").glob("*.json")
    marker.unlink()
    fake.calls.clear()
    assert main(_argv(tmp_path)) == 0
    assert [(c[2], _flag(c, "--task"), _flag(c, "--variant")) for c in fake.calls] == \
        [("probes.run", "knn", "entmax")]
    # other probe flags: new probe cells, pretraining and analyses reused
    fake.calls.clear()
    assert main(_argv(tmp_path, "s", "--probe-args=--knn-k 20")) == 0
    assert _modules(fake.calls) == ["probes.run"] * 8
    fake.calls.clear()
    assert main(_argv(tmp_path)) == 0  # back to the first flags: their cells are still finished
    assert fake.calls == []
    # a checkpoint that changed on disk: that pretraining and its evaluations run again
    ck = next(root.glob("seed0/softmax/pretrain/tiny/study-*/checkpoints/last.ckpt"))
    ck.write_bytes(b"softmax/0/tampered")
    fake.calls.clear()
    assert main(_argv(tmp_path)) == 0
    assert sorted((c[2], _flag(c, "--variant"), _flag(c, "--seed_everything") or _flag(c, "--seed"))
                  for c in fake.calls if c[2] != "analysis.run") == [
        ("lightning_modules.pretrain", "softmax", "0"), ("probes.run", "softmax", "0"), ("probes.run", "softmax", "0")]
    assert "--resume" in fake.calls[0]


def test_half_finished_study_resumes(tmp_path, fake, capsys):
    fake.fail = {("entmax", 1)}
    assert main(_argv(tmp_path)) == 1  # one pretraining failed: its evaluations are skipped, the rest ran
    assert len(fake.calls) == 4 + 9
    assert "not finished: knn.entmax.seed1: skipped: pretrain.entmax.seed1 did not finish" in capsys.readouterr().err
    fake.calls.clear()
    assert main(_argv(tmp_path, "s", "--dry-run")) == 0
    out = capsys.readouterr().out
    assert "to resume      pretrain.entmax.seed1" in out and "--resume" in out
    assert "done (reused)  knn.entmax.seed0" in out and "done 12/16 cells" in out
    assert fake.calls == []  # a dry run runs nothing
    assert main(_argv(tmp_path)) == 0
    assert [c[2] for c in fake.calls] == ["lightning_modules.pretrain", "probes.run", "probes.run", "analysis.run"]
    assert _flag(fake.calls[0], "--resume").endswith("checkpoints/last.ckpt")


def test_bad_input_fails_fast_with_the_valid_names(tmp_path, capsys):
    assert main(_argv(tmp_path, "s", "--variants", "softmax bogus")) == 2
    assert "unknown variant 'bogus'" in capsys.readouterr().err
    assert main(_argv(tmp_path, "s", "--tasks", "knn nope")) == 2
    err = capsys.readouterr().err
    assert "unknown task 'nope'" in err and "corloc" in err and "nyuv2" in err
    assert main(_argv(tmp_path, "s", "--seeds", "x")) == 2
    assert main(_argv(tmp_path, "s", "--preset", "nosuch")) == 2
    assert "unknown preset 'nosuch'" in capsys.readouterr().err


def test_read_result_schema_and_legacy_files(tmp_path):
    """The one schema is read; files from before it (a study begun earlier) keep their sha256 and data."""
    from study.store import read_result
    from tokenmix.results import write_results
    new = tmp_path / "runs" / "softmax" / "analysis" / "pib" / "version_0"
    new.mkdir(parents=True)
    write_results(new, task="pib", variant="softmax", data="voc", metrics={"pib": 1.0}, config={},
                  backbone=backbone_entry({}, "c.ckpt", "a" * 64))
    r = read_result(new / "results.json")
    assert (r.task, r.source, r.checkpoint_sha256, r.data) == ("pib", "analysis", "a" * 64, "voc")
    old_probe = tmp_path / "old_probe.json"
    old_probe.write_text(json.dumps({"task": "knn", "metrics": {}, "backbone": {"checkpoint_sha256": "b" * 64},
                                     "config": {"data": "demo"}}))
    old_analysis = tmp_path / "old_analysis.json"
    old_analysis.write_text(json.dumps({"task": "pib", "metrics": {}, "ckpt_sha256": "c" * 64, "data": "voc"}))
    assert (read_result(old_probe).source, read_result(old_probe).checkpoint_sha256) == ("probe", "b" * 64)
    assert (read_result(old_analysis).source, read_result(old_analysis).data) == ("analysis", "voc")


def test_at_words_resolve_to_epochs_steps_and_the_end():
    from study.points import keep_args, progress, resolve_at
    assert resolve_at("17% 33% 50% 67% 83% 100%", 6) == ("e1", "e2", "e3", "e4", "e5", "")
    assert resolve_at("25%, 100%", 6) == ("e2", "")  # 1.5 epochs rounds to the end of epoch 2
    assert resolve_at("step40 e6 epoch2 s10", 6) == ("e2", "s10", "s40", "")  # e6 = max_epochs = the end
    assert resolve_at("", 6) == ("",)
    assert keep_args(("e2", "s10", "")) == ["--trainer.callbacks+=lightning_modules.callbacks.keep_checkpoints.KeepCheckpoints",
                                            "--trainer.callbacks.epochs=[2]", "--trainer.callbacks.steps=[10]"]
    assert keep_args(("",)) == []
    assert progress("e3", 6) == 50.0 and progress("s30", 6, final_step=120) == 25.0 and progress("", 6) == 100.0
    for bad in ("0%", "e7", "x", "120%"):
        with pytest.raises(ValueError, match="AT word"):
            resolve_at(bad, 6)


def test_at_keeps_points_evaluates_each_reuses_and_reports_curves(tmp_path, fake, capsys):
    argv = ["--name", "a", "--root", str(tmp_path / "a"), "--out", str(tmp_path / "rep"), "--variants",
            "softmax entmax", "--seeds", "2", "--tasks", "knn voc", "--preset", "tiny", "--at", "50% 100%"]
    assert main(argv) == 0
    pre = [c for c in fake.calls if c[2] == "lightning_modules.pretrain"]
    assert len(pre) == 4 and all(_flag(c, "--trainer.callbacks.epochs") == "[1]" for c in pre)
    probes = [c for c in fake.calls if c[2] == "probes.run"]
    assert len(probes) == 16  # 2 tasks x 2 points x 4 checkpoints
    assert sum(_flag(c, "--ckpt").endswith("at_epoch0001.ckpt") for c in probes) == 8
    assert (tmp_path / "a" / "done" / "knn.entmax.seed1@e1").is_dir()
    fake.calls.clear()
    assert main(argv) == 0 and fake.calls == []  # every cell reused
    assert "done 20/20 cells" in capsys.readouterr().out
    md = (tmp_path / "rep" / "study.md").read_text()
    assert "| softmax | 81.00 ± 1.41 (n=2) |" in md  # the main table: the last point
    # degradation, k-NN: softmax best at epoch 1 (83.5 > 81); per-seed drops 84-80 = 4, 83-82 = 1: mean 2.5,
    # std 2.12; one-sided t-test of drop > 0 (scipy), BH over the two tested rows: no ‼
    p = [st.ttest_1samp(x, 0.0, alternative="greater").pvalue for x in ([4.0, 1.0], [1.0, -1.0])]
    q = st.false_discovery_control(p, method="bh")
    assert (f"| ImageNet k-NN top-1 (k=20) | softmax | epoch 1 | 83.50 | 81.00 | 2.50 ± 2.12 (n=2) | {p[0]:.2g} "
            f"({q[0]:.2g}) | +4.00 +1.00 |") in md
    # entmax: 87 at both points, the earlier one is "best"; drops 86-85 = 1, 88-89 = -1
    assert (f"| ImageNet k-NN top-1 (k=20) | entmax | epoch 1 | 87.00 | 87.00 | 0.00 ± 1.41 (n=2) | {p[1]:.2g} "
            f"({q[1]:.2g}) | +1.00 -1.00 |") in md
    # VOC entmax: 30 then 31, best at the end: no drop, no spread: no test
    assert "| VOC mIoU | entmax | end | 31.00 | 31.00 | 0.00 ± 0.00 (n=2) | — (—) | +0.00 +0.00 |" in md
    assert "| VOC mIoU | softmax | 30.00 ± 0.00 (n=2) | 30.00 ± 0.00 (n=2) |" in md  # the curve table
    for task in ("knn", "voc"):
        assert (tmp_path / "rep" / f"study_curve_{task}.png").stat().st_size > 1000
        assert f"![study_curve_{task}.png](study_curve_{task}.png)" in md
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(tmp_path / "a" / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("imagenet_knn/curve/softmax")] == [(50, 83.5), (100, 81.0)]
    # LAUNCHER=slurm on a fresh root: the points' evaluations are array tasks like the others
    assert main([*argv[:2], "--root", str(tmp_path / "b"), *argv[4:], "--launcher", "slurm"]) == 0
    ev = (tmp_path / "b" / "slurm" / "eval.sbatch").read_text()
    assert "#SBATCH --array=0-15" in ev and ev.count("at_epoch0001.ckpt") == 8
    assert "KeepCheckpoints" in (tmp_path / "b" / "slurm" / "pretrain.sbatch").read_text()
    assert main([*argv, "--at", "e9"]) == 2
    assert "AT word 'e9'" in capsys.readouterr().err


def test_retrieval_is_a_study_task_with_its_column_and_curve(tmp_path, fake):
    """TASKS=voc_retrieval runs the probe CLI's head-free kind (--task voc --kind retrieval), at every AT point,
    and the report shows its mIoU at the largest memory, its curve and its degradation row (numbers: RET)."""
    argv = ["--name", "r", "--root", str(tmp_path / "r"), "--out", str(tmp_path / "rep"), "--variants",
            "softmax entmax", "--seeds", "2", "--tasks", "voc voc_retrieval", "--preset", "tiny", "--at", "50% 100%"]
    assert main(argv) == 0
    ret = [c for c in fake.calls if c[2] == "probes.run" and _flag(c, "--kind") == "retrieval"]
    assert len(ret) == 8 and all(_flag(c, "--task") == "voc" for c in ret)  # 2 points x 4 checkpoints
    assert (tmp_path / "r" / "done" / "voc_retrieval.entmax.seed1@e1").is_dir()
    md = (tmp_path / "rep" / "study.md").read_text()
    title = "VOC retrieval mIoU (Hummingbird, largest memory)"
    assert f"| variant | VOC mIoU | {title} |" in md
    assert "| softmax | 30.00 ± 0.00 (n=2) | 41.00 ± 1.41 (n=2) |" in md  # (40 + 42) / 2, not the 1,024 memory's 1
    assert "| entmax | 31.00 ± 0.00 (n=2) | 46.00 ± 2.83 (n=2) |" in md
    # softmax is best at epoch 1 (43 > 41): drops 41-40 = 1 and 45-42 = 3 per seed, mean 2.00
    p = st.ttest_1samp([1.0, 3.0], 0.0, alternative="greater").pvalue  # the only tested drop: adjusted = itself
    assert f"| {title} | softmax | epoch 1 | 43.00 | 41.00 | 2.00 ± 1.41 (n=2) | {p:.2g} ({p:.2g}) | +1.00 +3.00 |" in md
    assert (tmp_path / "rep" / "study_curve_voc_retrieval.png").stat().st_size > 1000
    fake.calls.clear()
    assert main(argv) == 0 and fake.calls == []  # the cells are found again (results under voc_retrieval/)


def test_report_paths_are_relative_to_the_repo_or_the_runs_folder(monkeypatch, tmp_path):
    """study.md names no machine's absolute path (docs/examples/study-demo/study.md once recorded one)."""
    from study import report
    from tokenmix import paths
    assert report._shown(paths.REPO / "runs" / "study" / "demo") == "runs/study/demo"
    monkeypatch.setattr(paths, "RUNS", tmp_path / "elsewhere")
    assert report._shown(tmp_path / "elsewhere" / "study" / "demo") == "<runs>/study/demo"
    assert "/work/" not in (paths.REPO / "docs" / "examples" / "study-demo" / "study.md").read_text()


def test_report_command_line_names_no_absolute_path(monkeypatch, tmp_path):
    """The command echoed at the top of study.md: paths in the repo or runs folder relative, others as <…>/name."""
    from study import report
    from tokenmix import paths
    monkeypatch.setattr(paths, "RUNS", tmp_path / "runs")
    line = report.shown_command(["--out", str(tmp_path / "out" / "rep"), "--root", str(tmp_path / "runs" / "st"),
                                 "--preset", str(paths.REPO / "configs" / "pretrain" / "demo.yaml"), "--name", "a b"])
    assert line == "--out '<…>/rep' --root '<runs>/st' --preset configs/pretrain/demo.yaml --name 'a b'"
    assert str(tmp_path) not in line


@pytest.mark.timeout(30)
def test_eta_is_a_lower_bound_until_every_stage_is_timed():
    import io

    from study.progress import Progress
    p = Progress({"pretraining": 2, "evaluations": 10}, {"pretraining": 0, "evaluations": 0}, stream=io.StringIO())
    assert p.eta() is None  # nothing timed yet
    p.durations["pretraining"].append(100.0)
    p.done["pretraining"] = 1
    assert p.eta() == "≥1m40s"  # 1 pretraining left x 100 s; the 10 evaluations are not timed yet
    p.durations["evaluations"].append(30.0)
    p.done["evaluations"] = 1
    assert p.eta() == "6m10s"  # 100 + 9 x 30


def test_cells_are_resolved_once_and_run_without_the_planner(tmp_path, fake, monkeypatch):
    """plan() resolves each cell (paths, key, command); plan.json gives the same cells back, and the local runner
    and the marker step run them with every planner function broken."""
    import io

    import study.plan as planner
    from study.store import read_plan, status
    from study.progress import Progress
    spec = planner.Spec.create(name="r", variants=["softmax"], seeds=[1], tasks=["knn", "pib"], preset="tiny",
                               root=tmp_path / "r", at="e1 e2")
    cells = planner.plan(spec)
    pre, knn = cells[0], cells[1]
    folder = tmp_path / "r" / "seed1" / "softmax" / "pretrain" / "tiny" / f"study-{pre.key}" / "checkpoints"
    assert (pre.id, pre.checkpoint, pre.runs) == ("pretrain.softmax.seed1", folder / "last.ckpt", tmp_path / "r" / "seed1")
    assert pre.kept == (("e1", folder / "at_epoch0001.ckpt"),)
    assert pre.marker == tmp_path / "r" / "done" / pre.id / f"{pre.key}.json"
    assert (knn.id, knn.checkpoint, knn.depends) == ("knn.softmax.seed1@e1", folder / "at_epoch0001.ckpt", pre.id)
    assert _flag(knn.command("py"), "--ckpt") == str(folder / "at_epoch0001.ckpt")
    assert pre.command("py", resume=True)[-2:] == ["--resume", str(folder / "last.ckpt")]
    assert knn.env == {"TOKENMIX_RUNS": str(tmp_path / "r" / "seed1")}
    assert read_plan(planner.write_plan(spec, cells, "py")) == cells

    def broken(*a, **k):
        raise AssertionError("the runner called back into the planner")
    for name in ("preset_file", "task_source", "pretrain_key", "eval_key", "plan", "_marker_path", "_key"):
        monkeypatch.setattr(planner, name, broken)
    monkeypatch.setattr(planner.Spec, "seed_root", broken)
    monkeypatch.setattr(planner.Spec, "eval_data", broken)
    done = status(cells)
    progress = Progress({"pretraining": 1, "evaluations": 4}, {"pretraining": 0, "evaluations": 0},
                        stream=io.StringIO())
    assert study.local.run_missing(cells, done, "py", progress, tmp_path / "logs") == []
    assert len(fake.calls) == 5 and all(status(cells).values())


def test_the_runs_own_summary_is_a_column(tmp_path, fake):
    """A pretraining run's summary.json (its val top-1, last k-NN and dense checks) is read as the study's
    'run's ...' columns, with the same mean ± std and Δ rule as the evaluations."""
    fake.top1 = {("softmax", 0): 70.0, ("softmax", 1): 74.0, ("entmax", 0): 75.0, ("entmax", 1): 77.0}
    assert main(_argv(tmp_path, "t", "--tasks", "knn")) == 0
    md = (tmp_path / "report_t" / "study.md").read_text()
    # softmax 70, 74: mean 72, std 2.83; entmax 75, 77: mean 76; paired differences 5, 3: scipy's ttest_rel
    assert "| softmax | 72.00 ± 2.83 (n=2) | 81.00 ± 1.41 (n=2) |" in md
    p = st.ttest_rel([75.0, 77.0], [70.0, 74.0]).pvalue
    assert "run's val top-1 (supervised)" in md and f"entmax vs softmax: Δ = +4.00 [" in md and f"p = {p:.2g}" in md
    assert "| entmax | 1 | 77.00 | 89.00 |" in md


def test_other_demo_data_gets_other_keys(tmp_path, monkeypatch):
    """TOKENMIX_DEMO_ROOT / TOKENMIX_DEMO_LAZY (the lazy-aggregation knob) join the cells' keys, so a study re-run on
    other demo data reuses nothing of the first; the default demo data keeps the keys it always had."""
    from study.plan import Spec, eval_key, pretrain_key
    monkeypatch.delenv("TOKENMIX_DEMO_ROOT", raising=False)
    monkeypatch.delenv("TOKENMIX_DEMO_LAZY", raising=False)
    spec = Spec.create(name="k", variants=["softmax"], seeds=[0], tasks=["pib"], preset="tiny", root=tmp_path)
    base = (pretrain_key(spec, "softmax", 0), eval_key(spec, "pib", 0))
    monkeypatch.setenv("TOKENMIX_DEMO_ROOT", str(paths.REPO / "data" / "demo"))  # the default folder, named
    assert (pretrain_key(spec, "softmax", 0), eval_key(spec, "pib", 0)) == base
    monkeypatch.setenv("TOKENMIX_DEMO_ROOT", str(tmp_path / "demo_lazy1"))
    lazy_root = (pretrain_key(spec, "softmax", 0), eval_key(spec, "pib", 0))
    monkeypatch.setenv("TOKENMIX_DEMO_LAZY", "1")
    lazy = (pretrain_key(spec, "softmax", 0), eval_key(spec, "pib", 0))
    assert len({base[0], lazy_root[0], lazy[0]}) == 3 and len({base[1], lazy_root[1], lazy[1]}) == 3
    # a task evaluated on demo data at an explicit root names its data itself: the environment does not enter
    other = Spec.create(name="k", variants=["softmax"], seeds=[0], tasks=["knn"], preset="tiny", root=tmp_path,
                        task_data=[("knn", "demo", str(tmp_path / "small"))])
    with_env = eval_key(other, "knn", 0)
    monkeypatch.delenv("TOKENMIX_DEMO_ROOT")
    monkeypatch.delenv("TOKENMIX_DEMO_LAZY")
    assert eval_key(other, "knn", 0) == with_env


class _Code:
    """A pickled object that is not a tensor or container: only a full unpickle (weights_only=False) builds it."""


@pytest.mark.timeout(30)
def test_the_marker_reads_the_step_weights_only(tmp_path):
    """The marker's global step comes from torch.load(weights_only=True): a plain checkpoint gives its step; one
    that needs a full unpickle to be read is refused (step unknown), as tokenmix/io.py promises everywhere."""
    import torch

    from study.store import _global_step
    plain, pickled = tmp_path / "plain.ckpt", tmp_path / "pickled.ckpt"
    torch.save({"global_step": 7, "state_dict": {"w": torch.ones(2)}}, plain)
    torch.save({"global_step": 7, "hyper": _Code()}, pickled)
    assert _global_step(plain) == 7
    assert torch.load(pickled, weights_only=False)["global_step"] == 7  # readable, but only by unpickling code
    assert _global_step(pickled) is None
