"""Resume anywhere: from every checkpoint a short run writes (mid-epoch, an epoch's last batch, the end
of fit), then again from a checkpoint the resumed run wrote, then ``RESUME=1`` on the finished run: the end is
bitwise the uninterrupted run's (weights, optimizer, RNG streams, step, epoch and Lightning's epoch counters), and
the finished run stays as it was (one line, no training, no file touched). Both objectives; 2 processes in
test_ddp_pretrain.py."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from helpers.killed_runs import assert_same

# 3 epochs x 3 batches, a checkpoint every 2 steps: mid-epoch (2, 4, 8), an epoch's last batch (6), end (9, last)
BASE = ["--variant", "softmax", "--preset", "tiny", "--trainer.enable_progress_bar=false",
        "--trainer.max_epochs=3", "--data.batches_per_epoch=3"]
POINTS = ["step0002", "step0004", "step0006", "step0008", "last"]
TRAINING = ("state_dict", "optimizer_states", "tokenmix_rng", "epoch", "global_step")


def _pretrain(runs: Path, *extra: str) -> None:
    from lightning_modules.pretrain import main
    assert main([*BASE, "--runs-dir", str(runs), *extra]) == 0


def _run_dir(runs: Path) -> Path:
    found = sorted(runs.glob("softmax/pretrain/tiny/version_*"))
    assert len(found) == 1, found
    return found[0]


def _load(path: Path) -> dict:
    return torch.load(path, weights_only=True)


def _epochs(ck: dict) -> dict:
    return ck["loops"]["fit_loop"]["epoch_progress"]


def _files(folder: Path) -> dict:
    """Every file under ``folder``: (mtime_ns, sha256)."""
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _figures(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())["metrics"]


def _hand(epochs, batches_total, batches_current, last: bool, stepped: int) -> dict:
    """A checkpoint's loop state in Lightning 2.6's layout (the keys the resume reads), counts by hand."""
    p = ("ready", "started", "processed", "completed")
    return {"loops": {"fit_loop": {
        "epoch_progress": {"total": dict(zip(p, epochs)), "current": dict(zip(p, epochs))},
        "epoch_loop.batch_progress": {"total": dict(zip(p, batches_total)), "current": dict(zip(p, batches_current)),
                                      "is_last_batch": last},
        "epoch_loop.state_dict": {"_batches_that_stepped": stepped}}}}


def test_epoch_end_form_by_hand():
    from lightning_modules.checkpoint_io import epoch_end_form, epochs_trained
    # step0008 of a run with 4 batches per epoch, saved in on_train_batch_end of epoch 1's last batch
    ck = _hand((2, 2, 1, 1), (8, 8, 8, 7), (4, 4, 4, 3), True, 7)
    assert epoch_end_form(ck)
    assert ck == _hand((2, 2, 2, 1), (8, 8, 8, 8), (4, 4, 4, 4), True, 8)  # as saved in on_train_epoch_end
    assert epochs_trained(ck) == 2 and not epoch_end_form(ck)  # idempotent
    # the last.ckpt of a run resumed before the fix (epoch 2 trained uncounted)
    ck = _hand((2, 2, 2, 2), (12, 12, 12, 11), (4, 4, 4, 3), True, 11)
    assert epoch_end_form(ck) and ck == _hand((3, 3, 3, 2), (12, 12, 12, 12), (4, 4, 4, 4), True, 12)
    for untouched in (_hand((2, 2, 1, 1), (6, 6, 6, 5), (2, 2, 2, 1), False, 5),  # mid-epoch
                      _hand((3, 3, 3, 3), (12, 12, 12, 12), (4, 4, 4, 4), True, 12),  # on_train_end
                      {"state_dict": {}}):  # no loops (an exported checkpoint)
        before = json.dumps(untouched)
        assert not epoch_end_form(untouched) and json.dumps(untouched) == before


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted run (shared by every case)."""
    runs = tmp_path_factory.mktemp("straight")
    _pretrain(runs)
    run = _run_dir(runs)
    assert sorted(p.stem for p in (run / "checkpoints").glob("*.ckpt")) == sorted(POINTS)
    return run


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_reference_counters_are_lightnings_own(reference):
    # hand-worked: after epoch e's last batch, epochs 0..e are processed and e + 1 of them started; the saved form
    # is the one Lightning writes in on_train_epoch_end (processed = started, completed one behind); last.ckpt is
    # the end of fit (EndCheckpoint: 9 steps is no multiple of the period 2), every epoch completed
    ck = {p: _load(reference / "checkpoints" / f"{p}.ckpt") for p in POINTS}
    assert [ck[p]["global_step"] for p in POINTS] == [2, 4, 6, 8, 9]
    want = {"step0002": (1, 1, 0, 0), "step0004": (2, 2, 1, 1), "step0006": (2, 2, 2, 1),
            "step0008": (3, 3, 2, 2), "last": (3, 3, 3, 3)}
    for p, (ready, started, processed, completed) in want.items():
        assert _epochs(ck[p])["total"] == {"ready": ready, "started": started, "processed": processed,
                                           "completed": completed}, p


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("point", POINTS)
def test_resume_from_every_checkpoint_again_and_again_is_bitwise(reference, point, tmp_path, capsys):
    want = _load(reference / "checkpoints" / "last.ckpt")
    start = tmp_path / f"{point}.ckpt"  # a copy: resumed into a fresh folder (RESUME=<path>)
    shutil.copy(reference / "checkpoints" / f"{point}.ckpt", start)
    capsys.readouterr()
    _pretrain(tmp_path / "b", "--resume", str(start))
    if point == "last":  # the end of fit: nothing to train, nothing written
        assert "already finished: step 9" in capsys.readouterr().out
        assert not (tmp_path / "b").exists()
        return
    run = _run_dir(tmp_path / "b")
    # resume again from a checkpoint the resumed run wrote (the next one after the start point)
    step = _load(start)["global_step"]
    later = [p for p in sorted((run / "checkpoints").glob("step*.ckpt")) if _load(p)["global_step"] > step]
    if later:
        shutil.copy(later[0], tmp_path / "again.ckpt")
        _pretrain(tmp_path / "c", "--resume", str(tmp_path / "again.ckpt"))
    for folder in [run] + ([_run_dir(tmp_path / "c")] if later else []):
        got = _load(folder / "checkpoints" / "last.ckpt")
        for key in TRAINING:
            assert_same(want[key], got[key], f"{folder.parent.name}:{key}")
        assert_same(_epochs(want), _epochs(got), "epoch_progress")
        for k in ("steps", "epochs", "loss_start", "loss_end", "train/loss", "collapse"):
            assert _figures(folder)[k] == _figures(reference)[k], k  # the resumed summary = the uninterrupted one

    # RESUME=1 on the finished run: one line naming the step and the checkpoint; nothing trained or rewritten
    before = _files(run)
    capsys.readouterr()
    _pretrain(tmp_path / "b", "--resume", "1")
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if "already finished" in ln]
    assert len(lines) == 1 and "step 9" in lines[0] and str(run / "checkpoints" / "last.ckpt") in lines[0], out
    assert "resuming from" not in out
    assert _files(run) == before


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("written", ["by Lightning, before the fix", "by a run resumed before the fix"])
def test_old_checkpoints_of_an_epochs_last_batch_resume_right(reference, written):
    # step0006 (epoch 1's last batch) as Lightning writes it in on_train_batch_end: epoch 1 started, not processed,
    # the batch's completed and the logger's step not yet counted; a run resumed before the fix trained epoch 1
    # uncounted and read ready = started = processed = completed = 1 there
    from lightning_modules.checkpoint_io import epoch_end_form
    on_disk = _load(reference / "checkpoints" / "step0006.ckpt")
    old = _load(reference / "checkpoints" / "step0006.ckpt")
    fit = old["loops"]["fit_loop"]
    counts = (2, 2, 1, 1) if written.startswith("by Lightning") else (1, 1, 1, 1)
    for part in ("total", "current"):
        fit["epoch_progress"][part].update(zip(("ready", "started", "processed", "completed"), counts))
        fit["epoch_loop.batch_progress"][part]["completed"] -= 1
    fit["epoch_loop.state_dict"]["_batches_that_stepped"] -= 1
    assert epoch_end_form(old)
    assert_same(old["loops"], on_disk["loops"], "loops")
    assert not epoch_end_form(on_disk)  # already in that form: left alone
    mid = _load(reference / "checkpoints" / "step0004.ckpt")
    assert not epoch_end_form(mid)  # mid-epoch: Lightning resumes it right


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_extending_a_finished_run_trains_on_and_summarises_the_whole_run(tmp_path, capsys):
    short = ["--model.warmup_epochs=0", "--model.warmup_teacher_temp_epochs=0"]  # a 1-epoch run allows no warmup
    _pretrain(tmp_path, *short, "--trainer.max_epochs=1")  # 3 steps, finished
    run = _run_dir(tmp_path)
    assert _figures(run)["steps"] == 3
    capsys.readouterr()
    _pretrain(tmp_path, *short, "--resume", "1", "--trainer.max_epochs=2")  # the same run, one epoch more
    assert "already finished" not in capsys.readouterr().out
    assert _run_dir(tmp_path) == run
    ck = _load(run / "checkpoints" / "last.ckpt")
    assert ck["global_step"] == 6 and _epochs(ck)["total"]["processed"] == 2
    figures = _figures(run)
    assert figures["steps"] == 6 and figures["epochs"] == 2 and figures["loss_end"] is not None


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_supervised_resumes_from_an_epochs_last_batch_and_stays_finished(tmp_path, capsys):
    # the same loop counters, written by the supervised module (3 epochs x 3 batches; step 6: epoch 1's last batch)
    from test_supervised_cli import _preset, _supervised
    preset = _preset(tmp_path, max_epochs=3)
    args = ["--variant", "softmax", "--preset", str(preset)]
    assert _supervised([*args, "--runs-dir", str(tmp_path / "a")]) == 0
    ref = sorted((tmp_path / "a").glob("softmax/pretrain/*/version_0/checkpoints"))[0]
    assert _epochs(_load(ref / "step0006.ckpt"))["total"] == {"ready": 2, "started": 2, "processed": 2,
                                                              "completed": 1}
    shutil.copy(ref / "step0006.ckpt", tmp_path / "start.ckpt")
    assert _supervised([*args, "--runs-dir", str(tmp_path / "b"), "--resume", str(tmp_path / "start.ckpt")]) == 0
    got = sorted((tmp_path / "b").glob("softmax/pretrain/*/version_0/checkpoints/last.ckpt"))[0]
    want = _load(ref / "last.ckpt")
    assert _load(got)["global_step"] == want["global_step"] == 9
    assert_same(_epochs(want), _epochs(_load(got)), "epoch_progress")
    for key in ("state_dict", "optimizer_states", "epoch", "global_step"):
        assert_same(want[key], _load(got)[key], key)
    before = _files(got.parents[1])
    capsys.readouterr()
    assert _supervised([*args, "--runs-dir", str(tmp_path / "b"), "--resume", "1"]) == 0
    assert capsys.readouterr().out.count("run already finished: step 9") == 1
    assert _files(got.parents[1]) == before
