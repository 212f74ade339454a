"""Subprocesses that leave nothing behind: every command a test starts runs in its own session (its own process
group), and the whole group is killed when the test is done with it, on success, failure or timeout alike.

Lightning's DDP launcher starts ranks 1..N-1 with a plain ``Popen``: they share the launcher's process group, so
``subprocess.run(timeout=...)``, which kills only the launcher, leaves them running. Killing the group does not.

```python
from helpers.procs import run, started
r = run([sys.executable, "-m", "probes.run", ...], timeout=400, cwd=REPO, env=env)   # CompletedProcess
with started([sys.executable, "-m", "lightning_modules.pretrain", ...], cwd=REPO) as p:  # Popen, group killed on exit
    ...
```
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator


def kill_group(p: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to ``p``'s whole process group (``p`` was started in its own session), then reap ``p``."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(timeout=30)


@contextlib.contextmanager
def started(cmd, **kwargs) -> Iterator[subprocess.Popen]:
    """``Popen(cmd, start_new_session=True, **kwargs)``; on leaving the block the group gets SIGKILL."""
    p = subprocess.Popen(cmd, start_new_session=True, **kwargs)
    try:
        yield p
    finally:
        kill_group(p)


def run(cmd, *, timeout: float, capture_output: bool = True, text: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run`` with the command in its own session; on timeout (re-raised as ``TimeoutExpired``) or
    any error the whole group is killed, so no rank survives the launcher."""
    if capture_output:
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
    with started(cmd, text=text, **kwargs) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as e:
            kill_group(p)
            out, err = p.communicate()
            raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err) from e
        return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def pytest_under_interpreter(test_files, *, timeout: float) -> None:
    """Run the ``runs_elsewhere`` tests of ``test_files`` (the ones a session that imported Triton in compiled mode
    deselects) in one fresh process with ``TRITON_INTERPRET=1`` (Triton reads it once, at import: a process that
    imported Triton in compiled mode cannot switch). Fails on any failure or skip."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    proc = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "runs_elsewhere",
                *map(str, test_files)], cwd=root, env=env, timeout=timeout)
    assert proc.returncode == 0 and " passed" in proc.stdout and "skipped" not in proc.stdout, \
        proc.stdout[-6000:] + proc.stderr[-3000:]
