"""DAVIS-2017 semi-supervised video object segmentation, as DINO's ``eval_video_segmentation.py`` and
davis2017-evaluation read it: one sample per sequence, frames sorted by name, decoded with OpenCV as DINO (the
JPEG decoder matters to the last grey level); annotations are indexed PNGs (0 background, 1..n objects, 255
void), the objects being the ids 1..max of the first annotation (davis2017-evaluation's rule).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import CorruptFileError, LabelRangeError, MissingDataError, SizeMismatchError
from .base import BaseDataset, load_label, read_split_file, require_dir

_LAYOUT = """  JPEGImages/480p/<sequence>/00000.jpg, 00001.jpg, ...
  Annotations/480p/<sequence>/00000.png, 00001.png, ...  (indexed PNG: 0 background, 1..n objects, 255 void)
  ImageSets/2017/{train,val}.txt                          (one sequence name per line)"""
_SOURCE = ("https://davischallenge.org/davis2017/code.html: DAVIS-2017-trainval-480p.zip "
           "(https://data.vision.ee.ethz.ch/csergi/share/davis/DAVIS-2017-trainval-480p.zip)")


def read_frame_bgr(path: Path) -> np.ndarray:
    """(H, W, 3) uint8 BGR, decoded by OpenCV as DINO's ``read_frame``."""
    import cv2  # a dependency of the pinned mmcv-lite / mmengine
    if not Path(path).is_file():
        raise CorruptFileError(f"{path}: frame is missing. Re-extract the DAVIS archive.", str(path))
    img = cv2.imread(str(path))
    if img is None or img.ndim != 3:
        raise CorruptFileError(f"{path}: OpenCV cannot decode this frame (truncated or corrupt JPEG). "
                               "Re-extract it from the DAVIS archive.", str(path))
    return img


class DAVISDataset(BaseDataset):
    """The sequences of ``ImageSets/2017/<split>.txt``; ``load`` decodes and checks a whole sequence:
    {"id", "frames" (T, H, W, 3) uint8 BGR, "masks" (T, H, W) uint8, "num_objects", "frame_paths", "index"}."""

    name = "davis"
    LAYOUT, SOURCE = _LAYOUT, _SOURCE
    SPLITS = ("train", "val")
    OFFICIAL_COUNTS = {"train": 60, "val": 30}      # sequences
    OFFICIAL_FRAMES = {"train": 4209, "val": 1999}  # frames, 480p

    def __init__(self, root, split: str = "val", transform=None, skip_corrupt: bool = False, *,
                 resolution: str = "480p", year: str = "2017"):
        super().__init__(root, split, transform, skip_corrupt)
        frames_dir = require_dir(self.root / "JPEGImages" / resolution, self.name, self.LAYOUT, self.SOURCE)
        masks_dir = require_dir(self.root / "Annotations" / resolution, self.name, self.LAYOUT, self.SOURCE)
        names = read_split_file(self.root / "ImageSets" / year / f"{split}.txt", f"DAVIS {split} sequence list")
        for i, seq in enumerate(names):
            self.samples.append(self._record(seq, frames_dir / seq, masks_dir / seq, i))
        self._finish()

    def _record(self, seq: str, fdir: Path, mdir: Path, index: int) -> dict:
        hint = f"\nExpected layout:\n{self.LAYOUT}\nGet it from: {self.SOURCE}"
        frames = sorted(fdir.glob("*.jpg")) if fdir.is_dir() else []
        if not frames:
            raise MissingDataError(f"DAVIS sequence {seq!r} (listed in ImageSets): no frames in {fdir}.{hint}")
        if not mdir.is_dir():
            raise MissingDataError(f"DAVIS sequence {seq!r}: annotation folder {mdir} is missing.{hint}")
        masks = [mdir / f"{f.stem}.png" for f in frames]
        missing = [m for m in masks if not m.is_file()]
        if missing:
            raise MissingDataError(f"{missing[0]}: annotation missing for frame {fdir / (missing[0].stem + '.jpg')} "
                                   f"({len(missing)} of {len(frames)} frames of {seq!r} lack one).{hint}")
        extra = sorted(set(p.stem for p in mdir.glob("*.png")) - set(f.stem for f in frames))
        if extra:
            raise MissingDataError(f"{mdir / (extra[0] + '.png')}: annotation without a frame "
                                   f"{fdir / (extra[0] + '.jpg')} ({len(extra)} such in {seq!r}): frames and "
                                   f"annotations must pair one to one.{hint}")
        if len(frames) < 3:
            raise MissingDataError(f"DAVIS sequence {seq!r}: {len(frames)} frames in {fdir}; the evaluation scores "
                                   "frames 1..T-2, so a sequence needs at least 3.")
        return {"id": seq, "frames": frames, "masks": masks, "index": index}

    def files(self, record: dict) -> list[Path]:
        return [*record["frames"], *record["masks"]]

    def read_annotation(self, path: Path, shape: tuple[int, int] | None = None) -> np.ndarray:
        """(H, W) uint8 object ids of one annotation (its palette indices), checked against the frame size."""
        mask = load_label(path)
        if shape is not None and mask.shape != shape:
            raise SizeMismatchError(f"{path}: annotation is {mask.shape[1]}x{mask.shape[0]} (WxH) but its frame is "
                                    f"{shape[1]}x{shape[0]}: re-extract both from the same DAVIS archive.", str(path))
        return mask

    def load(self, record: dict) -> dict:
        frames = [read_frame_bgr(p) for p in record["frames"]]
        shape = frames[0].shape[:2]
        for p, f in zip(record["frames"], frames):
            if f.shape[:2] != shape:
                raise SizeMismatchError(f"{p}: frame is {f.shape[1]}x{f.shape[0]} but the sequence's first frame "
                                        f"is {shape[1]}x{shape[0]}.", str(p))
        masks = np.stack([self.read_annotation(p, shape) for p in record["masks"]])
        first = np.where(masks[0] == 255, 0, masks[0])
        n = int(first.max())
        if n == 0:
            raise LabelRangeError(f"{record['masks'][0]}: the first annotation holds no object (all 0/255); the "
                                  "semi-supervised task propagates the objects it shows.", str(record["masks"][0]))
        bad = np.nonzero((masks > n) & (masks != 255))[0]
        if bad.size:
            p = record["masks"][int(bad[0])]
            ids = np.unique(masks[bad[0]][(masks[bad[0]] > n) & (masks[bad[0]] != 255)]).tolist()
            raise LabelRangeError(f"{p}: object ids {ids} beyond the "
                                  f"{n} objects of the first annotation (wrong file or palette?).", str(p))
        return {"id": record["id"], "frames": np.stack(frames), "masks": masks, "num_objects": n,
                "frame_paths": [str(p) for p in record["frames"]], "index": record["index"]}

    @property
    def num_frames(self) -> int:
        return sum(len(r["frames"]) for r in self.samples)
