import os
from pathlib import Path

import pytest
import torch

from helpers import shared_runs, tiers

# Keep the 2-core CI machine responsive and the results reproducible; under pytest-xdist (-n N) the workers share
# the cores instead of each taking both, and so do the processes a test starts (they inherit OMP_NUM_THREADS):
# two workers' OpenMP pools of 2 threads on 2 cores spin at every barrier waiting for a descheduled thread, which
# made 2-process tests 4x slower than alone.
_THREADS = max(1, min(2, os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
torch.set_num_threads(_THREADS)
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", str(_THREADS))
    import torch._inductor.config
    torch._inductor.config.compile_threads = _THREADS  # 1: compile in the worker, no pool of compile processes

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "real"
# TOKENMIX_STRICT_SKIPS=1 (set by .ci/run): every skip is a failure unless its reason names what a CPU machine
# cannot have (a GPU). Module-level skips (pytest.importorskip, pytest.skip(allow_module_level=True)) included:
# they happen at collection, where a plain skip would hide a whole file.
STRICT_ALLOWED = ("GPU", "CUDA")


def _strict_refuses(rep) -> bool:
    if not (rep.skipped and os.environ.get("TOKENMIX_STRICT_SKIPS") == "1"):
        return False
    reason = str(rep.longrepr[2]) if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
    if any(k in reason for k in STRICT_ALLOWED):
        return False
    rep.outcome = "failed"
    rep.longrepr = f"TOKENMIX_STRICT_SKIPS=1: this skip is an error here (allowed: a reason naming " \
                   f"{' or '.join(STRICT_ALLOWED)}): {reason}"
    return True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _strict_refuses(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _strict_refuses(outcome.get_result())


def pytest_configure(config):
    config.addinivalue_line("markers", "runs_elsewhere(condition, reason): deselect (not skip) when condition is "
                            "true, because another test runs this one in a subprocess (e.g. Triton's interpreter "
                            "must be chosen before Triton is first imported, so one process has one mode)")


def pytest_collection_modifyitems(config, items):
    """``runs_elsewhere`` tests whose condition holds leave this session as deselected: their subprocess twin
    runs them and fails if any of them fails or skips, so nothing is hidden behind a skip. Then the long files go
    first (``tiers.heavy_files_first``: how ``make test`` balances its two workers)."""
    here, elsewhere = [], []
    for item in items:
        m = item.get_closest_marker("runs_elsewhere")
        (elsewhere if m is not None and m.args[0] else here).append(item)
    if elsewhere:
        config.hook.pytest_deselected(items=elsewhere)
        items[:] = here
    tiers.heavy_files_first(items, float(config.getini("timeout") or 0))


def pytest_itemcollected(item):
    tiers.mark_by_fixtures([item])  # before ``-m`` selects: a test using a slow session fixture is slow


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with tiers.running(item):  # a test that trains, spawns or compiles must be marked slow
        yield


# The process's state before any test ran. A deterministic Trainer switches torch's deterministic mode on for
# the whole process, also from a module-scoped fixture that runs before a per-test fixture could record a
# "before" value, so every test ends by going back to this baseline, not to what it found.
_DETERMINISTIC = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())


@pytest.fixture(autouse=True)
def _restore_determinism():
    yield
    torch.use_deterministic_algorithms(_DETERMINISTIC[0], warn_only=_DETERMINISTIC[1])


@pytest.fixture(autouse=True)
def _tier_guard(request):
    yield
    tiers.check(request.node)  # trained, spawned or compiled without @pytest.mark.slow: an error here


@pytest.fixture
def fixtures_root() -> Path:
    if not FIXTURES.is_dir():
        pytest.skip(f"real-format fixtures not present at {FIXTURES}")
    return FIXTURES


@pytest.fixture(scope="session")
def entmax_run(tmp_path_factory) -> shared_runs.TinyRun:
    """ONE trained tiny entmax DINO run for the whole session (k-NN and dense checks on, epoch 1 kept): every test
    that needs "a trained checkpoint" or its logs reads this one instead of training its own. Read-only."""
    base = tmp_path_factory.getbasetemp()
    session = base.parent if "PYTEST_XDIST_WORKER" in os.environ else base  # xdist: the workers' common folder
    return shared_runs.once(session / "shared", "entmax_run", lambda root: shared_runs.train_tiny_entmax(
        root / "runs", shared_runs.small_voc(root / "demo")))


@pytest.fixture(scope="session")
def demo_data() -> Path:
    """data/demo, the folder DATA=demo reads, generated here when missing or stale. Here, not in the first CLI that
    needs it: the generator's spawned workers import only the generator, where a CLI's would import its whole main
    module (Lightning included) again."""
    from datamodules.demo import ensure_demo_data
    return ensure_demo_data()
