"""Regression: a module- or session-scoped fixture that runs a deterministic Trainer (as conftest.py's ``entmax_run``)
must not leave torch's deterministic mode on for the test files after it."""
from pathlib import Path

import torch._inductor  # noqa: F401  (see below)

pytest_plugins = ["pytester"]


def test_module_fixture_does_not_leak_deterministic_mode(pytester):
    # torch.use_deterministic_algorithms imports torch._inductor on first use: imported here, before the inner
    # session, pytester's module snapshot keeps it (imported inside, it would be dropped and register its ops twice)
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(
        test_a="""
import pytest, torch

@pytest.fixture(scope="module")
def run():
    torch.use_deterministic_algorithms(True)  # what Trainer(deterministic=True) does
    return 1

def test_uses_run(run):
    assert run == 1
""",
        test_b="""
import torch

def test_later_file_sees_the_default():
    assert not torch.are_deterministic_algorithms_enabled()
""")
    pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=2)
