"""Cityscapes fine annotations: 19 train-id classes, everything else 255. Reads ``*_gtFine_labelTrainIds.png``
(cityscapesScripts' createTrainIdLabelImgs, as mmseg expects), else maps ``*_gtFine_labelIds.png`` by the table.
"""
from __future__ import annotations

import numpy as np

from ..errors import LabelRangeError
from .base import (IGNORE_INDEX, BaseDataset, MMSegMeta, check_label_range, check_same_size, image_tensor,
                   load_label, load_rgb, mask_tensor, require_split_dirs)

_LAYOUT = """  leftImg8bit/{train,val}/<city>/<city>_<seq>_<frame>_leftImg8bit.png
  gtFine/{train,val}/<city>/<city>_<seq>_<frame>_gtFine_labelTrainIds.png   (or *_gtFine_labelIds.png)"""
_SOURCE = "https://www.cityscapes-dataset.com/downloads/ (leftImg8bit_trainvaltest.zip, gtFine_trainvaltest.zip)"

# cityscapesScripts/helpers/labels.py: id -> trainId (255 = ignored in evaluation). ids 0..33;
# 'license plate' has id -1 and never appears in labelIds PNGs.
ID_TO_TRAINID = {
    0: 255, 1: 255, 2: 255, 3: 255,                           # unlabeled, ego vehicle, rectification border, out of roi
    4: 255, 5: 255, 6: 255,                                   # static, dynamic, ground
    7: 0, 8: 1, 9: 255, 10: 255,                              # road, sidewalk, parking, rail track
    11: 2, 12: 3, 13: 4, 14: 255, 15: 255, 16: 255,           # building, wall, fence, guard rail, bridge, tunnel
    17: 5, 18: 255, 19: 6, 20: 7,                             # pole, polegroup, traffic light, traffic sign
    21: 8, 22: 9, 23: 10, 24: 11, 25: 12,                     # vegetation, terrain, sky, person, rider
    26: 13, 27: 14, 28: 15, 29: 255, 30: 255,                 # car, truck, bus, caravan, trailer
    31: 16, 32: 17, 33: 18,                                   # train, motorcycle, bicycle
}
_LUT = np.full(256, -1, np.int64)
for _id, _tid in ID_TO_TRAINID.items():
    _LUT[_id] = _tid
_LUT[255] = IGNORE_INDEX


def labelids_to_trainids(ids: np.ndarray, path=None) -> np.ndarray:
    out = _LUT[ids]
    if (out < 0).any():
        bad = np.unique(ids[out < 0])
        raise LabelRangeError(f"{path}: labelIds map holds ids {bad[:10].tolist()} outside the Cityscapes ids "
                              "0-33. Is this a Cityscapes gtFine *_labelIds.png?", str(path))
    return out


class CityscapesDataset(BaseDataset):
    name = "cityscapes"
    LAYOUT, SOURCE = _LAYOUT, _SOURCE
    METAINFO = MMSegMeta("CityscapesDataset")
    SPLITS = ("train", "val", "test")
    OFFICIAL_COUNTS = {"train": 2975, "val": 500, "test": 1525}
    NUM_CLASSES = 19

    def __init__(self, root, split="train", transform=None, skip_corrupt=False):
        super().__init__(root, split, transform, skip_corrupt)
        img_dir, gt_dir = self.root / "leftImg8bit" / split, self.root / "gtFine" / split
        require_split_dirs((img_dir, gt_dir), lambda d: f"dataset '{self.name}': expected folder {d} is missing.\n"
                           f"Expected layout under DATA_ROOT:\n{self.LAYOUT}\nGet it from: {self.SOURCE}")
        for p in sorted(img_dir.glob("*/*_leftImg8bit.png")):
            stem = p.name[: -len("_leftImg8bit.png")]
            train_ids = gt_dir / p.parent.name / f"{stem}_gtFine_labelTrainIds.png"
            ids = gt_dir / p.parent.name / f"{stem}_gtFine_labelIds.png"
            # prefer trainIds; fall back to mapping labelIds; if neither exists load() reports the trainIds path
            if train_ids.is_file() or not ids.is_file():
                self.samples.append({"image": p, "mask": train_ids, "kind": "trainids"})
            else:
                self.samples.append({"image": p, "mask": ids, "kind": "ids"})
        self._finish()

    def load(self, rec: dict) -> dict:
        img = load_rgb(rec["image"])
        raw = load_label(rec["mask"])
        check_same_size(img, raw, rec["image"], rec["mask"], "label map")
        if rec["kind"] == "ids":
            mask = labelids_to_trainids(raw, rec["mask"])
        else:
            check_label_range(raw, self.NUM_CLASSES, rec["mask"])
            mask = raw
        return {"image": image_tensor(img), "mask": mask_tensor(mask), "path": str(rec["image"])}
