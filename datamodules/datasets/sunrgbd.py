"""SUN RGB-D depth (evaluation set of 5,050 images) selected by a split list of 'rgb depth' lines. Depth PNGs are
16-bit with the bits rotated by 3 (the toolbox's ``bitor(bitshift(d,-3), bitshift(d,13))``): depth_mm = (d >> 3) |
(d << 13) & 0xFFFF; loading keeps the full range. Evaluation: the toolbox's ``SUNRGBDDataset.pre_eval`` (8 m clip).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .depth_base import DepthDataset, read_bts_split

_LAYOUT = """  SUNRGBD/<sensor>/<...>/<frame>/image/<name>.jpg
  SUNRGBD/<sensor>/<...>/<frame>/depth/<name>.png      (16-bit, 3-bit rotated millimetres)
  SUNRGBD_val_splits.txt   lines 'rgb_path depth_path' relative to DATA_ROOT (5,050 lines)"""
_SOURCE = ("https://rgbd.cs.princeton.edu/data/SUNRGBD.zip; split list as in zhyever/Monocular-Depth-Estimation-Toolbox "
           "(splits/SUNRGBD_val_splits.txt)")


def decode_sunrgbd_depth(raw: np.ndarray) -> np.ndarray:
    """uint16 file values -> metres (float32)."""
    d = raw.astype(np.uint32)
    mm = ((d >> 3) | (d << 13)) & 0xFFFF
    return mm.astype(np.float32) / 1000.0


class SUNRGBDDataset(DepthDataset):
    name = "sunrgbd"
    LAYOUT, SOURCE = _LAYOUT, _SOURCE
    METAINFO = {"classes": (), "depth_scale": 1000.0, "depth_encoding": "3-bit rotated uint16"}
    SPLITS = ("test", "val", "train")
    OFFICIAL_COUNTS = {"test": 5050, "val": 5050}
    SPLIT_LISTS = {"test": "SUNRGBD_val_splits.txt", "val": "SUNRGBD_val_splits.txt",
                   "train": "SUNRGBD_train_splits.txt"}

    def __init__(self, root, split="test", transform=None, skip_corrupt=False, *, split_file=None):
        super().__init__(root, split, transform, skip_corrupt)
        if split_file is None:
            name = self.SPLIT_LISTS[split]
            split_file = next((c for c in (self.root / name, self.root / "splits" / name) if c.is_file()),
                              self.root / name)
        for rgb, depth, focal in read_bts_split(Path(split_file)):
            if depth is not None:
                self.samples.append({"image": self.root / rgb, "depth": self.root / depth, "focal": focal})
        self._finish()

    def decode(self, raw: np.ndarray) -> np.ndarray:
        return decode_sunrgbd_depth(raw)
