"""The suite's two tiers, and the guard that keeps a test in the right one.

- unit (``make test-fast``, ``-m "not slow"``): no training, no subprocess, no compilation;
- slow (``@pytest.mark.slow``): the rest; ``make test`` runs both tiers.

A test that starts a Python process (or ``ptxas``), calls ``Trainer.fit`` or ``torch.compile`` without the ``slow``
mark errors at its teardown, saying so, in both targets, also when a fixture it uses did it: a new end-to-end test
cannot slip into the inner loop. (Lightning is wrapped from the first test that starts after its import.) Tests using a fixture named in ``SLOW_FIXTURES`` are marked slow at collection.
"""
from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys

import pytest

# fixtures that train, compile or spawn (conftest.py's shared entmax_run and demo_data, test_supervised,
# test_supervised_cli, test_gpu_check, test_kernel_report): a test using one is slow without saying so
SLOW_FIXTURES = frozenset({"entmax_run", "trained", "lastvit_run", "rehearsal", "reports", "demo_data"})

_running: list = []  # the item whose setup, call or teardown runs now (a stack: pytester nests sessions)
_seen: dict = {}  # item -> what it did that only a slow test may do


def _refuse(what: str) -> None:
    # recorded, not raised here: an exception inside a library call (a compiler's worker thread, a held lock)
    # could hang it; ``check`` fails the test when it ends
    item = _running[-1] if _running else None
    if item is not None and item.get_closest_marker("slow") is None:
        _seen.setdefault(item, []).append(what)


def check(item) -> None:
    """Fails ``item`` if it (or a fixture it set up) trained, spawned or compiled without the ``slow`` mark."""
    what = sorted(set(_seen.pop(item, [])))
    if what:
        pytest.fail(f"{item.nodeid} {', '.join(what)} but is not marked slow: add @pytest.mark.slow "
                    f"(tests/helpers/tiers.py; `make test-fast` runs only tests without training, subprocesses "
                    f"or compilation)", pytrace=False)


def _is_slow_command(args) -> bool:
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args or [])
    if not argv:
        return False
    exe = os.path.basename(os.fsdecode(argv[0])).split()[0] if argv[0] else ""
    return exe.startswith("python") or exe == "ptxas" or os.fsdecode(argv[0]) == sys.executable


def _wrap(owner, name: str, what: str, when=lambda *a, **k: True) -> None:
    orig = getattr(owner, name)
    if getattr(orig, "_tier_guarded", False):
        return

    @functools.wraps(orig)
    def guarded(*args, **kwargs):
        if when(*args, **kwargs):
            _refuse(what)
        return orig(*args, **kwargs)
    guarded._tier_guarded = True
    setattr(owner, name, guarded)


def install() -> None:
    """Wrap what marks a test as slow; libraries imported later are wrapped at the next test's start."""
    _wrap(subprocess.Popen, "__init__", "starts a Python process (or ptxas)",
          lambda self, args, *a, **k: _is_slow_command(args))
    import torch
    _wrap(torch, "compile", "calls torch.compile")
    trainer = sys.modules.get("lightning.pytorch.trainer.trainer")
    if trainer is not None:
        _wrap(trainer.Trainer, "fit", "trains (Trainer.fit)")


def mark_by_fixtures(items) -> None:
    """At collection: a test using one of ``SLOW_FIXTURES`` is marked slow."""
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)


@contextlib.contextmanager
def running(item):
    """Around one test's protocol (setup, call, teardown): what it starts is checked against its marks."""
    install()
    _running.append(item)
    try:
        yield
    finally:
        _running.pop()


def heavy_files_first(items, default_timeout: float) -> None:
    """Reorders ``items`` in place, whole files kept together and in their own order: files with slow tests first,
    the one whose longest slow test may run longest (its timeout) first, then the unit tier.

    ``make test`` runs pytest-xdist with ``--dist loadfile --no-loadscope-reorder``: each worker takes the next file
    in this order. Long files first and the many short unit files last is longest-first list scheduling: the short
    files fill whatever gap the long ones leave, so no worker starts a 90 s file while the other sits idle."""
    budget: dict[str, float] = {}
    for item in items:
        t = item.get_closest_marker("timeout")
        if item.get_closest_marker("slow") is not None:
            budget[item.path] = max(budget.get(item.path, 0.0), float(t.args[0]) if t else default_timeout)
    order = {path: i for i, path in enumerate(dict.fromkeys(item.path for item in items))}
    items.sort(key=lambda item: (-budget.get(item.path, 0.0), order[item.path]))
