"""Atomic file writes (:func:`atomic_write`: temporary file in the same folder, fsync, rename; a crash leaves the
previous file intact) and safe checkpoint loading (always ``torch.load(..., weights_only=True)``).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import pickle
import re
import tempfile
from pathlib import Path
from typing import Any, Iterator


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
    import torch  # here, not at the top: the demo generator's workers import this module without torch
    with atomic_write(path, "wb") as f:
        torch.save(obj, f)


def atomic_json_dump(obj: Any, path: str | os.PathLike, **kwargs) -> None:
    with atomic_write(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=False, default=str, **kwargs)
        f.write("\n")


# The only non-tensor object allowed in a checkpoint: DINO's main_dino.py saves its args as a Namespace
# (so do the released *_full_checkpoint.pth files). Namespace restores attributes only, it runs no code.
SAFE_GLOBALS = (argparse.Namespace,)
_ZIP_MAGIC = b"PK\x03\x04"
_LEGACY_TORCH_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19"  # pickle of torch's legacy magic number


def describe_file(head: bytes) -> str:
    """What the first bytes of a file say it is: 'torch zip', 'legacy torch', 'pickle', 'text' or 'unknown'."""
    if head.startswith(_ZIP_MAGIC):
        return "torch zip"
    if head.startswith(_LEGACY_TORCH_MAGIC):
        return "legacy torch"
    if head[:1] == b"\x80" and len(head) > 1 and 2 <= head[1] <= 5:
        return "pickle"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return "unknown"
    return "text" if all(c.isprintable() or c in "\r\n\t" for c in text) else "unknown"


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks (checkpoints are hundreds of MB)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def read_file_bytes(path: str | os.PathLike) -> bytes:
    """The whole file, read once (``CheckpointError`` if it is not there)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    with open(path, "rb") as f:
        return f.read()


def safe_torch_load(source: str | os.PathLike | bytes, name: str | None = None) -> Any:
    """``torch.load(weights_only=True)`` (tensors, containers and ``argparse.Namespace`` only) with errors that say
    what the file is not. ``source``: a path, or the file's bytes already read (``name`` then labels the messages).
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        data, path = bytes(source), name or "<bytes>"
        head = data[:64]
    else:
        data, path = None, Path(source)
        if not path.is_file():
            raise CheckpointError(f"checkpoint not found: {path}")
        with open(path, "rb") as f:
            head = f.read(64)
    kind = describe_file(head)
    if not head:
        raise CheckpointError(f"{path}: an empty file, not a torch checkpoint (an interrupted copy or download?).")
    if kind == "text":
        first = head.decode("utf-8").splitlines()[0][:40] if head.strip() else ""
        raise CheckpointError(f"{path}: a text file (starts {first!r}), not a torch checkpoint: torch.save writes a "
                              "zip archive. Point to the .pth/.ckpt file itself.")
    if kind == "pickle":
        raise CheckpointError(f"{path}: a plain pickle (pickle.dump), not a torch checkpoint; tokenmix never "
                              "unpickles such files. Re-save the tensors with torch.save from a trusted session.")
    import torch
    try:
        with torch.serialization.safe_globals(list(SAFE_GLOBALS)):
            return torch.load(path if data is None else io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if kind == "unknown":
            raise CheckpointError(f"{path}: not a torch checkpoint (neither a zip archive nor a legacy torch file; "
                                  f"first bytes {head[:8]!r}).") from e
        found = re.search(r"GLOBAL ([\w.]+)", str(e))
        what = f"a {found.group(1)} object" if found else "pickled objects"
        raise CheckpointError(
            f"{path}: a torch checkpoint, but not a weights-only one: it holds {what}, and only tensors, "
            "containers and argparse.Namespace are read (torch.load(weights_only=True); tokenmix never unpickles "
            "code). Re-save the tensors only, e.g. torch.save(ckpt['state_dict'], 'weights.pth'), from a trusted "
            "session.") from e
    except Exception as e:  # truncated zips fail in many ways (EOFError, KeyError, RuntimeError, ...)
        if kind == "unknown":
            raise CheckpointError(f"{path}: not a torch checkpoint (neither a zip archive nor a legacy torch file; "
                                  f"first bytes {head[:8]!r}).") from e
        raise CheckpointError(
            f"{path}: truncated or foreign file: it starts as a torch checkpoint but cannot be read "
            f"({str(e).splitlines()[0][:200]}). "
            "Use the previous checkpoint in the same folder, or re-export it.") from e
