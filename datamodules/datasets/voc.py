"""PASCAL VOC 2012 segmentation (+ SBD aug train), VOC detection boxes, and VOC 2007 (``voc07``: CorLoc's VOC07).

Class names / palette: mmseg ``PascalVOCDataset.METAINFO`` (21 classes incl. background, ignore 255).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..errors import CorruptFileError, MissingDataError
from .base import (BaseDataset, MMSegMeta, check_label_range, check_same_size, image_tensor, load_label,
                   load_rgb, mask_tensor, read_split_file, require_dir)
from .boxes import parse_xml_boxes

_LAYOUT = """  VOCdevkit/VOC2012/JPEGImages/<id>.jpg
  VOCdevkit/VOC2012/SegmentationClass/<id>.png        (palette PNG, 0-20 + 255)
  VOCdevkit/VOC2012/ImageSets/Segmentation/{train,val,trainval}.txt
  VOCdevkit/VOC2012/Annotations/<id>.xml              (boxes, optional)
  voc_aug only: VOCdevkit/VOC2012/SegmentationClassAug/<id>.png + ImageSets/Segmentation/train_aug.txt (10,582 ids)"""
_SOURCE = ("http://host.robots.ox.ac.uk/pascal/VOC/voc2012/VOCtrainval_11-May-2012.tar; SBD aug masks: "
           "https://www.dropbox.com/s/oeu149j8qtbs1x0/SegmentationClassAug.zip (see mmseg docs 'dataset_prepare')")


def find_voc_dir(root: Path, year: str, name: str) -> Path:
    """Accept DATA_ROOT = folder holding VOCdevkit, VOCdevkit itself, or VOC<year> itself."""
    for cand in (root / "VOCdevkit" / f"VOC{year}", root / f"VOC{year}", root):
        if (cand / "JPEGImages").is_dir():
            return cand
    raise MissingDataError(f"dataset '{name}': no VOCdevkit/VOC{year}/JPEGImages under {root}.\n"
                           f"Expected layout:\n{_LAYOUT}\nGet it from: {_SOURCE}")


class VOCDataset(BaseDataset):
    """VOC segmentation split (``image_set='Segmentation'``) or detection split (``image_set='Main'``, boxes only);
    boxes=True adds "boxes"/"box_labels"/"box_difficult" from Annotations/<id>.xml."""

    name = "voc"
    LAYOUT, SOURCE = _LAYOUT, _SOURCE
    METAINFO = MMSegMeta("PascalVOCDataset")
    SPLITS = ("train", "val", "trainval", "test")
    OFFICIAL_COUNTS = {"train": 1464, "val": 1449, "trainval": 2913}
    MAIN_COUNTS = {("2007", "trainval"): 5011, ("2007", "test"): 4952, ("2012", "trainval"): 11540}
    SEG_COUNTS_2007 = {"train": 209, "val": 213, "trainval": 422, "test": 210}
    NUM_CLASSES = 21
    mask_dir = "SegmentationClass"

    def __init__(self, root, split="train", transform=None, skip_corrupt=False, *, year="2012",
                 image_set="Segmentation", boxes=False, split_file=None):
        super().__init__(root, split, transform, skip_corrupt)
        if image_set not in ("Segmentation", "Main"):
            raise ValueError(f"VOC image_set must be 'Segmentation' or 'Main', got {image_set!r}")
        self.year, self.image_set = str(year), image_set
        self.with_masks = image_set == "Segmentation"
        self.with_boxes = boxes or not self.with_masks
        self.voc = find_voc_dir(self.root, self.year, self.name)
        if image_set == "Main":
            self.OFFICIAL_COUNTS = {split: self.MAIN_COUNTS.get((self.year, split), -1)}
        elif self.year == "2007":
            self.OFFICIAL_COUNTS = self.SEG_COUNTS_2007
        ids = self._ids(Path(split_file) if split_file else None)
        jpg = require_dir(self.voc / "JPEGImages", self.name, self.LAYOUT, self.SOURCE)
        mdir = self.voc / self._mask_dir()
        if self.with_masks:
            require_dir(mdir, self.name, self.LAYOUT, self.SOURCE)
        if self.with_boxes:
            require_dir(self.voc / "Annotations", self.name, self.LAYOUT, self.SOURCE)
        for i in ids:
            rec = {"id": i, "image": jpg / f"{i}.jpg"}
            if self.with_masks:
                rec["mask"] = mdir / f"{i}.png"
            if self.with_boxes:
                rec["xml"] = self.voc / "Annotations" / f"{i}.xml"
            self.samples.append(rec)
        self._finish()

    def _mask_dir(self) -> str:
        return self.mask_dir

    def _split_file(self) -> Path:
        return self.voc / "ImageSets" / self.image_set / f"{self.split}.txt"

    def _ids(self, split_file: Path | None) -> list[str]:
        lines = read_split_file(split_file or self._split_file(), f"VOC {self.image_set} split list")
        # DeepLab-style lists hold "/JPEGImages/<id>.jpg /SegmentationClassAug/<id>.png"; plain lists hold "<id>"
        return [Path(ln.split()[0]).stem for ln in lines]

    @property
    def classes(self) -> tuple:
        return self.METAINFO["classes"]

    def load(self, rec: dict) -> dict:
        img = load_rgb(rec["image"])
        item = {"image": image_tensor(img), "path": str(rec["image"])}
        if self.with_masks:
            mask = load_label(rec["mask"])
            check_same_size(img, mask, rec["image"], rec["mask"], "mask")
            check_label_range(mask, self.NUM_CLASSES, rec["mask"])
            item["mask"] = mask_tensor(mask)
        if self.with_boxes:
            boxes, names, difficult = parse_xml_boxes(rec["xml"], one_based=True)
            index = {c: k for k, c in enumerate(self.classes)}
            unknown = sorted(set(names) - set(index))
            if unknown:
                raise CorruptFileError(f"{rec['xml']}: unknown VOC class names {unknown}; expected one of "
                                       f"{list(self.classes[1:])}.", str(rec["xml"]))
            h, w = img.shape[:2]
            boxes[:, 0::2] = boxes[:, 0::2].clip(0, w)
            boxes[:, 1::2] = boxes[:, 1::2].clip(0, h)
            item["boxes"] = torch.from_numpy(boxes)
            item["box_labels"] = torch.tensor([index[n] for n in names], dtype=torch.int64)
            item["box_difficult"] = torch.from_numpy(difficult)
        return item


class VOC07Dataset(VOCDataset):
    """PASCAL VOC 2007 (``VOCdevkit/VOC2007``): LOST's CorLoc benchmark is VOC07 trainval, 5,011 images
    (``image_set='Main'``, selected by ``make analyze TASK=corloc DATA=voc07``)."""

    name = "voc07"
    OFFICIAL_COUNTS = VOCDataset.SEG_COUNTS_2007

    def __init__(self, root, split="trainval", transform=None, skip_corrupt=False, *, year="2007", **kw):
        super().__init__(root, split, transform, skip_corrupt, year=year, **kw)


class VOCAugDataset(VOCDataset):
    """VOC 2012 + SBD: 'train' = the 10,582 train_aug ids with SegmentationClassAug masks, 'val' = the 1,449
    official val images with SegmentationClass masks (as mmseg's voc12aug config)."""

    name = "voc_aug"
    SPLITS = ("train", "val")
    OFFICIAL_COUNTS = {"train": 10582, "val": 1449}
    AUG_LISTS = ("ImageSets/Segmentation/train_aug.txt", "ImageSets/Segmentation/aug.txt",
                 "ImageSets/SegmentationAug/train_aug.txt")

    def _mask_dir(self) -> str:
        return "SegmentationClassAug" if self.split == "train" else "SegmentationClass"

    def _split_file(self) -> Path:
        if self.split != "train":
            return super()._split_file()
        for rel in self.AUG_LISTS:
            if (self.voc / rel).is_file():
                return self.voc / rel
        return self.voc / self.AUG_LISTS[0]  # read_split_file reports it missing
