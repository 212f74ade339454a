"""KITTI depth (Eigen split): raw RGB frames + annotated depth (proj_depth/groundtruth, value / 256 m, 0 = none),
selected by a BTS-format split file ('rgb depth focal'); 'None' depths are skipped (Eigen test: 697 lines, 652 with
ground truth). Image and depth are KB-cropped to 352x1216 on loading, as the toolbox (``kb_crop=False``: no crop).
"""
from __future__ import annotations

from pathlib import Path

from ..depth_protocol import kb_crop_box
from .depth_base import DepthDataset, read_bts_split

_LAYOUT = """  raw/<date>/<date>_drive_<n>_sync/image_0{2,3}/data/<frame>.png        (KITTI raw, data_path)
  depth/{train,val}/<date>_drive_<n>_sync/proj_depth/groundtruth/image_0{2,3}/<frame>.png  (gt_path, 16-bit, /256 m)
  splits/eigen_test_files_with_gt.txt   (BTS: 'rgb depth focal', rgb relative to raw/, depth relative to depth/{train,val}/)"""
_SOURCE = ("https://www.cvlibs.net/datasets/kitti/raw_data.php (raw) and "
           "https://www.cvlibs.net/datasets/kitti/eval_depth.php?benchmark=depth_prediction (data_depth_annotated.zip); "
           "split files: https://github.com/cleinc/bts/tree/master/train_test_inputs")


class KITTIDataset(DepthDataset):
    name = "kitti"
    LAYOUT, SOURCE = _LAYOUT, _SOURCE
    METAINFO = {"classes": (), "depth_scale": 256.0}
    SPLITS = ("test", "train")
    OFFICIAL_COUNTS = {"test": 652}
    DEPTH_SCALE = 256.0
    SPLIT_LISTS = {"test": "eigen_test_files_with_gt.txt", "train": "eigen_train_files_with_gt.txt"}

    def __init__(self, root, split="test", transform=None, skip_corrupt=False, *, split_file=None,
                 data_path=None, gt_path=None, kb_crop: bool = True):
        super().__init__(root, split, transform, skip_corrupt)
        self.kb_crop = kb_crop
        if split_file is None:
            name = self.SPLIT_LISTS[split]
            split_file = next((c for c in (self.root / "splits" / name, self.root / name) if c.is_file()),
                              self.root / "splits" / name)
        data = Path(data_path) if data_path else (self.root / "raw" if (self.root / "raw").is_dir() else self.root)
        gt = Path(gt_path) if gt_path else (self.root / "depth" if (self.root / "depth").is_dir() else self.root)
        lines = read_bts_split(Path(split_file))
        self.num_lines = len(lines)
        self.num_without_gt = 0
        for rgb, depth, focal in lines:
            if depth is None:
                self.num_without_gt += 1
                continue
            self.samples.append({"image": data / rgb, "depth": self._find_gt(gt, depth), "focal": focal})
        self._finish()

    def load(self, rec: dict) -> dict:
        item = super().load(rec)
        if self.kb_crop:
            top, left, h, w = kb_crop_box(*item["image"].shape[-2:])
            item["image"] = item["image"][:, top:top + h, left:left + w]
            item["depth"] = item["depth"][top:top + h, left:left + w]
        return item

    @staticmethod
    def _find_gt(gt: Path, rel: str) -> Path:
        # data_depth_annotated ships train/ and val/ folders; BTS lines are relative to either
        for cand in (gt / rel, gt / "train" / rel, gt / "val" / rel):
            if cand.is_file():
                return cand
        return gt / rel  # load() reports it missing
