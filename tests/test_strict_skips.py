"""TOKENMIX_STRICT_SKIPS=1 (CI) turns fixture and C++-compiler skips into failures; other skips stay skips."""
from pathlib import Path

pytest_plugins = ["pytester"]

INNER = '''
import pytest

def test_fixture_skip():
    pytest.skip("real-format fixtures not present at /nowhere")

@pytest.mark.skipif(True, reason="no C++ compiler")
def test_cpp_skip():
    pass

def test_other_skip():
    pytest.skip("needs a CUDA device")
'''


def _hook_source() -> str:
    """Our conftest's strict-skip hook alone (the rest of it needs nothing here)."""
    text = (Path(__file__).parent / "conftest.py").read_text()
    start = text.index("STRICT_SKIP_REASONS =")
    end = text.index("\n\n\n", text.index("def pytest_runtest_makereport"))
    return "import os\nimport pytest\n" + text[start:end] + "\n"


def test_strict_skips_fail_only_the_ci_skips(pytester, monkeypatch):
    pytester.makeconftest(_hook_source())
    pytester.makepyfile(test_inner=INNER)
    monkeypatch.delenv("TOKENMIX_STRICT_SKIPS", raising=False)
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(skipped=3)
    monkeypatch.setenv("TOKENMIX_STRICT_SKIPS", "1")
    res = pytester.runpytest("-p", "no:cacheprovider")
    out = res.parseoutcomes()  # a skip in setup (skipif) becomes an error, one in the test body a failure
    assert (out.get("failed", 0), out.get("errors", 0), out.get("skipped", 0)) == (1, 1, 1)
    res.stdout.fnmatch_lines(["*TOKENMIX_STRICT_SKIPS=1: this skip is an error here*"])
