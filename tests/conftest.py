import os
from pathlib import Path

import pytest
import torch

# Keep the 2-core CI machine responsive and the results reproducible.
torch.set_num_threads(min(2, os.cpu_count() or 1))

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "real"


@pytest.fixture(autouse=True)
def _restore_determinism():
    """A deterministic Trainer switches torch's deterministic mode on for the whole process: undo it."""
    before = torch.are_deterministic_algorithms_enabled()
    yield
    torch.use_deterministic_algorithms(before)


@pytest.fixture
def fixtures_root() -> Path:
    if not FIXTURES.is_dir():
        pytest.skip(f"real-format fixtures not present at {FIXTURES}")
    return FIXTURES
