import os
from pathlib import Path

import pytest
import torch

# Keep the 2-core CI machine responsive and the results reproducible.
torch.set_num_threads(min(2, os.cpu_count() or 1))

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "real"


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
