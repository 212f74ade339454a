"""Atomic file writes and safe checkpoint loading.

Everything tokenmix writes (checkpoints, results.json, figures) goes through :func:`atomic_write`:
temporary file in the same folder, fsync, rename. A crash mid-write leaves the previous file intact.
Checkpoints are always read with ``torch.load(..., weights_only=True)``.
"""
from __future__ import annotations

import contextlib
import json
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any, Iterator

import torch


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used: truncated, foreign, needs pickle, or mismatched."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb") -> Iterator[Any]:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the mode open() would
        os.replace(tmp, path)
        # fsync the folder so the rename itself survives a power cut
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    with atomic_write(path, "wb") as f:
        torch.save(obj, f)


def atomic_json_dump(obj: Any, path: str | os.PathLike, **kwargs) -> None:
    with atomic_write(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=False, default=str, **kwargs)
        f.write("\n")


def safe_torch_load(path: str | os.PathLike) -> Any:
    """``torch.load(weights_only=True)`` with errors that say what is wrong with the file."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{path}: refused by torch.load(weights_only=True) because it needs arbitrary pickled "
            f"objects ({str(e).splitlines()[0][:200]}). tokenmix never unpickles code. Re-save the "
            "tensors only, e.g. torch.save(ckpt['state_dict'], 'weights.pth'), from a trusted session.") from e
    except Exception as e:  # truncated zips fail in many ways (EOFError, KeyError, RuntimeError, ...)
        raise CheckpointError(
            f"{path}: not a readable torch checkpoint (truncated or foreign file: {str(e).splitlines()[0][:200]}). "
            "Use the previous checkpoint in the same folder, or re-export it.") from e
