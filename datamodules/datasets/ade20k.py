"""ADE20K (SceneParsing, ADEChallengeData2016): 150 classes.
mmseg ``reduce_zero_label``: 0 ('other') -> 255, k -> k-1 (``restore_zero_label`` undoes it for the retrieval
protocol that keeps 'other')."""
from __future__ import annotations

import numpy as np

from .base import (IGNORE_INDEX, BaseDataset, MMSegMeta, check_label_range, check_same_size, image_tensor,
                   load_label, load_rgb, mask_tensor, require_split_dirs)

_LAYOUT = """  ADEChallengeData2016/images/{training,validation}/ADE_*.jpg
  ADEChallengeData2016/annotations/{training,validation}/ADE_*.png   (0 = other, 1-150)"""
_SOURCE = "http://data.csail.mit.edu/places/ADEchallenge/ADEChallengeData2016.zip"


def reduce_zero_label(raw: np.ndarray) -> np.ndarray:
    """mmseg's reduce_zero_label: 0 -> 255, k -> k - 1, and 255 stays 255 (mmseg: 255 -> 254 -> 255)."""
    out = raw.astype(np.int64) - 1
    out[raw == 0] = IGNORE_INDEX
    out[raw == 255] = IGNORE_INDEX
    return out


def restore_zero_label(mask):
    """Inverse of ``reduce_zero_label`` on a loaded mask (tensor or array): 255 -> 0 ('other'), k -> k + 1, the raw
    151 ids that open-hummingbird-eval keeps ('other' a class of its own in the memory, ignored when scoring)."""
    out = mask + 1
    out[mask == IGNORE_INDEX] = 0
    return out


class ADE20KDataset(BaseDataset):
    name = "ade20k"
    LAYOUT, SOURCE = _LAYOUT, _SOURCE
    METAINFO = MMSegMeta("ADE20KDataset")
    SPLITS = ("train", "val", "training", "validation")
    OFFICIAL_COUNTS = {"train": 20210, "val": 2000, "training": 20210, "validation": 2000}
    NUM_CLASSES = 150
    _FOLDER = {"train": "training", "val": "validation", "training": "training", "validation": "validation"}

    def __init__(self, root, split="train", transform=None, skip_corrupt=False):
        super().__init__(root, split, transform, skip_corrupt)
        base = self.root / "ADEChallengeData2016" if (self.root / "ADEChallengeData2016").is_dir() else self.root
        sub = self._FOLDER[split]
        img_dir, ann_dir = base / "images" / sub, base / "annotations" / sub
        require_split_dirs((img_dir, ann_dir), lambda d: f"dataset '{self.name}': expected folder {d} is missing.\n"
                           f"Expected layout under DATA_ROOT:\n{self.LAYOUT}\nGet it from: {self.SOURCE}")
        for p in sorted(img_dir.glob("*.jpg")):
            self.samples.append({"image": p, "mask": ann_dir / f"{p.stem}.png"})
        self._finish()

    def load(self, rec: dict) -> dict:
        img = load_rgb(rec["image"])
        raw = load_label(rec["mask"])
        check_same_size(img, raw, rec["image"], rec["mask"], "annotation")
        # raw ids are 0..150; check before the shift so the message shows the file's own values
        check_label_range(raw, self.NUM_CLASSES + 1, rec["mask"], note=" (raw ADE ids: 0 = other, 1-150)")
        return {"image": image_tensor(img), "mask": mask_tensor(reduce_zero_label(raw)), "path": str(rec["image"])}
