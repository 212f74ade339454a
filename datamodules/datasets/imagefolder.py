"""Your own classification data (``DATA=imagefolder``): torchvision's ImageFolder layout,
``DATA_ROOT/{train,val}/<class>/<image>``, read by the ImageNet loader; no official counts.
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
