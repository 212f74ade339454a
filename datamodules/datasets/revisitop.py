"""Revisited Oxford and Paris (``roxford5k``, ``rparis6k``) as filipradenovic/revisitop lays them out and its
``configdataset`` reads them: ``<DATA_ROOT>/<name>/jpg/<image>.jpg`` and ``<DATA_ROOT>/<name>/gnd_<name>.pkl``
(``imlist``, ``qimlist``, ``gnd``: per query ``bbx`` and ``easy`` / ``hard`` / ``junk`` indices).

Split ``query`` is the 70 queries, ``database`` the rest. The pickle's schema, index ranges and every listed jpg
are checked when the dataset opens. An item is ``{"image", "path", "index"}``: a query cropped by its box
(``crop_queries=False``: whole, as DINO reads it), then with ``imsize`` shrunk to at most ``imsize`` on its
longer side (PIL ``thumbnail``, Lanczos, as DINO's ``OxfordParisDataset``).
"""
from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, Optional

import numpy as np
from PIL import Image

from ..errors import DatasetError, MissingDataError
from .base import BaseDataset, _open, image_tensor

SOURCE = "https://github.com/filipradenovic/revisitop (python/download.py: download_datasets)"
GND_KEYS = ("imlist", "qimlist", "gnd")
QUERY_KEYS = ("bbx", "easy", "hard", "junk")


def _layout(name: str) -> str:
    return (f"  {name}/gnd_{name}.pkl          (imlist, qimlist, gnd: bbx/easy/hard/junk per query)\n"
            f"  {name}/jpg/<image name>.jpg   (every name of imlist and qimlist)")


def read_gnd(path: Path) -> dict[str, Any]:
    """The ground-truth pickle, its schema checked (keys, one ``gnd`` entry per query, indices in range)."""
    if not path.is_file():
        raise MissingDataError(f"{path} is missing: the revisited ground truth (imlist, qimlist, gnd). "
                               f"Get it with {SOURCE}.")
    try:
        with open(path, "rb") as f:
            cfg = pickle.load(f)
    except Exception as e:  # any unpickling failure is a bad file
        raise DatasetError(f"{path}: cannot be read as a pickle ({type(e).__name__}: {e}). Re-download it "
                           f"({SOURCE}).") from e
    if not isinstance(cfg, dict) or any(k not in cfg for k in GND_KEYS):
        have = sorted(cfg) if isinstance(cfg, dict) else type(cfg).__name__
        raise DatasetError(f"{path}: expected a dict with keys {list(GND_KEYS)}, found {have}. Not a revisitop "
                           f"gnd file ({SOURCE}).")
    n, nq = len(cfg["imlist"]), len(cfg["qimlist"])
    if len(cfg["gnd"]) != nq:
        raise DatasetError(f"{path}: {len(cfg['gnd'])} gnd entries for {nq} queries (qimlist): one per query.")
    for i, g in enumerate(cfg["gnd"]):
        missing = [k for k in QUERY_KEYS if k not in g]
        if missing:
            raise DatasetError(f"{path}: gnd[{i}] (query {cfg['qimlist'][i]}) lacks {missing}; each query needs "
                               f"{list(QUERY_KEYS)}.")
        if len(np.ravel(g["bbx"])) != 4:
            raise DatasetError(f"{path}: gnd[{i}]['bbx'] has {len(np.ravel(g['bbx']))} values, expected 4.")
        for k in ("easy", "hard", "junk"):
            idx = np.asarray(g[k], dtype=np.int64).ravel()
            if idx.size and (idx.min() < 0 or idx.max() >= n):
                raise DatasetError(f"{path}: gnd[{i}]['{k}'] holds index {int(idx.max())} outside the database of "
                                   f"{n} images (imlist): a gnd file of another dataset?")
    return cfg


class RevisitOPDataset(BaseDataset):
    """One split (``query`` or ``database``) of a revisited dataset; ``gnd`` is the pickle's per-query entries."""

    name = "revisitop"
    SOURCE = SOURCE
    SPLITS = ("query", "database")

    def __init__(self, root, split: str = "database", transform=None, skip_corrupt: bool = False,
                 crop_queries: bool = True, imsize: Optional[int] = None):
        self.LAYOUT = _layout(self.name)
        super().__init__(root, split, transform, skip_corrupt)
        base = self.root / self.name
        if not base.is_dir() and (self.root / f"gnd_{self.name}.pkl").is_file():
            base = self.root  # DATA_ROOT given as the dataset's own folder
        cfg = read_gnd(base / f"gnd_{self.name}.pkl")
        self.dir_images = base / "jpg"
        if not self.dir_images.is_dir():
            raise MissingDataError(f"dataset '{self.name}': image folder {self.dir_images} is missing.\n"
                                   f"Expected layout under DATA_ROOT:\n{self.LAYOUT}\nGet it from: {SOURCE}")
        self.imlist, self.qimlist, self.gnd = list(cfg["imlist"]), list(cfg["qimlist"]), list(cfg["gnd"])
        self.crop_queries, self.imsize = crop_queries, imsize
        names = self.qimlist if split == "query" else self.imlist
        self.samples = [{"image": self.dir_images / f"{s}.jpg", "index": i,
                         "bbx": tuple(float(v) for v in np.ravel(self.gnd[i]["bbx"])) if split == "query" else None}
                        for i, s in enumerate(names)]
        self._require_files()
        self._finish()

    def _require_files(self) -> None:
        """Every image of both lists on disk: a partial copy would silently change every query's ground truth."""
        missing = [str(self.dir_images / f"{s}.jpg") for s in self.imlist + self.qimlist
                   if not (self.dir_images / f"{s}.jpg").is_file()]
        if missing:
            raise MissingDataError(f"dataset '{self.name}': {len(missing)} image(s) listed by gnd_{self.name}.pkl "
                                   f"are missing, e.g. {missing[0]}" + (f", {missing[1]}" if len(missing) > 1 else "")
                                   + f". Re-extract the image archive ({SOURCE}).")

    def load(self, record: dict) -> dict:
        img = _open(record["image"], "image").convert("RGB")
        if record["bbx"] is not None and self.crop_queries:
            img = img.crop(record["bbx"])  # revisitop example_process_images.py: the query is its box
        if self.imsize is not None:
            img.thumbnail((self.imsize, self.imsize), Image.LANCZOS)  # DINO OxfordParisDataset
        return {"image": image_tensor(np.asarray(img)), "path": str(record["image"]), "index": record["index"]}


class ROxford5kDataset(RevisitOPDataset):
    name = "roxford5k"
    OFFICIAL_COUNTS = {"query": 70, "database": 4993}


class RParis6kDataset(RevisitOPDataset):
    name = "rparis6k"
    OFFICIAL_COUNTS = {"query": 70, "database": 6322}
