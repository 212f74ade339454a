"""Images (and boxes) for the analyses, through the DataModule layer the probes use, plus two views:
``eval_crop`` (DINO's Resize + CenterCrop + normalisation; PiB resizes bilinear as LaSt-ViT's ``T.Resize(256)``)
and ``full_res`` (the whole image, zero-padded bottom/right to a multiple of the patch size: LOST).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F

from datamodules.transforms.views import eval_resize as default_resize  # noqa: F401 (analysis.run's default)
from datamodules.transforms.views import eval_view, normalize

from .boxes import ResizeCrop, map_boxes, resize_crop_params

def eval_crop(img: torch.Tensor, resize: int, crop: int,
              interpolation: str = "bicubic") -> tuple[torch.Tensor, ResizeCrop]:
    """uint8 (3, H, W) -> normalised (3, crop, crop) and the geometry that maps boxes the same way.
    ``interpolation="bilinear"``: torchvision's ``Resize(resize)`` default, LaSt-ViT's PiB view (its
    ``visualization/`` scripts); ``bicubic``: DINO's evaluation view (``eval_view``)."""
    H, W = img.shape[-2:]
    if interpolation == "bilinear":
        import torchvision.transforms.functional as TF
        view = TF.resize(img, [int(resize)], interpolation=TF.InterpolationMode.BILINEAR, antialias=True) \
            if min(H, W) != int(resize) else img
        view = TF.center_crop(view, [crop, crop])
    elif interpolation == "bicubic":
        view = eval_view(img, crop, resize)
    else:
        raise ValueError(f"interpolation must be bicubic or bilinear, got {interpolation!r}")
    return normalize(view), resize_crop_params(W, H, resize, crop)


def full_res(img: torch.Tensor, patch_size: int) -> torch.Tensor:
    """uint8 (3, H, W) -> normalised, zero-padded to multiples of ``patch_size`` (LOST pads after normalising)."""
    x = normalize(img)
    H, W = x.shape[-2:]
    return F.pad(x, (0, (-W) % patch_size, 0, (-H) % patch_size))


@dataclass
class Sample:
    index: int
    image: torch.Tensor  # uint8 (3, H, W), untransformed
    boxes: torch.Tensor | None  # (K, 4) xyxy pixel edges of the original image
    path: str


def open_dataset(data: str, data_root: str | None, split: str, boxes: bool, **kw):
    """Split ``split`` of the dataset behind DATA/DATA_ROOT (``datamodules.resolve_data``), items as stored plus
    "index": DATA=demo is the generated demo VOC (with boxes); DATA=folder takes boxes from Annotations/ or
    instances.json when the analysis needs them."""
    from datamodules import resolve_data
    from datamodules.datamodule_base import DataModuleBase

    name, root = resolve_data(data, data_root, "demo_voc")
    opts = dict(kw)
    if boxes and name.startswith(("voc", "demo_voc", "folder")):  # folder: Annotations/*.xml or COCO json
        opts.setdefault("boxes", True)
    if boxes and name == "imagenet":
        opts.setdefault("boxes", "auto")
    dm = DataModuleBase(name, str(root), train_split="", val_split=split, dataset_kwargs=opts)
    dm.setup("validate")
    return dm.val_set


def iter_samples(dataset, max_images: int | None = None) -> Iterator[Sample]:
    n = len(dataset) if not max_images else min(len(dataset), int(max_images))
    for i in range(n):
        item = dataset[i]
        if item is None:  # skip_corrupt datasets may drop a sample
            continue
        b = item.get("boxes")
        yield Sample(i, item["image"], None if b is None else torch.as_tensor(b, dtype=torch.float32).reshape(-1, 4),
                     str(item.get("path", i)))


def crop_boxes(s: Sample, rc: ResizeCrop) -> torch.Tensor:
    return map_boxes(s.boxes, rc) if s.boxes is not None else torch.zeros(0, 4, dtype=torch.float64)
