"""Shared by the SIGKILL + resume tests (1 process: test_resume.py; 2 processes: test_ddp_pretrain.py).
Every run is started with ``helpers.procs.started`` (own session, group killed when the test leaves it).

The run under test is ``tests/ddp_helpers.py`` with ``PAUSE_AT_STEP`` and ``PAUSE_DIR``: every rank writes
``<PAUSE_DIR>/rank<r>`` inside that step and sleeps, so the test can kill it at a known point.
"""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import torch

from helpers.procs import kill_group


def wait_for_pause(paused: Path, ranks: int, proc: subprocess.Popen, log: Path, timeout: float = 400) -> None:
    """Until ``ranks`` markers exist in ``paused``; fails with the run's log if it ends first or ``timeout`` passes
    (polled: a blocking read of the run's output could not honour the deadline)."""
    deadline = time.time() + timeout
    while len(list(paused.glob("rank*"))) < ranks:
        assert proc.poll() is None, f"run ended before reaching the pause:\n{log.read_text()[-4000:]}"
        assert time.time() < deadline, f"no pause within {timeout:.0f} s:\n{log.read_text()[-4000:]}"
        time.sleep(0.5)


def finish(proc: subprocess.Popen, timeout: float) -> str:
    """The output of ``proc`` (started by ``helpers.procs.started`` with a text pipe) once it ends, asserting exit
    0; past ``timeout`` its whole process group is killed and the test fails with the output so far."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, _ = proc.communicate()
        raise AssertionError(f"run still going after {timeout:.0f} s:\n{(out or '')[-4000:]}") from None
    assert proc.returncode == 0, out[-4000:]
    return out


def last_checkpoint(runs: Path) -> Path:
    found = sorted(runs.glob("softmax/pretrain/**/checkpoints/last.ckpt"))
    assert len(found) == 1, found
    return found[0]


def assert_same(a, b, where: str = "ckpt") -> None:
    """Bitwise equality of two checkpoint trees (tensors: dtype, shape and every bit)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), f"{where} differs (max abs diff {(a.double() - b.double()).abs().max()})"
    elif isinstance(a, dict):
        assert set(a) == set(b), f"{where}: keys differ {set(a) ^ set(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"
