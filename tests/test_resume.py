"""Bitwise resume after a real SIGKILL, atomic checkpoint writes, refusal of bad checkpoints."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.killed_runs import assert_same, finish, last_checkpoint, wait_for_pause
from helpers.procs import kill_group, started
from lightning_modules.checkpoint_io import AtomicCheckpointIO
from tokenmix.io import CheckpointError

REPO = Path(__file__).resolve().parents[1]

HELPERS = Path(__file__).resolve().parent / "ddp_helpers.py"  # its default mode: pretrain, pausable


def _cmd(runs: Path, extra: list[str], backend: str, pause: int | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), PAUSE_AT_STEP=str(pause if pause is not None else -1),
               PAUSE_DIR=str(runs / "paused"), TOKENMIX_LINEAR_BACKEND=backend)
    cmd = [sys.executable, str(HELPERS), "--variant", "softmax", "--preset", "tiny", "--runs-dir", str(runs),
           "--trainer.enable_progress_bar=false", *extra]
    return {"cmd": cmd, "cwd": REPO, "env": env, "stderr": subprocess.STDOUT, "text": True}


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", ["aten", "onednn"])  # the same two on every host (backbones/linear.py)
def test_sigkill_mid_epoch_then_resume_is_bitwise_identical(tmp_path, backend, demo_data):
    # tiny preset: 3 batches per epoch, 2 epochs, a checkpoint every 2 steps, drop-path on (global RNG stream)
    (tmp_path / "b" / "paused").mkdir(parents=True)
    log = tmp_path / "killed.log"
    with contextlib.ExitStack() as runs, open(log, "w") as out:  # the log: a file, nothing blocks on it
        straight = runs.enter_context(started(stdout=subprocess.PIPE, **_cmd(tmp_path / "a", [], backend)))
        # step 5 = last batch of epoch 1; last.ckpt: step 4
        killed = runs.enter_context(started(stdout=out, **_cmd(tmp_path / "b", [], backend, pause=5)))
        wait_for_pause(tmp_path / "b" / "paused", 1, killed, log, timeout=240)
        kill_group(killed)
        assert killed.returncode == -signal.SIGKILL
        ck_b = last_checkpoint(tmp_path / "b")
        assert torch.load(ck_b, weights_only=True)["global_step"] == 4  # the kill landed mid-epoch
        resumed = finish(runs.enter_context(started(stdout=subprocess.PIPE, **_cmd(
            tmp_path / "b", ["--resume", "1"], backend))), timeout=250)
        assert "resuming from" in resumed and "linear_backend" not in resumed  # same backend: no warning
        finish(straight, timeout=120)  # it ran alongside: all budgets together stay below the test's 900 s

    a = torch.load(last_checkpoint(tmp_path / "a"), weights_only=True)
    b = torch.load(last_checkpoint(tmp_path / "b"), weights_only=True)
    assert a["global_step"] == b["global_step"] == 6
    assert a["tokenmix"]["runtime"] == {"linear_backend": backend}  # the resolved backend, recorded
    # weights (student, EMA teacher, DINO centre), optimizer state, RNG streams, loop counters
    for key in ("state_dict", "optimizer_states", "tokenmix_rng", "tokenmix", "epoch", "global_step"):
        assert_same(a[key], b[key], key)
    assert "dino_loss.center" in a["state_dict"] and a["state_dict"]["dino_loss.center"].abs().sum() > 0
    assert_same(a["loops"]["fit_loop"]["epoch_progress"], b["loops"]["fit_loop"]["epoch_progress"], "epochs")
    # the teacher really moved by EMA and differs from the student
    sd = a["state_dict"]
    assert not torch.equal(sd["teacher.backbone.blocks.0.attn.qkv.weight"], sd["student.backbone.blocks.0.attn.qkv.weight"])


def _minimal_ckpt(step: int) -> dict:
    t = torch.full((2,), float(step))
    return {"state_dict": {f"{p}w": t for p in ("student.backbone.", "student.head.", "teacher.backbone.",
                                                 "teacher.head.")},
            "tokenmix": {"backbone": {"arch": "vit_test_patch8", "variant": "softmax"}}, "global_step": step}


def test_crash_during_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint(_minimal_ckpt(1), path)
    before = path.read_bytes()

    real_save = torch.save

    def dying_save(obj, f, *a, **kw):  # write half a checkpoint, then "crash"
        real_save(obj, f, *a, **kw)
        f.seek(0)
        f.truncate(100)
        raise KeyboardInterrupt("simulated crash during save")

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint(_minimal_ckpt(2), path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temporary left behind
    assert io.load_checkpoint(path)["global_step"] == 1


def test_truncated_and_foreign_checkpoints_are_refused(tmp_path):
    io = AtomicCheckpointIO()
    good = tmp_path / "good.ckpt"
    io.save_checkpoint(_minimal_ckpt(3), good)
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(good.read_bytes()[:200])
    with pytest.raises(CheckpointError, match="truncated or foreign"):
        io.load_checkpoint(truncated)
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {"layer.weight": torch.zeros(2)}, "epoch": 0}, foreign)
    with pytest.raises(CheckpointError, match="foreign Lightning checkpoint"):
        io.load_checkpoint(foreign)
    official = tmp_path / "dino_deitsmall16_pretrain.pth"
    torch.save({"cls_token": torch.zeros(1, 1, 4)}, official)
    with pytest.raises(CheckpointError, match="not a Lightning checkpoint"):
        io.load_checkpoint(official)
