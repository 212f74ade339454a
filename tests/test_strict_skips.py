"""TOKENMIX_STRICT_SKIPS=1 (CI) turns every skip into a failure unless its reason names a GPU, module-level skips
(importorskip at collection) included."""
from pathlib import Path

pytest_plugins = ["pytester"]

INNER = '''
import pytest

def test_fixture_skip():
    pytest.skip("real-format fixtures not present at /nowhere")

@pytest.mark.skipif(True, reason="the C++ entmax kernel did not build")
def test_cpp_skip():
    pass

def test_gpu_skip():
    pytest.skip("needs a CUDA device")

@pytest.mark.skipif(True, reason="no GPU here")
def test_gpu_skipif():
    pass
'''
MODULE_SKIP = '''
import pytest
pytest.importorskip("a_module_that_is_not_installed_anywhere")

def test_hidden():
    pass
'''


def _hook_source() -> str:
    """Our conftest's strict-skip hooks alone (the rest of it needs nothing here)."""
    text = (Path(__file__).parent / "conftest.py").read_text()
    start = text.index("STRICT_ALLOWED =")
    end = text.index("\n\n\n", text.index("def pytest_make_collect_report"))
    return "import os\nimport pytest\n" + text[start:end] + "\n"


def _outcomes(res) -> tuple:
    out = res.parseoutcomes()
    return out.get("passed", 0), out.get("failed", 0), out.get("errors", 0), out.get("skipped", 0)


def test_strict_skips_fail_every_skip_but_a_gpu_one(pytester, monkeypatch):
    pytester.makeconftest(_hook_source())
    pytester.makepyfile(test_inner=INNER, test_module_skip=MODULE_SKIP)
    monkeypatch.delenv("TOKENMIX_STRICT_SKIPS", raising=False)
    assert _outcomes(pytester.runpytest("-p", "no:cacheprovider", "-rs")) == (0, 0, 0, 5)
    monkeypatch.setenv("TOKENMIX_STRICT_SKIPS", "1")
    res = pytester.runpytest("-p", "no:cacheprovider", "-rs", "--continue-on-collection-errors")
    # (without that flag the collection error stops the session, as any import error does). A skip in a test
    # body fails it, one in setup (skipif) or at collection (importorskip) is an error; the GPU skips stay skips
    assert _outcomes(res) == (0, 1, 2, 2), res.stdout.str()
    text = res.stdout.str()
    for what in ("C++ entmax kernel", "a_module_that_is_not", "real-format fixtures"):
        assert any("this skip is an error here" in line and what in line for line in text.splitlines()), what
