"""Triton's CPU interpreter for the kernel test files (test_triton_attention, test_kernel_fused, test_triton_canary).

Triton reads ``TRITON_INTERPRET`` once, when it is first imported. A file calls ``choose()`` before ``import triton``:

```python
from helpers import interpreter
_PRELOADED = interpreter.choose()   # True: Triton already imported in compiled mode (the full suite)
import triton
kernel = interpreter.kernel_tests(_PRELOADED)   # the mark of the tests that launch kernels
```

``_PRELOADED`` true: the file's kernel tests are ``runs_elsewhere``; test_triton_attention's
``test_kernels_in_subprocess`` runs them under the interpreter in a fresh process.
"""
from __future__ import annotations

import os
import sys

import pytest


def choose() -> bool:
    """Select the interpreter for this process unless Triton is already imported in compiled mode (then True)."""
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        return True
    os.environ["TRITON_INTERPRET"] = "1"
    _patch_once_per_launch()
    return False


def kernel_tests(preloaded: bool):
    """The mark of a file's kernel tests: deselected (``runs_elsewhere``) when Triton is already compiled-mode."""
    return pytest.mark.runs_elsewhere(preloaded, reason="Triton already imported in compiled mode: test_triton_"
                                      "attention.py::test_kernels_in_subprocess runs these under the interpreter")


def _patch_once_per_launch() -> None:
    """Triton's interpreter swaps triton.language's builtins for interpreted ones when a kernel launches, and undoes
    it when the launch ends. It also redoes the swap at every call of a ``@triton.jit`` helper inside the kernel
    (``inspect.getmembers`` over tl, tl.tensor, tl.math: about a millisecond), though the launch already made it;
    the threshold loops call helpers tens of thousands of times. Here a helper call skips the swap when every
    language module it sees is already swapped: the same state, a third less time for these files' kernel tests.
    A Triton without these internals runs as it is."""
    from triton.runtime import interpreter as ti
    import triton.language as tl
    patch = getattr(ti, "_patch_lang", None)
    if patch is None or getattr(patch, "once_per_launch", False) or not hasattr(ti, "_LangPatchScope"):
        return

    def once_per_launch(fn):
        langs = [v for v in fn.__globals__.values() if v is tl or v is tl.core]
        if langs and not any(tl.core.is_builtin(lang.load) for lang in langs):
            return ti._LangPatchScope()  # nothing to undo: the launch's own scope restores the builtins
        return patch(fn)
    once_per_launch.once_per_launch = True
    ti._patch_lang = once_per_launch
