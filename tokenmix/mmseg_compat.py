"""Import mmsegmentation on top of ``mmcv-lite`` (mmseg 1.2.2 needs mmcv < 2.2; ``mmcv-lite==2.1.0`` has what we
use but not the compiled ``mmcv._ext``, which some mmseg imports load eagerly): a stand-in module whose functions
raise if a compiled op is ever called. Always import mmseg through :func:`import_mmseg`.
"""
from __future__ import annotations

import sys
import types


def _missing_op(name: str):
    def op(*args, **kwargs):
        raise NotImplementedError(
            f"mmcv compiled op '{name}' is not available: tokenmix installs mmcv-lite (no CUDA/C++ ops). "
            "Install the full mmcv<2.2 if you need mmcv.ops.")
    op.__name__ = name
    return op


def install_shim() -> None:
    if "mmcv._ext" in sys.modules:
        return
    try:  # a full mmcv install has the real module: prefer it
        import mmcv._ext  # noqa: F401
        return
    except ImportError:
        pass
    shim = types.ModuleType("mmcv._ext")
    shim.__doc__ = "tokenmix stand-in for mmcv's compiled ops (see tokenmix/mmseg_compat.py)"

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _missing_op(name)

    shim.__getattr__ = __getattr__
    sys.modules["mmcv._ext"] = shim


def import_mmseg():
    install_shim()
    import mmseg
    import mmseg.datasets  # noqa: F401  (registers dataset classes)
    import mmseg.evaluation  # noqa: F401
    return mmseg
