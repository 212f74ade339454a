"""Shared parts of the custom-dataset layouts (``custom_seg``, ``custom_depth``): the root's ``metainfo.yaml``,
pairing ``img_dir/<split>/<name>`` with its target (recursively, as mmseg's ``list_dir_or_file``; unpaired files
refused by name) and a threaded pass over a split's files.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable

from ..errors import DatasetError, EmptyDatasetError, MissingDataError
from .base import require_split_dirs

METAINFO_FILES = ("metainfo.yaml", "metainfo.yml")
SHOW = 5  # file names listed in a refusal


def read_metainfo(root: Path) -> dict[str, Any]:
    """The root's metainfo.yaml as a dict ({} when absent); a malformed file is refused by name."""
    for name in METAINFO_FILES:
        path = Path(root) / name
        if path.is_file():
            import yaml
            try:
                meta = yaml.safe_load(path.read_text()) or {}
            except yaml.YAMLError as e:
                raise DatasetError(f"{path}: not valid YAML ({e}). Fix the file (keys: classes, palette, "
                                   "reduce_zero_label, img_suffix, seg_map_suffix, depth_suffix, depth_scale, "
                                   "min_depth, max_depth, eval_crop).") from e
            if not isinstance(meta, dict):
                raise DatasetError(f"{path}: expected a mapping of options (e.g. 'classes: [road, car]'), got "
                                   f"{type(meta).__name__}.")
            return meta
    return {}


def option(name: str, given: Any, meta: dict, default: Any) -> Any:
    """A dataset option: the keyword argument, else the root's metainfo.yaml, else the default."""
    if given is not None:
        return given
    return meta.get(name, default)


def list_files(folder: Path, suffix: str) -> dict[str, Path]:
    """``{name: path}`` of the files under ``folder`` (recursively) whose name ends with ``suffix``; ``name`` is the
    relative path without the suffix. Hidden files and folders are ignored."""
    out: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        rel = Path(dirpath).relative_to(folder)
        for f in filenames:
            if f.endswith(suffix) and not f.startswith("."):
                out[(rel / f[: len(f) - len(suffix)]).as_posix()] = Path(dirpath) / f
    return dict(sorted(out.items()))


def _suffixes(folder: Path) -> list[str]:
    seen = sorted({p.suffix for p in folder.rglob("*") if p.is_file() and p.suffix})
    return seen[:8]


def pair_files(img_dir: Path, tgt_dir: Path, img_suffix: str, tgt_suffix: str, what: str, layout: str,
               img_opt: str = "img_suffix", tgt_opt: str = "seg_map_suffix") -> list[tuple[Path, Path]]:
    """(image, target) pairs of one split. Refused, naming the files and the fix: a missing folder, no image with
    ``img_suffix``, an image without its target and a target without its image."""
    require_split_dirs((img_dir, tgt_dir), lambda d: f"expected folder {d} is missing.\nExpected layout under "
                       f"DATA_ROOT:\n{layout}")
    images, targets = list_files(img_dir, img_suffix), list_files(tgt_dir, tgt_suffix)
    if not images:
        raise EmptyDatasetError(
            f"no images found: no '*{img_suffix}' file under {img_dir} "
            f"(suffixes present: {_suffixes(img_dir) or 'none'})."
            f" Put the images there, or set {img_opt} (metainfo.yaml '{img_opt}: .png').")
    lonely_img = [images[n] for n in images if n not in targets]
    lonely_tgt = [targets[n] for n in targets if n not in images]
    if lonely_img:
        raise MissingDataError(
            f"{len(lonely_img)} image(s) without their {what} (expected <name>{tgt_suffix} under {tgt_dir}): "
            f"{', '.join(map(str, lonely_img[:SHOW]))}{' ...' if len(lonely_img) > SHOW else ''}. Add the {what}s, "
            f"remove those images, or set {tgt_opt} if the {what}s end differently "
            f"(suffixes present: {_suffixes(tgt_dir) or 'none'}).")
    if lonely_tgt:
        raise MissingDataError(
            f"{len(lonely_tgt)} {what}(s) without their image (expected <name>{img_suffix} under {img_dir}): "
            f"{', '.join(map(str, lonely_tgt[:SHOW]))}{' ...' if len(lonely_tgt) > SHOW else ''}. Add the images, "
            f"remove those {what}s, or set {img_opt} if the images end differently.")
    return [(images[n], targets[n]) for n in images]


def image_size(path: Path) -> tuple[int, int]:
    """(H, W) from the file header (nothing decoded); an unreadable file raises the loaders' CorruptFileError."""
    from PIL import Image, UnidentifiedImageError

    from ..errors import CorruptFileError
    try:
        with Image.open(path) as im:
            return im.size[1], im.size[0]
    except (OSError, UnidentifiedImageError, SyntaxError, ValueError) as e:
        raise CorruptFileError(f"{path}: cannot read the image header ({e}). Re-copy or remove this file.",
                               str(path)) from e


def parallel_map(fn: Callable, items: Iterable, jobs: int | None = None) -> list:
    """``[fn(x) for x in items]`` on threads (PIL and numpy decode without the GIL)."""
    items = list(items)
    with ThreadPoolExecutor(max_workers=max(1, min(jobs or (os.cpu_count() or 1), 16))) as pool:
        return list(pool.map(fn, items))


def split_folders(root: Path, sub: str) -> list[str]:
    """The split names present under ``root/sub`` (e.g. img_dir/{train,val})."""
    base = Path(root) / sub
    return sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
