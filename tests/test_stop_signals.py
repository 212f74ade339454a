"""SIGTERM / SIGINT / SIGKILL to a 2-process linear probe (gloo, Lightning DDP) leave no process of the run behind.

Several runs at once, each stopped at its own moment: while rank 1 is still starting (rank 0 already waits in the
rendezvous) and mid-training, sent to the launcher alone (as ``kill PID``) or to the whole process group (as
``timeout`` and a cluster's cancel do). Every process of a run carries a unique environment marker, so the run's
processes are listed from /proc whoever their parent is. What this guards: tokenmix/launch.py's stop handlers
(a thread exits the rank even while its main thread blocks in a gloo collective; the launcher forwards the signal;
ranks die with the launcher).
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from helpers.procs import started

REPO = Path(__file__).resolve().parents[1]
STARTING = "Initializing distributed: GLOBAL_RANK: 0"  # rank 0 printed it, then waits for rank 1 in the rendezvous
TRAINING = "All distributed processes registered"      # both ranks joined: feature caching and training follow
GONE_WITHIN_S = 15.0
# (moment, seconds after it, signal, to the whole group?)
CASES = [(STARTING, 0.0, signal.SIGTERM, False), (STARTING, 0.0, signal.SIGTERM, True),
         (TRAINING, 4.0, signal.SIGTERM, False), (TRAINING, 6.0, signal.SIGINT, True),
         (TRAINING, 5.0, signal.SIGKILL, False)]


def _run_pids(marker: str) -> list[int]:
    """Live processes whose environment holds ``marker`` (zombies have no environ left and do not count)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{d}/environ").read_bytes():
                    out.append(int(d))
            except OSError:
                continue
    return out


def _free_ports(n: int) -> list[int]:
    """n distinct free ports, all held open until each is known, so none is handed out twice."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from datamodules.demo import DemoSpec, ensure_demo_data
    return ensure_demo_data(tmp_path_factory.mktemp("demo"), spec=DemoSpec(cls_train=3, cls_val=2, voc_train=2,
                                                                          voc_val=2, nyu_train=2, nyu_test=2))


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="lists processes through Linux /proc")
@pytest.mark.timeout(240)
@pytest.mark.slow
def test_signals_to_a_two_process_probe_leave_nothing_running(demo, tmp_path):
    runs = []
    ports = _free_ports(len(CASES))  # one each: five launchers picking a free port at once can pick the same one
    with contextlib.ExitStack() as stack:
        for i, case in enumerate(CASES):
            marker = uuid.uuid4().hex
            env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                       TOKENMIX_TEST_RUN=marker, MASTER_PORT=str(ports[i]))
            log = tmp_path / f"run{i}.log"
            cmd = [sys.executable, "-m", "probes.run", "--task", "imagenet", "--ckpt", "random", "--data", "demo",
                   "--data-root", str(demo), "--arch", "vit_test_patch8", "--batch-size", "4", "--devices", "2",
                   "--max-epochs", "100000", "--runs-dir", str(tmp_path / f"runs{i}")]
            out = stack.enter_context(log.open("w"))
            p = stack.enter_context(started(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT))
            runs.append({"case": case, "p": p, "log": log, "marker": marker, "sent": None})
        deadline = time.monotonic() + 180  # below the test's timeout: startup of 10 processes on 2 shared cores
        while any(r.get("gone") is None for r in runs) and time.monotonic() < deadline:
            for r in runs:
                moment, after, sig, group = r["case"]
                if r["sent"] is None:
                    text = r["log"].read_text(errors="replace")
                    assert r["p"].poll() is None, f"run ended before its signal:\n{text[-3000:]}"
                    if moment in text:
                        r.setdefault("seen", time.monotonic())
                        if time.monotonic() - r["seen"] >= after:
                            os.killpg(r["p"].pid, sig) if group else os.kill(r["p"].pid, sig)
                            r["sent"] = time.monotonic()
                elif r.get("gone") is None and (not _run_pids(r["marker"])
                                                or time.monotonic() - r["sent"] > GONE_WITHIN_S):
                    r["gone"] = time.monotonic()
            time.sleep(0.2)
        assert all(r["sent"] is not None for r in runs), "a run never reached its moment within 180 s"
        for r in runs:
            moment, after, sig, group = r["case"]
            text = r["log"].read_text(errors="replace")
            left = _run_pids(r["marker"])
            where = f"{sig.name} to the {'group' if group else 'launcher'} {after:g} s after '{moment}'"
            print(f"{where}: {'every process gone after %.1f s' % (r['gone'] - r['sent']) if not left else left}")
            assert not left, f"{where}: processes {left} still running {GONE_WITHIN_S:g} s later\n{text[-3000:]}"
            if sig != signal.SIGKILL:  # a caught signal is reported, and the launcher's exit status says which
                assert f"rank 0 (pid {r['p'].pid}) received {sig.name}" in text, f"{where}:\n{text[-3000:]}"
                assert r["p"].wait(1) == 128 + sig, where
            if moment == TRAINING and sig != signal.SIGKILL:  # rank 1 had its handler: it says why it stops too
                assert "rank 1 (pid" in text and f"received {sig.name}" in text, f"{where}:\n{text[-3000:]}"
