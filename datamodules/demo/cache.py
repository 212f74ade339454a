"""The demo data folder: generated on first use into a temporary sibling and renamed into place (an interrupted
run never leaves a folder that looks complete), a marker written last, regenerated when incomplete or stale.
``python -m datamodules.demo`` (make demo-data) generates it now.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from tokenmix import paths
from tokenmix.io import atomic_json_dump

from .layouts import DEMO_VERSION, DemoSpec, metadata, write_imagefolder, write_nyu, write_voc
from .scenes import IGNORE_INDEX

MARKER = ".demo_complete.json"
DEFAULT_SPEC = DemoSpec()  # what `make demo-data` and every demo run use


def _digest(root: Path) -> tuple[str, int]:
    """sha256 over (relative path, bytes) of every file but the marker, in sorted order."""
    hsh, n = hashlib.sha256(), 0
    for p in sorted(q for q in root.rglob("*") if q.is_file() and q.name != MARKER):
        hsh.update(p.relative_to(root).as_posix().encode() + b"\0")
        hsh.update(p.read_bytes())
        n += 1
    return hsh.hexdigest(), n


def generate(root: Path, spec: DemoSpec | None = None) -> dict:
    """Write every layout under ``root`` (an empty or new folder) and the marker last; returns the metadata."""
    spec = spec or DEFAULT_SPEC
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    meta = metadata(spec)
    meta["counts"] = {"imagefolder": write_imagefolder(root, spec), "voc": write_voc(root, spec),
                      "nyu": write_nyu(root, spec)}
    atomic_json_dump(meta, root / "classes.json")
    digest, n_files = _digest(root)
    marker = {"version": DEMO_VERSION, "spec_key": spec.key(), "files": n_files, "sha256": digest,
              "seconds": round(time.perf_counter() - t0, 2)}
    atomic_json_dump(marker, root / MARKER)  # last: its presence means the folder is complete
    return meta


def is_complete(root: Path, spec: DemoSpec | None = None) -> bool:
    """Marker present, same version and spec, and the file count still matches (nothing deleted)."""
    spec = spec or DEFAULT_SPEC
    try:
        marker = json.loads((Path(root) / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if marker.get("version") != DEMO_VERSION or marker.get("spec_key") != spec.key():
        return False
    n = sum(len(files) for _, _, files in os.walk(root)) - 1
    return n == marker.get("files")


@contextlib.contextmanager
def _lock(root: Path):
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # another process generating the same folder: wait for it
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_demo_data(root: str | os.PathLike | None = None, force: bool = False,
                     spec: DemoSpec | None = None) -> Path:
    """The demo data folder, generated on first use (or again with ``force`` / when incomplete or stale).

    ``root``: default ``tokenmix.paths.DEMO_ROOT`` (data/demo, env TOKENMIX_DEMO_ROOT); '' counts as not given.
    """
    spec = spec or DEFAULT_SPEC
    root = Path(root) if root not in (None, "") else paths.DEMO_ROOT
    root = root.resolve()
    if not force and is_complete(root, spec):
        return root
    with _lock(root):
        if not force and is_complete(root, spec):  # generated meanwhile by another process
            return root
        tmp = root.parent / f".{root.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            generate(tmp, spec)
            if root.exists():
                old = root.parent / f".{root.name}.old-{os.getpid()}"
                os.rename(root, old)
                os.rename(tmp, root)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(tmp, root)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def summary(root: Path) -> str:
    meta = json.loads((root / "classes.json").read_text())
    marker = json.loads((root / MARKER).read_text())
    c = meta["counts"]
    return "\n".join([
        f"demo data at {root} (version {marker['version']}, {marker['files']} files, "
        f"sha256 {marker['sha256'][:12]}, generated in {marker['seconds']} s)",
        f"  imagefolder/: {c['imagefolder']['train']} train + {c['imagefolder']['val']} val, "
        f"{len(meta['classes'])} classes: {', '.join(meta['classes'])}",
        f"  VOCdevkit/VOC2012/: {c['voc']['train']} train + {c['voc']['val']} val scenes, {c['voc']['objects']} "
        f"objects, {meta['num_classes']['segmentation']} classes (0 background, {IGNORE_INDEX} borders)",
        f"  nyu/: {c['nyu']['train']} train + {c['nyu']['test']} test, depth mm range {c['nyu']['depth_mm_range']}",
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m datamodules.demo", description="Built-in demo data: synthetic "
                                 "scenes generated on first use, deterministic, in seconds, no download.")
    ap.add_argument("--root", default="", help=f"output folder (default {paths.DEMO_ROOT}, env TOKENMIX_DEMO_ROOT)")
    ap.add_argument("--force", action="store_true", help="regenerate even if complete")
    args = ap.parse_args(argv)
    t = time.perf_counter()
    root = ensure_demo_data(args.root or None, force=args.force)
    print(summary(root))
    print(f"  ready in {time.perf_counter() - t:.1f} s")
    return 0
