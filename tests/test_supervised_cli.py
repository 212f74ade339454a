"""`make pretrain OBJECTIVE=supervised` end to end on a tiny preset over the demo data: summary.json, TensorBoard
tags (metrics, lr, vote maps), resume, refusals, and the checkpoint read by make probe / make analyze."""
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from helpers import procs
from lightning_modules.pretrain import main as pretrain_main

pytestmark = pytest.mark.timeout(120)  # default for the quick tests; slow ones carry their own

REPO = Path(__file__).resolve().parents[1]
TINY = {
    "seed_everything": 0,
    "trainer": {"max_epochs": 2, "accelerator": "cpu", "devices": 1, "precision": "32-true",
                "log_every_n_steps": 1, "num_sanity_val_steps": -1, "limit_val_batches": 2,
                "enable_model_summary": False, "enable_progress_bar": False,
                "callbacks": [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                               "init_args": {"every_n_train_steps": 2, "save_last": True, "save_top_k": -1,
                                             "filename": "step{step:04d}", "auto_insert_metric_name": False}},
                              {"class_path": "lightning_modules.callbacks.images.VoteMaps",
                               "init_args": {"num_images": 2}},
                              {"class_path": "lightning_modules.callbacks.summary.SupervisedSummary"}]},
    "model": {"arch": "vit_test_patch8", "num_classes": 8},
    "data": {"data": "demo", "img_size": 32, "batch_size": 8, "val_batch_size": 16, "batches_per_epoch": 3,
             "num_workers": 0},
}


def _supervised(args: list[str]) -> int:
    return pretrain_main(["--objective", "supervised", *args])


def _preset(tmp: Path, **trainer) -> Path:
    cfg = json.loads(json.dumps(TINY))
    cfg["trainer"].update(trainer)
    path = tmp / "sup_tiny.yaml"  # a name that does not say "supervised": RESUME=1 reads the objective from the run
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def lastvit_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("supcli")
    runs = tmp / "runs"
    rc = _supervised(["--variant", "lastvit", "--preset", str(_preset(tmp)), "--runs-dir", str(runs)])
    assert rc == 0
    return tmp, runs, runs / "lastvit" / "pretrain" / "sup_tiny" / "version_0"


@pytest.mark.timeout(600)
def test_summary_tensorboard_and_checkpoint(lastvit_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    _, _, run = lastvit_run
    payload = json.loads((run / "summary.json").read_text())
    assert payload["config"]["objective"] == "supervised" and payload["data"] == "demo"
    assert payload["variant"] == "lastvit" and payload["backbone"]["config"]["variant"] == "lastvit"
    s = payload["metrics"]
    assert s["steps"] == 6
    for k in ("val_top1", "val_top5", "val_top1_random_init", "loss_start", "loss_end"):
        assert isinstance(s[k], float), k
    ev = EventAccumulator(str(run), size_guidance={"images": 0, "scalars": 0}).Reload()
    tags = ev.Tags()
    for t in ("train/loss", "train/lr", "val/top1", "val/top5", "train/top1"):
        assert t in tags["scalars"], t
    assert "votes/vote_count_maps" in tags["images"]
    lrs = [e.value for e in ev.Scalars("train/lr")]
    assert lrs[0] == pytest.approx(1e-4, rel=1e-5)  # 0.1x at step 0 (6 steps: the 1% warm-up is the 1st step)
    ck = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert ck["tokenmix"]["kind"] == "supervised" and "num_classes" not in ck["tokenmix"]["backbone"]


@pytest.mark.timeout(600)
def test_probe_and_analyze_accept_the_checkpoint(lastvit_run):
    from analysis import run as analysis_run
    from backbones.load import resolve_backbone
    tmp, runs, run = lastvit_run
    ckpt = run / "checkpoints" / "last.ckpt"
    info = resolve_backbone(str(ckpt), "", "vit_test_patch8", 8)
    assert info.model.variant == "lastvit" and info.config["arch"] == "vit_test_patch8"
    import tokenmix.paths
    old = tokenmix.paths.RUNS
    tokenmix.paths.RUNS = runs
    try:
        res = analysis_run.main(["--task", "votes", "--ckpt", str(ckpt), "--max-images", "6", "--no-tensorboard"])
    finally:
        tokenmix.paths.RUNS = old
    m = res["metrics"]
    assert m["n_images"] == 6 and 0 <= m["share_of_votes_in_box"] <= 100
    assert m["channels"] == 32 and m["k"] == 1


@pytest.mark.timeout(600)
def test_resume_continues_and_dino_checkpoint_is_refused(lastvit_run, tmp_path, capsys):
    tmp, runs, run = lastvit_run
    more = _preset(tmp_path, max_epochs=3)
    shutil.copy(more, tmp / "sup_tiny.yaml")
    # RESUME=1 finds the supervised run; the schedule now has 3 epochs: steps 6..8 follow
    rc = _supervised(["--variant", "lastvit", "--preset", str(tmp / "sup_tiny.yaml"), "--runs-dir",
                      str(runs), "--resume", "1"])
    assert rc == 0
    s = json.loads((run / "summary.json").read_text())["metrics"]
    assert s["steps"] == 9 and s["val_top1_random_init"] is not None  # random-init figure kept from the first run
    dino = tmp_path / "dino.ckpt"
    torch.save({"state_dict": {"student.backbone.x": torch.zeros(1)}, "tokenmix": {"kind": "dino_pretrain"}}, dino)
    assert _supervised(["--variant", "lastvit", "--preset", str(more), "--runs-dir", str(runs),
                        "--resume", str(dino)]) == 2
    assert "not a supervised one" in capsys.readouterr().err
    # DINO's RESUME=1 passes over the supervised run (its checkpoint says what it is, not its folder's name)
    assert pretrain_main(["--variant", "lastvit", "--runs-dir", str(runs), "--resume", "1"]) == 2
    assert "RESUME=1: no last.ckpt of a dino run for variant 'lastvit'" in capsys.readouterr().err


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_bad_inputs_fail_fast(tmp_path, capsys):
    assert _supervised(["--variant", "nope", "--runs-dir", str(tmp_path)]) == 2
    assert _supervised(["--variant", "lastvit", "--data", "imagenet", "--runs-dir", str(tmp_path)]) == 2
    assert "DATA_ROOT" in capsys.readouterr().err
    assert _supervised(["--variant", "lastvit", "--preset", "nope", "--runs-dir", str(tmp_path)]) == 2
    assert _supervised(["--variant", "lastvit", "--preset", str(_preset(tmp_path)), "--runs-dir", str(tmp_path),
                        "--model.num_classes=5"]) == 2
    assert "8 classes but model.num_classes=5" in capsys.readouterr().err
    missing = tmp_path / "no_such_imagenet"
    assert _supervised(["--variant", "lastvit", "--data", "imagenet", "--data-root", str(missing),
                        "--runs-dir", str(tmp_path)]) == 2
    assert str(missing) in capsys.readouterr().err  # the launching process names the wrong DATA_ROOT
    assert _supervised(["--variant", "lastvit", "--preset", str(_preset(tmp_path)), "--runs-dir", str(tmp_path),
                        "--trainer.num_nodes=2"]) == 2
    err = capsys.readouterr().err
    assert "num_nodes=2" in err and "srun" in err and "torchrun" in err


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_two_process_ddp_on_cpu_equals_one_process(tmp_path):
    """2 ranks (gloo): the sampler shards the batches, val metrics are synced by torchmetrics on every rank, rank 0
    alone writes summary.json; no rank-0-only collective, so it finishes. Against the same run in 1 process: the
    random-init accuracy over the whole validation set (the same initial weights, the gathered metric) is the
    same number, and both runs train the same number of steps."""
    import os
    import sys
    preset = _preset(tmp_path, max_epochs=1, limit_val_batches=1.0)
    one = tmp_path / "one"
    assert _supervised(["--variant", "softmax", "--preset", str(preset), "--runs-dir", str(one)]) == 0
    runs = tmp_path / "runs"
    # strategy ddp: Lightning's subprocess launcher re-runs this command line for rank 1, as a user's run would
    cmd = [sys.executable, "-m", "lightning_modules.pretrain", "--objective", "supervised", "--variant", "softmax",
           "--preset", str(preset), "--runs-dir", str(runs), "--trainer.devices=2", "--trainer.strategy=ddp"]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = procs.run(cmd, cwd=REPO, env=env, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = "softmax/pretrain/sup_tiny/version_0/summary.json"
    s = json.loads((runs / summary).read_text())["metrics"]
    s1 = json.loads((one / summary).read_text())["metrics"]
    assert s["steps"] == s1["steps"] == 3 and isinstance(s["val_top1"], float)
    assert s["val_top1_random_init"] == s1["val_top1_random_init"], (s, s1)
