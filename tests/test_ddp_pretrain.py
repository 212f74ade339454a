"""Pretraining with 2 processes on CPU (gloo, Lightning DDP): end to end, SIGKILL + resume bitwise, head BatchNorm
as the official code (batch statistics in the teacher, SyncBatchNorm under DDP)."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from helpers.killed_runs import assert_same, finish, last_checkpoint, wait_for_pause
from helpers.procs import kill_group, started

REPO = Path(__file__).resolve().parents[1]
HELPERS = Path(__file__).resolve().parent / "ddp_helpers.py"
DDP = ["--variant", "softmax", "--preset", "tiny", "--trainer.devices=2", "--trainer.enable_progress_bar=false"]


def _env(**extra) -> dict:
    # one thread per process: 2 processes on a 2-core machine
    return dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}", OMP_NUM_THREADS="1",
                **{k: str(v) for k, v in extra.items()})


def _cmd(runs: Path, extra: list[str], backend: str, pause: int = -1) -> dict:
    """``started(**_cmd(...))``: the pausable pretraining under linear ``backend`` (pinned, so every host runs the
    same: this end-to-end test under aten, the SIGKILL + resume one under onednn; test_resume.py runs both)."""
    cmd = [sys.executable, str(HELPERS), *DDP, "--runs-dir", str(runs), *extra]
    env = _env(PAUSE_AT_STEP=pause, PAUSE_DIR=runs / "paused", TOKENMIX_LINEAR_BACKEND=backend)
    return {"cmd": cmd, "cwd": REPO, "env": env, "stderr": subprocess.STDOUT, "text": True}


def _rank_seeded_tiny(tmp_path: Path) -> Path:
    """The config both resume tests run: the tiny preset's callbacks plus RankSeed (ranks draw differently); 3
    epochs of 2 batches and a checkpoint after every step, so there are checkpoints inside epochs (steps 1, 3, 5)
    and at their ends (2, 4)."""
    tiny = yaml.safe_load((REPO / "configs/pretrain/tiny.yaml").read_text())
    cbs = tiny["trainer"]["callbacks"] + [{"class_path": "ddp_helpers.RankSeed"}]
    ckpt = next(c for c in cbs if c["class_path"].endswith("ModelCheckpoint"))
    ckpt["init_args"]["every_n_train_steps"] = 1
    extra = tmp_path / "extra.yaml"
    extra.write_text(yaml.safe_dump({"trainer": {"callbacks": cbs, "max_epochs": 3}, "data": {"batches_per_epoch": 2}}))
    return extra


@pytest.fixture(scope="module")
def straight(tmp_path_factory, demo_data) -> tuple[Path, Path, dict]:
    """(config, checkpoint folder, last checkpoint) of the uninterrupted 2-process run that both resume tests
    compare against."""
    root = tmp_path_factory.mktemp("straight")
    extra = _rank_seeded_tiny(root)
    with started(stdout=subprocess.PIPE, **_cmd(root / "a", [f"--config={extra}"], "onednn")) as p:
        finish(p, timeout=250)
    last = last_checkpoint(root / "a")
    return extra, last.parent, torch.load(last, weights_only=True)


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_two_processes_end_to_end_with_knn_summary_and_head_batchnorm(tmp_path, demo_data):
    tiny = yaml.safe_load((REPO / "configs/pretrain/tiny.yaml").read_text())
    cbs = tiny["trainer"]["callbacks"]
    cbs.insert(-1, {"class_path": "lightning_modules.callbacks.knn.KNNCheck", "init_args": {"max_train": 64}})
    cbs.append({"class_path": "ddp_helpers.RankReport", "init_args": {"out_dir": str(tmp_path / "ranks")}})
    extra = tmp_path / "extra.yaml"
    extra.write_text(yaml.safe_dump({"trainer": {"callbacks": cbs}}))
    t0 = time.perf_counter()
    with started(stdout=subprocess.PIPE, **_cmd(tmp_path / "runs", [f"--config={extra}",
                                                                      "--model.use_bn_in_head=true"], "aten")) as p:
        out = finish(p, timeout=500)
    print(f"2-process tiny run: {time.perf_counter() - t0:.1f} s")
    # the scale line: world size, per-device and total batch, lr after the linear rule, vs the paper's 1024
    assert "scale: world size 2" in out and "batch 8 per device x 2 = 16 total" in out, out[-3000:]
    assert "lr 0.00025 (base 0.004 x 16/256)" in out and "the paper's 1024" in out
    ck_path = last_checkpoint(tmp_path / "runs")
    logdir = ck_path.parents[1]
    assert sorted(p.name for p in logdir.parent.iterdir()) == ["version_0"]  # one run folder
    assert len(list(logdir.glob("events.out.tfevents.*"))) == 1  # TensorBoard from rank 0 only
    summary = json.loads((logdir / "summary.json").read_text())["metrics"]
    assert summary["steps"] == 6 and summary["knn_top1"] is not None and summary["knn_top1_random_init"] is not None
    ck = torch.load(ck_path, weights_only=True)
    assert ck["global_step"] == 6
    assert ck["tokenmix_rng"]["ranks_torch"].shape[0] == 2  # every rank's RNG stream
    ranks = [json.loads((tmp_path / "ranks" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    for r in ranks:  # the teacher is never in eval mode (official); CPU DDP has no SyncBatchNorm (see below)
        assert r["teacher_head_bn"] and set(r["teacher_head_bn"]) == {"BatchNorm1d"}
        assert all(r["teacher_head_bn_training"])
        assert any(abs(v) > 0 for v in r["teacher_head_running_mean"][0])  # batch statistics were used
    assert "no CPU SyncBatchNorm" in out


def test_sync_batchnorm_under_gpu_ddp_converts_student_and_teacher():
    """Official: ``nn.SyncBatchNorm.convert_sync_batchnorm`` on student and teacher when the head has BatchNorm.
    Here Lightning's ``sync_batchnorm`` flag, which applies TorchSyncBatchNorm to the whole module."""
    from lightning.pytorch.plugins import TorchSyncBatchNorm
    from lightning.pytorch.strategies import DDPStrategy

    from lightning_modules.dino_module import DINOPretrainModule
    from tokenmix.launch import wants_sync_batchnorm
    assert wants_sync_batchnorm(DDPStrategy(), "gpu", "head") and not wants_sync_batchnorm("auto", "gpu", "head")
    assert not wants_sync_batchnorm(DDPStrategy(), "cpu", "head")  # torch's DDP refuses SyncBatchNorm on CPU
    m = DINOPretrainModule(arch="vit_test_patch8", use_bn_in_head=True, out_dim=16, head_hidden_dim=32,
                           head_bottleneck_dim=8, epochs=2, warmup_epochs=0, n_local_crops=0)
    m = TorchSyncBatchNorm().apply(m)
    for net in (m.student, m.teacher):
        kinds = {type(x).__name__ for x in net.head.modules() if isinstance(x, torch.nn.modules.batchnorm._BatchNorm)}
        assert kinds == {"SyncBatchNorm"}


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_two_processes_sigkill_then_resume_is_bitwise_identical(tmp_path, straight):
    # tiny preset: 3 epochs of 2 batches, a checkpoint every step, drop-path on (per-rank RNG streams); killed inside
    # step 3 (last.ckpt: step 3, inside epoch 1), so the resumed run also crosses an epoch boundary
    extra, _, a = straight
    t0 = time.perf_counter()
    paused = tmp_path / "b" / "paused"
    paused.mkdir(parents=True)
    log = tmp_path / "killed.log"
    with contextlib.ExitStack() as runs, open(log, "w") as out:  # the log: a file, nothing blocks on it
        killed = runs.enter_context(started(stdout=out, **_cmd(tmp_path / "b", [f"--config={extra}"], "onednn",
                                                               pause=3)))
        wait_for_pause(paused, 2, killed, log, timeout=300)  # both ranks inside step 3 (last.ckpt: step 3)
        kill_group(killed)  # the launcher and the process it started
        assert killed.returncode == -signal.SIGKILL
        assert torch.load(last_checkpoint(tmp_path / "b"), weights_only=True)["global_step"] == 3
        resumed = finish(runs.enter_context(started(stdout=subprocess.PIPE, **_cmd(
            tmp_path / "b", [f"--config={extra}", "--resume", "1"], "onednn"))), timeout=300)
        assert "resuming from" in resumed
    print(f"killed + resumed 2-process runs: {time.perf_counter() - t0:.1f} s")
    b = torch.load(last_checkpoint(tmp_path / "b"), weights_only=True)
    assert a["global_step"] == b["global_step"] == 6
    assert a["tokenmix"]["runtime"] == {"linear_backend": "onednn"}  # the pinned backend, recorded
    for key in ("state_dict", "optimizer_states", "tokenmix_rng", "tokenmix", "epoch", "global_step"):
        assert_same(a[key], b[key], key)
    assert a["optimizer_states"][0]["state"], "optimizer state is empty"
    rng = a["tokenmix_rng"]["ranks_torch"]
    assert rng.shape[0] == 2 and not torch.equal(rng[0], rng[1])  # two different streams, both restored


def test_teacher_head_batchnorm_uses_batch_statistics_as_official():
    """Official main_dino.py never calls teacher.eval(): with use_bn_in_head its head BatchNorm normalises with
    the batch's own mean / biased variance and updates its running stats. Reference: F.batch_norm in training
    mode on the captured input (the official BN forward in train mode)."""
    from lightning_modules.dino_module import DINOPretrainModule
    torch.manual_seed(0)
    m = DINOPretrainModule(arch="vit_test_patch8", use_bn_in_head=True, out_dim=16, head_hidden_dim=32,
                           head_bottleneck_dim=8, epochs=2, warmup_epochs=0, n_local_crops=0)
    bn = next(x for x in m.teacher.head.modules() if isinstance(x, torch.nn.BatchNorm1d))
    # as built (Lightning 2.6 keeps the modes it finds) and after train(): head in train mode, backbone not
    assert bn.training and not m.teacher.backbone.training  # backbone: no drop-path, as the official teacher
    m.train()
    assert bn.training and not m.teacher.backbone.training
    seen = {}
    bn.register_forward_hook(lambda mod, inp, out: seen.update(x=inp[0].detach(), y=out.detach()))
    with torch.no_grad():
        m.teacher([torch.randn(4, 3, 32, 32), torch.randn(4, 3, 32, 32)])
    ref = F.batch_norm(seen["x"], None, None, bn.weight, bn.bias, training=True, eps=bn.eps)
    assert torch.allclose(seen["y"], ref, atol=1e-5)
    assert bn.running_mean.abs().sum() > 0  # moved from its zero init
    m.eval()
    assert not bn.training


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_two_processes_resume_at_epoch_ends_again_and_after_the_end(tmp_path, straight):
    # 3 epochs x 2 batches: resume from the end of the first epoch (step 2, an epoch's last batch), again from the end of the
    # second (step 4) that the resumed run wrote, then RESUME=1 on the finished run
    extra, checkpoints, a = straight
    t0 = time.perf_counter()

    def run(runs: Path, *more: str) -> str:
        with started(stdout=subprocess.PIPE, **_cmd(runs, [f"--config={extra}", *more], "onednn")) as p:
            return finish(p, timeout=250)
    shutil.copy(checkpoints / "step0002.ckpt", tmp_path / "start.ckpt")
    assert "resuming from" in run(tmp_path / "b", "--resume", str(tmp_path / "start.ckpt"))
    shutil.copy(last_checkpoint(tmp_path / "b").parent / "step0004.ckpt", tmp_path / "again.ckpt")
    run(tmp_path / "c", "--resume", str(tmp_path / "again.ckpt"))
    done = last_checkpoint(tmp_path / "c")
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(done.parents[1].rglob("*")) if p.is_file()}
    out = run(tmp_path / "c", "--resume", "1")
    assert out.count("run already finished: step 6") == 1 and str(done) in out and "resuming from" not in out, out
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(done.parents[1].rglob("*")) if p.is_file()} \
        == before
    print(f"2 resumed + finished 2-process runs: {time.perf_counter() - t0:.1f} s")
    for name in ("b", "c"):
        got = torch.load(last_checkpoint(tmp_path / name), weights_only=True)
        assert got["global_step"] == a["global_step"] == 6
        for key in ("state_dict", "optimizer_states", "tokenmix_rng", "epoch", "global_step"):
            assert_same(a[key], got[key], f"{name}:{key}")
        assert_same(a["loops"]["fit_loop"]["epoch_progress"], got["loops"]["fit_loop"]["epoch_progress"], name)
    assert a["loops"]["fit_loop"]["epoch_progress"]["total"] == {"ready": 3, "started": 3, "processed": 3,
                                                                 "completed": 2}
    rng = a["tokenmix_rng"]["ranks_torch"]
    assert rng.shape[0] == 2 and not torch.equal(rng[0], rng[1])
