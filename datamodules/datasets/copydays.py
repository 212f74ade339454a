"""Copydays (https://lear.inrialpes.fr/~jegou/data.php#copydays) as DINO's eval_copy_detection.py reads it:

    <DATA_ROOT>/original/*.jpg            157 originals: the database (and a query block)
    <DATA_ROOT>/strong/*.jpg              229 strong attacks: the reported block
    <DATA_ROOT>/jpegqual/<q>/*.jpg        q in 3 5 8 10 15 20 30 50 75, 157 each (optional)
    <DATA_ROOT>/crops/<p>/*.jpg           p in 10 15 20 30 40 50 60 70 80, 157 each (optional)
    <DATA_ROOT>/whitening/                optional: images the whitening is learned on (DINO: 20k YFCC100M)
    <DATA_ROOT>/distractors/              optional: images added to the database (DINO: 10k YFCC100M)

A split is one block, its files sorted (DINO keeps ``os.listdir`` order for whitening and distractors, which
changes no number). Ground truth, as DINO's ``eval_result``: a ``strong`` image's originals share its first 4
characters; in every other block query i is original i (a block of another size is refused). An item is
``{"image", "path", "index"}``, with ``imsize`` resized to a square, bicubic, as DINO.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import numpy as np
from PIL import Image

from ..errors import DatasetError, MissingDataError, SplitAbsentError
from .base import BaseDataset, _open, image_tensor

QUERY_BLOCKS = (("original", "strong") + tuple(f"jpegqual/{q}" for q in (3, 5, 8, 10, 15, 20, 30, 50, 75))
                + tuple(f"crops/{p}" for p in (10, 15, 20, 30, 40, 50, 60, 70, 80)))
EXTRA = ("whitening", "distractors")
SPLITS = QUERY_BLOCKS + EXTRA  # every block `make check-data` reads (absent optional ones are noted, not errors)
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp")  # DINO is_image_file
LAYOUT = """  original/*.jpg  strong/*.jpg  [jpegqual/<q>/*.jpg]  [crops/<p>/*.jpg]
  optional: whitening/<images> (learns the whitening), distractors/<images> (added to the database)"""
SOURCE = "https://lear.inrialpes.fr/~jegou/data.php#copydays (copydays_original, copydays_strong, ... archives)"


def block_files(folder: Path, any_image: bool) -> list[Path]:
    """The block's files, sorted: ``.jpg`` for Copydays' own blocks, every image extension for the extra sets."""
    names = sorted(os.listdir(folder))
    if any_image:
        return [folder / n for n in names if n.split(".")[-1] in IMAGE_EXTENSIONS and (folder / n).is_file()]
    return [folder / n for n in names if n.endswith(".jpg")]


def strong_positives(originals: list[str], strongs: list[str]) -> list[list[int]]:
    """Per strong image, the originals with the same 4-character file-name prefix (DINO ``eval_result``)."""
    by_prefix: dict[str, list[int]] = {}
    for j, name in enumerate(originals):
        by_prefix.setdefault(name[:4], []).append(j)
    return [by_prefix.get(q[:4], []) for q in strongs]


class CopydaysDataset(BaseDataset):
    name = "copydays"
    LAYOUT = LAYOUT
    SOURCE = SOURCE
    SPLITS = SPLITS
    OFFICIAL_COUNTS = {"original": 157, "strong": 229, **{b: 157 for b in QUERY_BLOCKS[2:]}}

    def __init__(self, root, split: str = "original", transform=None, skip_corrupt: bool = False,
                 imsize: Optional[int] = None, whitening_root=None, distractors_root=None):
        super().__init__(root, split, transform, skip_corrupt)
        self.imsize = imsize
        extra = {"whitening": whitening_root, "distractors": distractors_root}
        self.folder = Path(extra[split]).expanduser() if extra.get(split) else self.root / split
        self.original_files = self._files(self.root / "original", "original", any_image=False)
        files = self._files(self.folder, split, any_image=split in EXTRA,
                            explicit=extra.get(split) is not None)
        self._validate(files)
        self.samples = [{"image": p, "index": i} for i, p in enumerate(files)]
        self._finish()

    def _files(self, folder: Path, split: str, any_image: bool, explicit: bool = False) -> list[Path]:
        if not folder.is_dir():
            err = MissingDataError if split == "original" or explicit else SplitAbsentError
            raise err(f"dataset 'copydays': folder {folder} (block '{split}') is missing.\n"
                      f"Expected layout under DATA_ROOT:\n{LAYOUT}\nGet it from: {SOURCE}")
        files = block_files(folder, any_image)
        if not files:
            raise DatasetError(f"dataset 'copydays': {folder} holds no {'image' if any_image else '.jpg'} file. "
                               f"Expected layout:\n{LAYOUT}")
        return files

    def _validate(self, files: list[Path]) -> None:
        """The ground truth must be well defined: every strong image has an original, every other block is 1:1."""
        if self.split == "strong":
            orig = [p.name for p in self.original_files]
            for p, pos in zip(files, strong_positives(orig, [p.name for p in files])):
                if not pos:
                    raise DatasetError(f"{p}: no original shares its 4-character prefix {p.name[:4]!r} in "
                                       f"{self.root / 'original'}: a strong attack whose original is missing, or a "
                                       "renamed file (DINO's ground truth matches the first 4 characters).")
        elif self.split not in EXTRA and self.split != "original" and len(files) != len(self.original_files):
            raise DatasetError(f"{self.folder}: {len(files)} images but original/ has {len(self.original_files)}; "
                               "query i of this block is original i, so the counts must agree (a partial copy?).")

    def positives(self) -> list[list[int]]:
        """Per query of this block, the indices of its originals in ``original`` (the database's first rows)."""
        if self.split in EXTRA:
            raise ValueError(f"block '{self.split}' is not a query block")
        if self.split == "strong":
            return strong_positives([p.name for p in self.original_files], [r["image"].name for r in self.samples])
        return [[i] for i in range(len(self.samples))]

    def load(self, record: dict) -> dict:
        img = _open(record["image"], "image").convert("RGB")
        if self.imsize is not None:
            img = img.resize((self.imsize, self.imsize), Image.BICUBIC)  # torchvision Resize on a PIL image
        return {"image": image_tensor(np.asarray(img)), "path": str(record["image"]), "index": record["index"]}
