"""Your own data end to end: the probes give the same numbers on the same files in the custom layouts,
DATA=folder pretrains (index cached beside the run, unreadable files listed in summary.json, refused above the
threshold) and learns, the analyses run on a folder."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from test_own_data import make_custom_seg, make_mixed_folder, make_nyu_pair

PROBE = ["--ckpt", "random", "--arch", "vit_test_patch8", "--max-epochs", "2", "--batch-size", "2", "--seed", "0"]
FAST = ["--preset", "tiny", "--trainer.enable_progress_bar=false"]


def _probe(runs: Path, *argv) -> dict:
    from probes.run import main
    return json.loads(main(["--runs-dir", str(runs), *PROBE, *argv]).read_text())


@pytest.mark.slow
def test_seg_probe_on_custom_seg_equals_voc_on_the_same_files(fixtures_root, tmp_path):
    own = make_custom_seg(fixtures_root, tmp_path / "seg")
    voc = _probe(tmp_path / "runs", "--task", "voc", "--data", "voc", "--data-root", str(fixtures_root / "voc"),
                 "--img-size", "48")
    mine = _probe(tmp_path / "runs", "--task", "seg", "--data", "custom_seg", "--data-root", str(own),
                  "--img-size", "48")
    assert mine["metrics"]["mIoU"] == voc["metrics"]["mIoU"] and mine["metrics"]["aAcc"] == voc["metrics"]["aAcc"]
    named = mine["metrics"]["per_class_IoU_named"]
    assert list(named)[:3] == ["background", "aeroplane", "bicycle"] and len(named) == 21
    assert list(named.values()) == mine["metrics"]["per_class_IoU"]


@pytest.mark.slow
def test_depth_probe_on_custom_depth_equals_nyuv2_on_the_same_frames(fixtures_root, tmp_path):
    nyu, own = make_nyu_pair(fixtures_root, tmp_path / "nyu", tmp_path / "own")
    ref = _probe(tmp_path / "runs", "--task", "nyuv2", "--data", "nyuv2", "--data-root", str(nyu),
                 "--img-size", "48,64")
    mine = _probe(tmp_path / "runs", "--task", "depth", "--data", "custom_depth", "--data-root", str(own),
                  "--img-size", "48,64")
    assert mine["metrics"]["rmse"] == ref["metrics"]["rmse"] > 0
    assert mine["metrics"]["abs_rel"] == ref["metrics"]["abs_rel"]
    (own / "metainfo.yaml").write_text("depth_scale: 1000\n")  # no Eigen crop: other pixels count
    other = _probe(tmp_path / "runs", "--task", "depth", "--data", "custom_depth", "--data-root", str(own),
                   "--img-size", "48,64")
    assert other["metrics"]["rmse"] != ref["metrics"]["rmse"]


@pytest.mark.slow
def test_folder_pretraining_caches_its_index_and_lists_unreadable_files(fixtures_root, tmp_path, capsys):
    from lightning_modules.pretrain import main
    written, bad = make_mixed_folder(fixtures_root, tmp_path / "imgs")
    lst = tmp_path / "eight.txt"  # one batch of 8 per epoch reads every listed file, the broken one included
    lst.write_text("\n".join([bad] + [w for w in written if w != bad][:7]))
    runs = tmp_path / "runs"
    args = ["--variant", "softmax", "--data", "folder", "--data-root", str(tmp_path / "imgs"), "--runs-dir", str(runs),
            *FAST, "--trainer.max_epochs=1", "--model.warmup_epochs=0", "--model.warmup_teacher_temp_epochs=0",
            f"--data.file_list={lst}"]
    assert main(args) != 0  # 1 of 8 unreadable > the default 1 %: stopped, naming the file
    assert "broken.jpg" in capsys.readouterr().err
    assert main(args + ["--data.max_corrupt=0.2"]) == 0
    summary = json.loads(next(runs.glob("softmax/pretrain/tiny/version_*/summary.json")).read_text())
    data = summary["metrics"]["data_index"]
    assert data["count"] == 8 and data["num_skipped"] == 1 and list(data["skipped"]) == [str(tmp_path / "imgs" / bad)]
    index = json.loads(Path(data["index"]).read_text())
    assert Path(data["index"]).parent == runs / "softmax" / "pretrain" / "tiny"  # beside the run
    assert (index["count"], index["sha256"]) == (data["count"], data["sha256"]) and index["files"][0] == bad
    # --data.verify: found while scanning, before anything is built
    assert main(args[:-1] + ["--data.verify=true"]) == 2
    err = capsys.readouterr().err
    assert "broken.jpg: cannot decode" in err and "1 of 13 files are unreadable" in err


def test_analyses_run_on_a_folder(fixtures_root, tmp_path):
    from analysis.run import main
    _, bad = make_mixed_folder(fixtures_root, tmp_path / "imgs")
    (tmp_path / "imgs" / bad).unlink()  # 1 of 13 would stop it (the 1 % threshold holds for every reader)
    for task in ("pca", "norms"):
        res = main(["--task", task, "--ckpt", "random", "--arch", "vit_test_patch8", "--data", "folder",
                    "--data-root", str(tmp_path / "imgs"), "--crop", "32", "--max-images", "6", "--no-tensorboard"])
        assert res["data"] == "folder" and res["metrics"]["n_images"] == 6


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_folder_pretraining_learns(tmp_path, demo_data):
    """DATA=folder on the demo's training images (no labels read), the demo preset for 8 steps: the teacher's
    k-NN top-1 on held-out demo images, computed here as DINO's eval_knn, beats its exact starting weights (the
    demo test's check, tests/test_pretrain_cli.py, stopped after 8 of its 25 steps). Measured: 79.75 -> 81.25 after 8 steps
    (+1.5, 6 of 400 images), 83.50 after 20; the folder's sorted index gives the demo run's exact batches."""
    from backbones import backbone_from_checkpoint, create_vit
    from lightning_modules.pretrain import main
    from test_pretrain_cli import _ckpt, _demo_split, _knn_top1

    root = demo_data
    start = tmp_path / "start.pt"
    demo = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs/pretrain/demo.yaml").read_text())
    cbs = [c for c in demo["trainer"]["callbacks"] if c["class_path"].endswith("ModelCheckpoint")]
    cbs.append({"class_path": "test_pretrain_cli.StartWeights", "init_args": {"path": str(start)}})
    extra = tmp_path / "cbs.yaml"
    extra.write_text(yaml.safe_dump({"trainer": {"callbacks": cbs}}))
    assert main(["--variant", "entmax", "--data", "folder", "--data-root", str(root / "imagefolder" / "train"),
                 "--runs-dir", str(tmp_path / "runs"), "--preset", "demo", "--trainer.enable_progress_bar=false",
                 "--trainer.accelerator=cpu",  # a real dataset on the CPU: chosen explicitly (tokenmix/launch.py)
                 "--trainer.max_epochs=1", "--trainer.max_steps=8", "--model.warmup_epochs=0",
                 f"--config={extra}"]) == 0
    trained = backbone_from_checkpoint(_ckpt(tmp_path / "runs", "entmax")).eval()
    init = create_vit("vit_demo_patch8", "entmax")
    init.load_state_dict(torch.load(start, weights_only=True))
    train, val = _demo_split(root, "train", 8), _demo_split(root, "val", 2)
    before, after = _knn_top1(init.eval(), train, val), _knn_top1(trained, train, val)
    print(f"DATA=folder: k-NN top-1 at the starting weights {before:.2f} -> after 8 steps {after:.2f}")
    assert after >= before + 1.0


def _scan_counting_pretrain() -> int:
    """This file as a script: ``make pretrain`` with every folder scan appended to $SCAN_LOG (the processes
    Lightning starts run the same command, so they count too)."""
    import os
    import sys

    import datamodules.datasets.folder as folder
    from lightning_modules.pretrain import main
    scan = folder.scan_folder

    def counted(root):
        with open(os.environ["SCAN_LOG"], "a") as f:
            f.write(f"{os.getpid()}\n")
        return scan(root)
    folder.scan_folder = counted
    return main(sys.argv[1:])


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_two_processes_scan_the_folder_once(fixtures_root, tmp_path):
    """Lightning DDP, 2 CPU processes (gloo): rank 0 scans before the other process exists, rank 1 reads the
    cached index; both train on it (the tiny preset's 1 step)."""
    import os
    import sys

    from helpers.procs import run
    _, bad = make_mixed_folder(fixtures_root, tmp_path / "imgs")
    (tmp_path / "imgs" / bad).unlink()
    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=f"{repo}{os.pathsep}{repo / 'tests'}", OMP_NUM_THREADS="1",
               SCAN_LOG=str(tmp_path / "scans.log"))
    cmd = [sys.executable, __file__, "--variant", "softmax", "--data", "folder", "--data-root", str(tmp_path / "imgs"),
           "--runs-dir", str(tmp_path / "runs"), *FAST, "--trainer.devices=2", "--trainer.accelerator=cpu",
           "--trainer.max_epochs=1", "--data.batch_size=4", "--data.batches_per_epoch=1", "--model.warmup_epochs=0",
           "--model.warmup_teacher_temp_epochs=0"]
    out = run(cmd, timeout=240, cwd=repo, env=env)
    text = (out.stdout or "") + (out.stderr or "")
    assert out.returncode == 0, text[-3000:]
    assert "scale: world size 2" in text
    assert len((tmp_path / "scans.log").read_text().split()) == 1  # one scan for the two processes
    summary = json.loads(next((tmp_path / "runs").glob("softmax/pretrain/tiny/version_*/summary.json")).read_text())
    assert summary["metrics"]["steps"] == 1 and summary["metrics"]["data_index"]["count"] == 12


if __name__ == "__main__":
    raise SystemExit(_scan_counting_pretrain())
