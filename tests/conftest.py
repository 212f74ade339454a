import os
from pathlib import Path

import pytest
import torch

# Keep the 2-core CI machine responsive and the results reproducible.
torch.set_num_threads(min(2, os.cpu_count() or 1))

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "real"
# Skips CI's environment must never produce (../shared is there, a C++ compiler is installed): with
# TOKENMIX_STRICT_SKIPS=1 (set by .ci/run) they fail instead of passing silently.
STRICT_SKIP_REASONS = ("fixtures", "C++ compiler")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and os.environ.get("TOKENMIX_STRICT_SKIPS") == "1":
        reason = str(rep.longrepr[2]) if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        if any(k in reason for k in STRICT_SKIP_REASONS):
            rep.outcome = "failed"
            rep.longrepr = f"TOKENMIX_STRICT_SKIPS=1: this skip is an error here ({reason})"


# The process's state before any test ran. A deterministic Trainer switches torch's deterministic mode on for
# the whole process, also from a module-scoped fixture that runs before a per-test fixture could record a
# "before" value, so every test ends by going back to this baseline, not to what it found.
_DETERMINISTIC = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())


@pytest.fixture(autouse=True)
def _restore_determinism():
    yield
    torch.use_deterministic_algorithms(_DETERMINISTIC[0], warn_only=_DETERMINISTIC[1])


@pytest.fixture
def fixtures_root() -> Path:
    if not FIXTURES.is_dir():
        pytest.skip(f"real-format fixtures not present at {FIXTURES}")
    return FIXTURES
