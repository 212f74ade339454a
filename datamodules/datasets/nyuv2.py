"""NYU Depth v2: mmseg ``NYUDataset`` layout or BTS split files; depth PNG 16-bit millimetres; Eigen test = 654."""
from __future__ import annotations

from pathlib import Path

from .base import MMSegMeta, require_split_dirs
from .depth_base import DepthDataset, read_bts_split

_LAYOUT = """  mmseg layout:  images/{train,test}/<name>.jpg + annotations/{train,test}/<name>.png (16-bit, mm)
  BTS layout:    a split file with lines 'rgb depth focal' (e.g. nyudepthv2_test_files_with_gt.txt),
                 paths relative to the data path (official_splits/test/ for the 654 Eigen test images)"""
_SOURCE = ("mmseg: tools/dataset_converters/nyu.py on BTS' nyu_test.zip/nyu_train.zip "
           "(https://github.com/cleinc/bts, 'Prepare NYU Depth V2 test set'); raw: https://cs.nyu.edu/~fergus/datasets/nyu_depth_v2.html")


class NYUv2Dataset(DepthDataset):
    """split 'train'/'test'. With ``split_file`` (or a BTS list found in the root / root/splits) the BTS layout
    is used, paths joined to ``data_path`` (default: root/official_splits/<split> or root/sync when present,
    else root)."""

    name = "nyuv2"
    LAYOUT, SOURCE = _LAYOUT, _SOURCE
    METAINFO = MMSegMeta("NYUDataset")  # scene categories; depth has no classes
    SPLITS = ("train", "test")
    OFFICIAL_COUNTS = {"test": 654}
    DEPTH_SCALE = 1000.0  # mm, as mmseg's LoadDepthAnnotation(depth_rescale_factor=1e-3)
    BTS_LISTS = {"test": "nyudepthv2_test_files_with_gt.txt", "train": "nyudepthv2_train_files_with_gt.txt"}

    def __init__(self, root, split="test", transform=None, skip_corrupt=False, *, split_file=None, data_path=None):
        super().__init__(root, split, transform, skip_corrupt)
        if split_file is None and not (self.root / "images").is_dir():
            for cand in (self.root / self.BTS_LISTS[split], self.root / "splits" / self.BTS_LISTS[split]):
                if cand.is_file():
                    split_file = cand
        if split_file is not None:
            self.layout = "bts"
            base = Path(data_path) if data_path else self._default_data_path()
            for rgb, depth, focal in read_bts_split(Path(split_file)):
                if depth is not None:
                    self.samples.append({"image": base / rgb, "depth": base / depth, "focal": focal})
        else:
            self.layout = "mmseg"
            img_dir, ann_dir = self.root / "images" / split, self.root / "annotations" / split
            require_split_dirs((img_dir, ann_dir), lambda d: f"dataset '{self.name}': expected folder {d} is "
                               f"missing.\nExpected layout under DATA_ROOT:\n{self.LAYOUT}\nGet it from: {self.SOURCE}")
            for p in sorted(img_dir.glob("*.jpg")):
                self.samples.append({"image": p, "depth": ann_dir / f"{p.stem}.png"})
        self._finish()

    def _default_data_path(self) -> Path:
        for cand in (self.root / "official_splits" / self.split, self.root / ("sync" if self.split == "train" else "")):
            if cand.is_dir():
                return cand
        return self.root
