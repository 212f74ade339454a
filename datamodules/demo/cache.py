"""The demo data folder: generated on first use into a temporary sibling and renamed into place (an interrupted
run never leaves a folder that looks complete), a marker written last, regenerated when incomplete or stale.
``python -m datamodules.demo`` (make demo-data) generates it now.

The lazy-aggregation knob (``DemoSpec.lazy_p``: a class-coded background marker in a share p of the images):
``--lazy P`` here, ``data.demo_lazy`` of the DataModules, or ``TOKENMIX_DEMO_LAZY=p`` (environment; default 0) for
every demo run in this environment. Such data needs a folder of its own (``--root``, ``data.data_root`` or
``TOKENMIX_DEMO_ROOT``, e.g. ``TOKENMIX_DEMO_ROOT=data/demo_lazy1 TOKENMIX_DEMO_LAZY=1 make study ...``), so that it
never replaces data/demo.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from tokenmix import paths
from tokenmix.io import atomic_json_dump

from .layouts import DEMO_VERSION, DemoSpec, metadata, pixels, write_layouts
from .scenes import IGNORE_INDEX

MARKER = ".demo_complete.json"
LAZY_ENV = "TOKENMIX_DEMO_LAZY"
OBJECT_ENV = "TOKENMIX_DEMO_OBJECT"  # DemoSpec.object_contrast (default 1)


def _share_from_env(name: str, default: float, what: str) -> float:
    raw = os.environ.get(name, "").strip()
    try:
        p = float(raw) if raw else default
    except ValueError:
        p = -1.0
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{name}={raw!r}: expected a share in [0, 1] ({what})")
    return p


def lazy_p_from_env() -> float:
    """``TOKENMIX_DEMO_LAZY`` as a share in [0, 1] (unset or empty: 0), or a ValueError naming the variable."""
    return _share_from_env(LAZY_ENV, 0.0, "the demo's lazy-aggregation knob")


# what `make demo-data` and every demo run use
DEFAULT_SPEC = DemoSpec(lazy_p=lazy_p_from_env(),
                        object_contrast=_share_from_env(OBJECT_ENV, 1.0, "the demo objects' contrast"))
MAX_WORKERS = 16  # beyond this, starting processes (each imports torch via the package) costs more than it saves
PIXELS_PER_WORKER = 8 << 20  # ~5 s of drawing on one core, about what starting a worker costs; tests stay serial


def _digest(root: Path) -> tuple[str, int]:
    """sha256 over (relative path, bytes) of every file but the marker, in sorted order."""
    hsh, n = hashlib.sha256(), 0
    for p in sorted(q for q in root.rglob("*") if q.is_file() and q.name != MARKER):
        hsh.update(p.relative_to(root).as_posix().encode() + b"\0")
        hsh.update(p.read_bytes())
        n += 1
    return hsh.hexdigest(), n


def default_workers(spec: DemoSpec) -> int:
    """The CPUs this process may use (affinity, e.g. a Slurm allocation), at most ``MAX_WORKERS``, and no more
    than the work pays for: 1 (this process, no pool) for small specs."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cpus, MAX_WORKERS, pixels(spec) // PIXELS_PER_WORKER))


@contextlib.contextmanager
def _map_fn(workers: int):
    """``map`` for one worker; else a process pool's ``map``. 'spawn', not fork: callers (pytest, Lightning)
    may have torch/OpenMP threads running, and a forked child can deadlock on a lock one of them held. Workers
    ignore SIGINT: Ctrl-C interrupts this process, which cancels what has not started and waits for the rest."""
    if workers == 1:
        yield map
        return
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=signal.signal, initargs=(signal.SIGINT, signal.SIG_IGN))
    try:
        yield pool.map
    finally:  # also on an error or KeyboardInterrupt: no worker outlives the call
        pool.shutdown(wait=True, cancel_futures=True)


def generate(root: Path, spec: DemoSpec | None = None, workers: int | None = None) -> dict:
    """Write every layout under ``root`` (an empty or new folder) and the marker last; returns the metadata.

    ``workers``: processes drawing the images (default ``default_workers(spec)``; 1 = this process only). Each
    image has its own seeded Generator and file, so the bytes are the same for any number of workers.
    """
    spec = spec or DEFAULT_SPEC
    workers = default_workers(spec) if workers is None else workers
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    meta = metadata(spec)
    with _map_fn(workers) as map_fn:
        meta["counts"] = write_layouts(root, spec, map_fn=map_fn)
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
                     spec: DemoSpec | None = None, workers: int | None = None) -> Path:
    """The demo data folder, generated on first use (or again with ``force`` / when incomplete or stale).

    ``root``: default ``tokenmix.paths.DEMO_ROOT`` (data/demo, env TOKENMIX_DEMO_ROOT); '' counts as not given.
    ``workers``: see ``generate``.
    """
    spec = spec or DEFAULT_SPEC
    if (spec.lazy_p or spec.object_contrast != 1) and root in (None, "") and not os.environ.get("TOKENMIX_DEMO_ROOT"):
        raise ValueError(f"lazy_p={spec.lazy_p:g}, object_contrast={spec.object_contrast:g} ({LAZY_ENV}, {OBJECT_ENV}, "
                         f"--lazy, --object-contrast, data.demo_lazy) change the demo data: give it a folder of its own, "
                         f"e.g. TOKENMIX_DEMO_ROOT=data/demo_lazy{spec.lazy_p:g} or --root / data.data_root (data/demo "
                         "keeps the default data)")
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
            generate(tmp, spec, workers)
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
    ap.add_argument("--workers", type=int, default=None, metavar="N",
                    help=f"processes drawing the images (default: the usable CPUs, at most {MAX_WORKERS}, fewer "
                         "for a small spec; 1 = this process only); the bytes do not depend on it")
    ap.add_argument("--lazy", type=float, default=DEFAULT_SPEC.lazy_p, metavar="P",
                    help=f"share of images with a class-coded background marker (default: env {LAZY_ENV}, else 0); "
                         "> 0 needs --root or TOKENMIX_DEMO_ROOT")
    ap.add_argument("--object-contrast", type=float, default=DEFAULT_SPEC.object_contrast, metavar="W",
                    help=f"weight of the objects over the background (default: env {OBJECT_ENV}, else 1)")
    args = ap.parse_args(argv)
    if args.workers is not None and args.workers < 1:
        ap.error(f"--workers must be >= 1, got {args.workers}")
    for name, v in (("--lazy", args.lazy), ("--object-contrast", args.object_contrast)):
        if not 0 <= v <= 1:
            ap.error(f"{name} must be a share in [0, 1], got {v}")
    t = time.perf_counter()
    spec = dataclasses.replace(DEFAULT_SPEC, lazy_p=args.lazy, object_contrast=args.object_contrast)
    root = ensure_demo_data(args.root or None, force=args.force, spec=spec, workers=args.workers)
    print(summary(root))
    print(f"  ready in {time.perf_counter() - t:.1f} s")
    return 0
