"""Regression: a module-scoped fixture that runs a deterministic Trainer (as test_pretrain_cli's ``entmax_run``)
must not leave torch's deterministic mode on for the test files after it."""
from pathlib import Path

pytest_plugins = ["pytester"]


def test_module_fixture_does_not_leak_deterministic_mode(pytester):
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
