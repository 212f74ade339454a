"""Shared pieces of every dataset: strict file decoding, split files, skip-corrupt bookkeeping. An item (no
transform) holds whichever of these the dataset has: "image" uint8 (3, H, W) RGB, "mask" int64 (H, W) (ignore
255), "depth" float32 (H, W) metres (0 = unknown), "boxes" float32 (K, 4) xyxy 0-based pixel edges, "box_labels"
int64 (K,), "label" int, "path" str.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from PIL import Image, ImageFile, UnidentifiedImageError
from torch.utils.data import Dataset

from ..errors import (CorruptFileError, DepthFormatError, EmptyDatasetError, LabelRangeError,
                     MissingDataError, MissingSplitFileError, SampleError, SizeMismatchError, SplitAbsentError,
                     SplitFileError)

log = logging.getLogger(__name__)

IGNORE_INDEX = 255
Transform = Callable[[dict], dict]


# --------------------------------------------------------------------------- roots and split files

def resolve_root(root: str | os.PathLike | None, name: str, layout: str, source: str) -> Path:
    """The dataset root as a Path; '' / None / a missing folder -> MissingDataError that says what to put where."""
    hint = f"Expected layout under DATA_ROOT:\n{layout}\nGet it from: {source} (tokenmix never downloads data)."
    if root is None or str(root).strip() == "":
        raise MissingDataError(
            f"DATA_ROOT is not set for dataset '{name}'. Pass --data-root / DATA_ROOT=<folder>, "
            f"or use DATA=demo for the built-in generated data.\n{hint}")
    path = Path(root).expanduser()
    if not path.is_dir():
        raise MissingDataError(f"dataset '{name}': DATA_ROOT {path} does not exist or is not a folder.\n{hint}")
    return path


def require_split_dirs(dirs, message) -> None:
    """A split's folders (images, targets): none there -> ``SplitAbsentError`` (the split is absent), some there ->
    ``MissingDataError`` (the split is broken); ``message(first missing folder)`` says what to put where."""
    missing = [d for d in dirs if not Path(d).is_dir()]
    if missing:
        raise (SplitAbsentError if len(missing) == len(dirs) else MissingDataError)(message(missing[0]))


def require_dir(path: Path, name: str, layout: str, source: str) -> Path:
    if not path.is_dir():
        raise MissingDataError(
            f"dataset '{name}': expected folder {path} is missing.\nExpected layout:\n{layout}\nGet it from: {source}")
    return path


def read_split_file(path: Path, what: str = "split list") -> list[str]:
    """Non-empty, non-comment lines of a split file; missing or empty file -> SplitFileError."""
    if not path.is_file():
        raise MissingSplitFileError(
            f"{what} {path} is missing. It lists the samples of this split, one per line; "
            "restore it from the dataset archive or pass split_file=<path>.")
    lines = [ln.strip() for ln in path.read_text().splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    if not lines:
        raise SplitFileError(f"{what} {path} is empty: expected one sample per line. "
                             "Restore it from the dataset archive (a truncated copy?).")
    return lines


# --------------------------------------------------------------------------- strict decoding

def _open(path: Path, what: str) -> Image.Image:
    if not Path(path).is_file():
        raise CorruptFileError(f"{path}: {what} file is missing (listed by the split but not on disk). "
                               "Re-extract the dataset archive, or pass skip_corrupt=True to skip it.", str(path))
    try:
        img = Image.open(path)
        img.load()  # decode now: a truncated file raises here, not later inside a transform
    except (OSError, SyntaxError, ValueError, UnidentifiedImageError, Image.DecompressionBombError) as e:
        raise CorruptFileError(
            f"{path}: cannot decode {what} (truncated or corrupt file: {e}). Re-download/re-extract this file, "
            "or pass skip_corrupt=True to skip corrupt samples.", str(path)) from e
    return img


if ImageFile.LOAD_TRUNCATED_IMAGES:  # someone turned on PIL's silent zero-filling; we want the error
    log.warning("PIL ImageFile.LOAD_TRUNCATED_IMAGES is True: truncated images will decode as grey, not raise")


def load_rgb(path: Path) -> np.ndarray:
    """(H, W, 3) uint8 RGB; grayscale / CMYK JPEGs (a few in ImageNet) are converted."""
    img = _open(path, "image")
    return np.asarray(img.convert("RGB"))


def load_label(path: Path) -> np.ndarray:
    """(H, W) uint8 class indices from an 8-bit palette ('P') or grayscale ('L') PNG, read as stored."""
    img = _open(path, "label map")
    if img.mode not in ("P", "L"):
        raise CorruptFileError(
            f"{path}: label map has PIL mode '{img.mode}', expected an 8-bit single-channel PNG of class indices "
            "(mode 'P' with a palette, or 'L'). An RGB colour-coded mask must first be converted to indices "
            "(e.g. mmseg's dataset converters).", str(path))
    # np.asarray of a 'P' image gives the palette indices, i.e. the class ids, not the colours
    return np.asarray(img)


def load_depth_u16(path: Path) -> np.ndarray:
    """(H, W) uint16 raw values of a 16-bit PNG; an 8-bit or RGB file is rejected (it would mean wrong metres)."""
    img = _open(path, "depth map")
    if img.mode in ("I;16", "I;16L", "I;16B"):
        return np.asarray(img).astype(np.uint16)
    if img.mode == "I":  # older Pillow opens 16-bit PNGs as 32-bit 'I'
        arr = np.asarray(img)
        if arr.min() >= 0 and arr.max() <= 65535:
            return arr.astype(np.uint16)
    raise DepthFormatError(
        f"{path}: depth map has PIL mode '{img.mode}' ({'8-bit' if img.mode in ('L', 'P') else 'not 16-bit'}), "
        "expected a 16-bit single-channel PNG (mode 'I;16'). An 8-bit copy has lost the depth resolution: "
        "re-extract the original 16-bit file from the dataset archive.", str(path))


def check_label_range(mask: np.ndarray, num_classes: int, path: Path, note: str = "") -> None:
    bad = np.unique(mask[(mask >= num_classes) & (mask != IGNORE_INDEX)])
    if bad.size:
        raise LabelRangeError(
            f"{path}: label map holds class ids {bad[:10].tolist()}{'...' if bad.size > 10 else ''} outside "
            f"[0, {num_classes - 1}] (ignore = {IGNORE_INDEX}){note}. Wrong label file for this dataset "
            "(e.g. labelIds instead of labelTrainIds, or a not-reduced ADE map)?", str(path))


def check_same_size(image: np.ndarray, other: np.ndarray, image_path: Path, other_path: Path, what: str) -> None:
    if image.shape[:2] != other.shape[:2]:
        raise SizeMismatchError(
            f"{other_path}: {what} is {other.shape[1]}x{other.shape[0]} (WxH) but its image {image_path} is "
            f"{image.shape[1]}x{image.shape[0]}. They must be pixel-aligned: the pair is mismatched or one file was "
            "resized; re-extract both from the dataset archive.", str(other_path))


def image_tensor(arr: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1)))


def mask_tensor(arr: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(arr.astype(np.int64))


# --------------------------------------------------------------------------- base dataset

class MMSegMeta:
    """Class attribute resolving to an mmseg dataset's METAINFO on first use (mmseg import costs seconds)."""

    def __init__(self, mmseg_class: str):
        self.mmseg_class = mmseg_class
        self._value: dict | None = None

    def __get__(self, obj, owner) -> dict:
        if self._value is None:
            from tokenmix.mmseg_compat import import_mmseg
            mmseg = import_mmseg()
            meta = getattr(mmseg.datasets, self.mmseg_class).METAINFO
            self._value = {k: tuple(tuple(x) if isinstance(x, list) else x for x in v) for k, v in meta.items()}
        return self._value


class BaseDataset(Dataset):
    """A list of sample records (``self.samples``, filled by subclasses) plus ``load(record) -> item``. A per-sample
    ``SampleError`` is raised, or with ``skip_corrupt=True`` logged, recorded in ``skipped`` (path -> reason; per
    DataLoader worker) and the next sample returned (``python -m datamodules.check`` lists them all)."""

    name = "base"
    LAYOUT = ""
    SOURCE = ""
    OFFICIAL_COUNTS: dict[str, int] = {}
    SPLITS: Sequence[str] = ()
    METAINFO: Any = {}

    def __init__(self, root, split: str, transform: Transform | None = None, skip_corrupt: bool = False):
        self.root = resolve_root(root, self.name, self.LAYOUT, self.SOURCE)
        if self.SPLITS and split not in self.SPLITS:
            raise ValueError(f"dataset '{self.name}': unknown split '{split}', valid: {list(self.SPLITS)}")
        self.split = split
        self.transform = transform
        self.skip_corrupt = skip_corrupt
        self.samples: list[dict] = []
        self.skipped: dict[str, str] = {}  # path -> reason; a file skipped again (next epoch) counts once

    # subclasses --------------------------------------------------------
    def load(self, record: dict) -> dict:
        raise NotImplementedError

    def files(self, record: dict) -> list[Path]:
        """Files a sample reads (for the checker)."""
        return [v for k, v in record.items() if isinstance(v, Path)]

    # common ------------------------------------------------------------
    def _finish(self) -> None:
        if not self.samples:
            raise EmptyDatasetError(
                f"dataset '{self.name}' split '{self.split}' under {self.root} has no samples. "
                f"Expected layout:\n{self.LAYOUT}\nCheck DATA_ROOT and the split name.")

    @property
    def num_skipped(self) -> int:
        return len(self.skipped)

    @property
    def classes(self) -> tuple:
        return tuple(self.METAINFO.get("classes", ()))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict:
        n = len(self.samples)
        for k in range(n):
            record = self.samples[(index + k) % n]
            try:
                item = self.load(record)
                break
            except SampleError as e:
                if not self.skip_corrupt:
                    raise
                if (e.path or "?") not in self.skipped:
                    self.skipped[e.path or "?"] = str(e).splitlines()[0]
                    log.warning("skipping corrupt sample (%d so far): %s", self.num_skipped, str(e).splitlines()[0])
        else:
            raise EmptyDatasetError(f"dataset '{self.name}' split '{self.split}' under {self.root}: "
                                    f"every one of its {n} samples is corrupt (skip_corrupt=True skipped them all).")
        return self.transform(item) if self.transform is not None else item

    def __repr__(self) -> str:
        return f"{type(self).__name__}(root={str(self.root)!r}, split={self.split!r}, n={len(self)})"
