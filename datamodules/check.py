"""``python -m datamodules.check --task <dataset> --data-root R`` (make check-data): decode every file of every
split, print counts next to the official ones and list every missing, corrupt or out-of-range file.

Exit code 1 on any problem (or nothing found); count differences are warnings (a partial copy is legitimate)
unless --strict-counts.
"""
from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from itertools import islice

import numpy as np

from . import DATASETS, build_dataset, canonical_name
from .datasets.copydays import SPLITS as COPYDAYS_SPLITS
from .errors import DatasetError, SampleError, SplitAbsentError

# task names of the probes / analyses -> dataset
TASK_ALIASES = {"knn": "imagenet", "pib": "imagenet", "corloc": "voc", "seg": "custom_seg", "depth": "custom_depth"}
CHECK_SPLITS = {"imagenet": ("train", "val"), "voc": ("train", "val"), "voc07": ("trainval",),
                "voc_aug": ("train", "val"),
                "ade20k": ("train", "val"), "cityscapes": ("train", "val"), "nyuv2": ("train", "test"),
                "sunrgbd": ("test",), "kitti": ("test",), "demo_cls": ("train", "val"),
                "demo_voc": ("train", "val"), "demo_nyu": ("train", "test"),
                "folder": ("train",), "imagefolder": ("train", "val"), "custom_seg": ("train", "val"),
                "custom_depth": ("train", "val"),
                "roxford5k": ("query", "database"), "rparis6k": ("query", "database"),
                "copydays": COPYDAYS_SPLITS, "davis": ("val", "train")}
CUSTOM = ("custom_seg", "custom_depth")  # opened without the up-front validation: every bad file gets listed


def _check_one(ds, rec) -> tuple[str, str] | None:
    try:
        item = ds.load(rec)
    except SampleError as e:
        return e.path or "?", str(e).splitlines()[0]
    except Exception as e:  # anything else is also a bad file, never a crash of the whole walk
        return str(ds.files(rec)[0]), f"{type(e).__name__}: {e}"
    if "depth" in item:
        lo, hi = ds.eval_settings()[:2]  # a depth dataset's protocol (datamodules/depth_protocol.py) or its options
        d = item["depth"].numpy()
        if not np.any((d > lo) & (d < hi)):
            return str(rec["depth"]), (f"{rec['depth']}: no depth value inside ({lo}, {hi}) m (all zero or out of "
                                       "range): wrong scale/encoding or an empty map")
    return None


def check_split(ds, jobs: int, limit: int | None, progress=None) -> tuple[int, list[tuple[str, str]]]:
    records = ds.samples[:limit] if limit else ds.samples
    problems: list[tuple[str, str]] = []
    task = progress.add_task(f"{ds.name}/{ds.split}", total=len(records)) if progress else None
    it = iter(records)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:  # PIL decodes without the GIL
        while chunk := list(islice(it, 256)):
            for res in pool.map(lambda r: _check_one(ds, r), chunk):
                if res:
                    problems.append(res)
            if progress:
                progress.advance(task, len(chunk))
    return len(records), problems


def _parse_args(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m datamodules.check", description=__doc__.split("\n\n")[0])
    p.add_argument("--task", required=False, default="", help=f"dataset: {', '.join(DATASETS)}")
    p.add_argument("--data-root", default="", help="dataset folder (DATA_ROOT); '' for demo_* = data/demo")
    p.add_argument("--split", action="append", help="split(s) to check (default: the standard ones)")
    p.add_argument("--split-file", default=None, help="split list for the depth datasets / VOC")
    p.add_argument("--limit", type=int, default=None, help="check only the first N samples of each split")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="decoding threads")
    p.add_argument("--strict-counts", action="store_true", help="a count different from the official one is an error")
    p.add_argument("--require-all", action="store_true", help="a standard split that is absent is an error")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def _open_split(name: str, split: str, args):
    extra = {"split_file": args.split_file} if args.split_file else {}
    if name in CUSTOM:
        extra["validate"] = False
    if name == "folder":
        extra = {"file_list": args.split_file, "max_corrupt": 1.0}  # a --split-file is the folder's file list
    if name in ("voc", "demo_voc"):
        ds0 = build_dataset(name, args.data_root, split, **extra)
        if (ds0.voc / "Annotations").is_dir():
            extra["boxes"] = True  # parse the box XMLs too
    return build_dataset(name, args.data_root, split, **extra)


def _check_splits(name: str, splits, args, console, progress):
    """-> (table rows, [(split, message)], number of errors)."""
    rows, problems, errors = [], [], 0
    for split in splits:
        try:
            ds = _open_split(name, split, args)
        except DatasetError as e:
            # a split that does not exist may stay a note (a partial copy); one that exists but is refused
            # (what `make probe` would refuse: unpaired files, bad class list, empty folder...) is a problem
            absent = isinstance(e, SplitAbsentError) and not (args.split or args.require_all)
            rows.append((split, "-", _official(name, split) or "-",
                         "[yellow]absent[/yellow]" if absent else "[red]refused[/red]"))
            if absent:
                console.print(f"split {split!r} not checked: {str(e).splitlines()[0]}", style="yellow",
                              markup=False, soft_wrap=True)
            else:
                problems.append((split, str(e)))
                errors += 1
            continue
        n, probs = check_split(ds, args.jobs, args.limit, progress)
        official = _official(name, split, ds)
        status = "[green]ok[/green]" if not probs else f"[red]{len(probs)} bad[/red]"
        if official and len(ds) != official and not args.limit:
            status += " [yellow](count differs from official)[/yellow]"
            if args.strict_counts:
                errors += 1
        note = ""
        if hasattr(ds, "num_without_gt"):
            note = f" ({ds.num_lines} lines, {ds.num_without_gt} without ground truth)"
        elif hasattr(ds, "OFFICIAL_FRAMES"):  # DAVIS: one sample per sequence; its frames counted too
            note = f" sequences, {ds.num_frames} frames (official {ds.OFFICIAL_FRAMES.get(split, '-')})"
        rows.append((split, f"{n}{'' if n == len(ds) else f'/{len(ds)}'}{note}", official or "-", status))
        problems += [(split, f"{path}: {msg}" if not msg.startswith(path) else msg) for path, msg in probs]
        errors += len(probs)
    return rows, problems, errors


def _report(console, title: str, rows, problems, errors: int) -> int:
    from rich.table import Table
    table = Table(title=title)
    for col in ("split", "found", "official", "status"):
        table.add_column(col)
    for r in rows:
        table.add_row(*(str(x) for x in r))
    console.print(table)
    for split, msg in problems:
        console.print(f"{split}: {msg}", markup=False, highlight=False, soft_wrap=True)
    if not [r for r in rows if r[1] != "-"]:
        console.print("nothing to check: no split found", style="red")
        errors = max(errors, 1)
    console.print(f"{'FAILED' if errors else 'OK'}: {errors} problem(s)", style="red" if errors else "green")
    return 1 if errors else 0


def main(argv=None) -> int:
    args = _parse_args(argv)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    console = Console()
    if not args.task:
        console.print(f"[red]--task is required (make check-data TASK=<name>); valid: {', '.join(DATASETS)}[/red]")
        return 2
    try:
        name = canonical_name(TASK_ALIASES.get(args.task, args.task))
    except DatasetError as e:
        console.print(f"[red]{e}[/red]")
        return 2
    splits = args.split or list(CHECK_SPLITS.get(name, ("train", "val")))
    progress = None if args.no_progress else Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
        console=console, transient=True)
    with (progress or nullcontext()):
        rows, problems, errors = _check_splits(name, splits, args, console, progress)
    return _report(console, f"{name} @ {args.data_root or '(demo)'}", rows, problems, errors)


def _official(name: str, split: str, ds=None):
    counts = ds.OFFICIAL_COUNTS if ds is not None else getattr(DATASETS[name], "OFFICIAL_COUNTS", {})
    return counts.get(split)


if __name__ == "__main__":
    sys.exit(main())
