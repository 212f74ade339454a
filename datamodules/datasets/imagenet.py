"""ImageNet-1k in ImageFolder layout (train/<wnid>/*, val/<wnid>/*), optional val boxes for Point-in-Box."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from ..errors import MissingDataError, SplitAbsentError
from .base import BaseDataset, image_tensor, load_rgb, require_dir
from .boxes import parse_xml_boxes, read_loc_csv

_LAYOUT = """  train/<wnid>/*.JPEG     (1,281,167 images, 1000 class folders)
  val/<wnid>/*.JPEG       (50,000 images, sorted into class folders, e.g. with valprep.sh)
  optional val boxes: val/<wnid>/<stem>.xml next to each image, a folder of ILSVRC2012_val_*.xml
  (ILSVRC2012_bbox_val_v3.tgz), or LOC_val_solution.csv (Kaggle), matched by file name"""
_SOURCE = "https://image-net.org/download-images (ILSVRC2012) or https://www.kaggle.com/c/imagenet-object-localization-challenge"
IMG_EXT = (".jpeg", ".jpg", ".png", ".bmp", ".webp")


def _scan(folder: Path) -> list[str]:
    with os.scandir(folder) as it:  # scandir: 1.28M files, no per-file stat
        return sorted(e.name for e in it if e.name.lower().endswith(IMG_EXT) and not e.name.startswith("."))


class ImageNetDataset(BaseDataset):
    """ImageFolder dataset; class indices follow the sorted class folders of ``train/`` (train and val agree even
    when a val folder lacks a class). ``boxes``: None, "auto" (LOC_val_solution.csv in the root or XMLs next to
    the images), a .csv path, or a folder of XMLs matched by stem; an image without a box gets (0, 4)."""

    name = "imagenet"
    LAYOUT, SOURCE = _LAYOUT, _SOURCE
    OFFICIAL_COUNTS = {"train": 1281167, "val": 50000}

    def __init__(self, root, split="train", transform=None, skip_corrupt=False, *, boxes=None):
        super().__init__(root, split, transform, skip_corrupt)
        split_dir = self.root / split
        if not split_dir.is_dir():
            have = sorted(p.name for p in self.root.iterdir() if p.is_dir())
            raise SplitAbsentError(
                f"dataset '{self.name}': split folder {split_dir} is missing (found folders: {have}).\n"
                f"Expected layout under DATA_ROOT:\n{self.LAYOUT}\nGet it from: {self.SOURCE}")
        class_root = self.root / "train" if (self.root / "train").is_dir() else split_dir
        self.wnids = sorted(p.name for p in class_root.iterdir() if p.is_dir() and not p.name.startswith("."))
        self.class_to_idx = {c: i for i, c in enumerate(self.wnids)}
        for wnid in sorted(p.name for p in split_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if wnid not in self.class_to_idx:
                raise MissingDataError(f"dataset '{self.name}': class folder {split_dir / wnid} has no "
                                       f"counterpart in {class_root}; train and {split} must use the same wnids.")
            label = self.class_to_idx[wnid]
            # compact (label, file name) records: 1.28M dicts of Paths would cost ~1 GB per DataLoader worker
            self.samples.extend((label, fname) for fname in _scan(split_dir / wnid))
        if not self.samples and _scan(split_dir):
            raise MissingDataError(
                f"dataset '{self.name}': {split_dir} holds images directly, not in <wnid>/ class folders. Sort them "
                "into class folders first (e.g. the widely used valprep.sh for ILSVRC2012 val, or from "
                "LOC_val_solution.csv).")
        self._finish()
        self.split_dir = split_dir
        self.box_index = self._box_index(boxes) if boxes else None

    def image_path(self, rec: tuple[int, str]) -> Path:
        return self.split_dir / self.wnids[rec[0]] / rec[1]

    def files(self, rec) -> list[Path]:
        return [self.image_path(rec)]

    @property
    def classes(self) -> tuple:
        return tuple(self.wnids)

    def _box_index(self, boxes) -> dict:
        """stem -> ("xml", path) or ("csv", (boxes, names))."""
        if boxes == "auto":
            csv_path = self.root / "LOC_val_solution.csv"
            if csv_path.is_file():
                boxes = csv_path
            else:
                index = {}
                for rec in self.samples:
                    xml = self.image_path(rec).with_suffix(".xml")
                    if xml.is_file():
                        index[xml.stem] = ("xml", xml)
                if not index:
                    raise MissingDataError(
                        f"dataset '{self.name}': boxes='auto' found neither {csv_path} nor <stem>.xml files next to "
                        f"the {self.split} images. Pass boxes=<LOC_val_solution.csv or a folder of "
                        "ILSVRC2012_val_*.xml>.")
                return index
        path = Path(boxes)
        if path.is_file():
            return {k: ("csv", v) for k, v in read_loc_csv(path).items()}
        require_dir(path, self.name, self.LAYOUT, self.SOURCE)
        return {p.stem: ("xml", p) for p in path.rglob("*.xml")}

    def load(self, rec: tuple[int, str]) -> dict:
        path = self.image_path(rec)
        img = load_rgb(path)
        item = {"image": image_tensor(img), "label": rec[0], "path": str(path)}
        if self.box_index is not None:
            kind, value = self.box_index.get(path.stem, ("none", None))
            if kind == "xml":
                b, names, _ = parse_xml_boxes(value, one_based=False)
            elif kind == "csv":
                b, names = value[0].copy(), value[1]
            else:
                b, names = np.zeros((0, 4), np.float32), []
            h, w = img.shape[:2]
            b[:, 0::2] = b[:, 0::2].clip(0, w)
            b[:, 1::2] = b[:, 1::2].clip(0, h)
            item["boxes"] = torch.from_numpy(b)
            item["box_labels"] = torch.tensor([self.class_to_idx.get(n, -1) for n in names], dtype=torch.int64)
        return item
