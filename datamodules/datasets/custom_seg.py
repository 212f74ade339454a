"""Your own segmentation data in mmsegmentation's custom-dataset layout (``DATA=custom_seg``; layout and
options: docs/data.md). Options come from keyword arguments, else ``metainfo.yaml`` in the root, else the
defaults. Opening a split checks every pair before any work starts (``validate``); ``make check-data
TASK=custom_seg`` lists every problem instead of stopping at the first.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from ..errors import DatasetError, LabelRangeError, MissingDataError, SizeMismatchError
from .ade20k import reduce_zero_label as _reduce
from .base import (IGNORE_INDEX, BaseDataset, check_label_range, check_same_size, image_tensor, load_label,
                   load_rgb, mask_tensor)
from .custom_base import SHOW, image_size, option, pair_files, parallel_map, read_metainfo, split_folders

LAYOUT = """  img_dir/{train,val}/<name>.jpg     (img_suffix)
  ann_dir/{train,val}/<name>.png     (seg_map_suffix; class ids 0..K-1, 255 = ignore; palette or grayscale PNG)
  classes.txt                        (K lines, one class name each) or metainfo.yaml with 'classes: [...]'"""


def read_classes(root: Path, meta: dict) -> tuple[list[str], str]:
    """(class names, the file they came from): metainfo.yaml's ``classes``, else classes.txt."""
    if meta.get("classes"):
        return [str(c) for c in meta["classes"]], str(next(p for p in (root / "metainfo.yaml", root / "metainfo.yml")
                                                        if p.is_file()))
    txt = root / "classes.txt"
    if txt.is_file():
        names = [ln.strip() for ln in txt.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
        if names:
            return names, str(txt)
    raise MissingDataError(f"dataset 'custom_seg': no class list under {root}. Write {txt} with one class name per "
                           "line (line k names label id k), or metainfo.yaml with 'classes: [name0, name1, ...]'.")


def _scan_pair(pair: tuple[Path, Path], reduce: bool) -> tuple[tuple[int, int], tuple[int, int], np.ndarray]:
    """(image (H, W) from its header, label (H, W), label values after the reduction)."""
    img, ann = pair
    raw = load_label(ann)
    values = np.unique(raw)
    if reduce:
        values = np.unique(_reduce(values))
    return image_size(img), raw.shape[:2], values


@lru_cache(maxsize=16)
def label_stats(pairs: tuple[tuple[Path, Path], ...], reduce: bool) -> tuple:
    """Per pair: image size, label size and label values (decoded once per process for every split opened)."""
    return tuple(parallel_map(lambda p: _scan_pair(p, reduce), pairs))


class CustomSegDataset(BaseDataset):
    name = "custom_seg"
    LAYOUT = LAYOUT
    SOURCE = "your own data (mmsegmentation's custom dataset layout, docs/data.md 'Your own data')"

    def __init__(self, root, split="train", transform=None, skip_corrupt=False, *, img_suffix=None,
                 seg_map_suffix=None, reduce_zero_label=None, classes=None, palette=None, strict_classes=None,
                 validate=True):
        super().__init__(root, split, transform, skip_corrupt)
        meta = read_metainfo(self.root)
        self.img_suffix = option("img_suffix", img_suffix, meta, ".jpg")
        self.seg_map_suffix = option("seg_map_suffix", seg_map_suffix, meta, ".png")
        self.reduce_zero_label = bool(option("reduce_zero_label", reduce_zero_label, meta, False))
        self.strict_classes = bool(option("strict_classes", strict_classes, meta, True))
        if classes is not None:
            names, self.classes_file = list(classes), "the classes option"
        else:
            names, self.classes_file = read_classes(self.root, meta)
        pal = option("palette", palette, meta, None)
        self.METAINFO = {"classes": tuple(names), **({"palette": tuple(tuple(c) for c in pal)} if pal else {})}
        self.NUM_CLASSES = len(names)
        if self.reduce_zero_label and self.NUM_CLASSES > 254:
            raise DatasetError(f"{self.classes_file}: {self.NUM_CLASSES} classes do not fit 8-bit label ids")
        for rec in self._pairs(split):
            self.samples.append({"image": rec[0], "mask": rec[1]})
        self._finish()
        if validate:
            self.validate()

    def _pairs(self, split: str) -> list[tuple[Path, Path]]:
        return pair_files(self.root / "img_dir" / split, self.root / "ann_dir" / split, self.img_suffix,
                          self.seg_map_suffix, "label map", self.LAYOUT)

    def validate(self) -> None:
        """Refuse, naming the file and the fix: image/label size mismatch, label values outside the classes,
        and a class list whose length differs from the ids the labels use (every split present is read)."""
        stats = {s: (self._pairs(s) if s != self.split else [(r["image"], r["mask"]) for r in self.samples])
                 for s in sorted(set(split_folders(self.root, "ann_dir")) | {self.split})}
        per_split = {s: label_stats(tuple(p), self.reduce_zero_label) for s, p in stats.items()}
        for (img, ann), (ihw, lhw, _) in zip(stats[self.split], per_split[self.split]):
            if ihw != lhw:
                raise SizeMismatchError(f"{ann}: label map is {lhw[1]}x{lhw[0]} (WxH) but its image {img} is "
                                        f"{ihw[1]}x{ihw[0]}. Image and label must be pixel-aligned: re-export the "
                                        "label at the image's size, or pair the right files.", str(ann))
        used = set()
        for vals in per_split.values():
            for _, _, v in vals:
                used.update(int(x) for x in v if x != IGNORE_INDEX)
        K = self.NUM_CLASSES
        bad = [(ann, v[(v >= K) & (v != IGNORE_INDEX)]) for s in stats
               for (_, ann), (_, _, v) in zip(stats[s], per_split[s])]
        bad = [(a, v) for a, v in bad if v.size]
        if bad:
            if used == set(range(K + 1)):
                raise DatasetError(
                    f"{self.classes_file} lists {K} classes but the labels use {K + 1} ids 0..{K} (e.g. {bad[0][0]}"
                    f" holds {int(bad[0][1].max())}). Add the missing name (often 'background' for id 0), or set "
                    "reduce_zero_label: true if id 0 means 'ignore'.")
            ann, v = bad[0]
            raise LabelRangeError(
                f"{ann}: label map holds values {v[:10].tolist()} outside the {K} classes of {self.classes_file} "
                f"(ids 0..{K - 1}, 255 = ignore{'; after reduce_zero_label' if self.reduce_zero_label else ''}); "
                f"{len(bad)} label file(s) do: "
                f"{', '.join(str(a) for a, _ in bad[:SHOW])}. Add the classes to the list, or map those pixels "
                "to 255.", str(ann))
        if self.strict_classes and K > 1 and used == set(range(K - 1)):
            raise DatasetError(
                f"{self.classes_file} lists {K} classes but the labels of every split use only ids 0..{K - 2} "
                f"({K - 1} classes; '{self.classes[-1]}' never occurs). Remove the extra name (a header line?), or "
                "set reduce_zero_label: false/true to match how id 0 is used; if the last class is truly absent, "
                "set strict_classes: false in metainfo.yaml.")

    def load(self, rec: dict) -> dict:
        img = load_rgb(rec["image"])
        raw = load_label(rec["mask"])
        check_same_size(img, raw, rec["image"], rec["mask"], "label map")
        mask = _reduce(raw) if self.reduce_zero_label else raw
        check_label_range(mask, self.NUM_CLASSES, rec["mask"], note=f" (classes of {self.classes_file})")
        return {"image": image_tensor(img), "mask": mask_tensor(mask), "path": str(rec["image"])}
