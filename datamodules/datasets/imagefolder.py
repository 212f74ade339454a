"""Your own classification data (``DATA=imagefolder``): torchvision's ImageFolder layout with a train and a val split.

    DATA_ROOT/train/<class>/<image>      DATA_ROOT/val/<class>/<image>

Read by the ImageNet loader (class indices = the sorted class folders of ``train/``); no official counts.
"""
from __future__ import annotations

from .imagenet import ImageNetDataset

LAYOUT = """  train/<class name>/<image>.{jpg,png,...}   (one folder per class)
  val/<class name>/<image>.{jpg,png,...}     (the same class folder names)"""


class ImageFolderDataset(ImageNetDataset):
    name = "imagefolder"
    LAYOUT = LAYOUT
    SOURCE = "your own data (docs/data.md 'Your own data')"
    OFFICIAL_COUNTS: dict[str, int] = {}
