"""Images (and boxes) for the analyses, from the project's dataset loaders, plus the eval transforms.

Two image pipelines:
  * ``eval_crop``: Resize(short side -> resize, bicubic) + CenterCrop(crop) + ImageNet normalisation: the
    LAST-ViT / DINO evaluation view (PiB, PCA, norms, attention); boxes follow through ``analysis.boxes``;
  * ``full_res``: the whole image, normalised, zero-padded bottom/right to a multiple of the patch size (LOST).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F

from datamodules.transforms.views import eval_resize as default_resize  # noqa: F401 (analysis.run's default)
from datamodules.transforms.views import eval_view, normalize

from .boxes import ResizeCrop, map_boxes, resize_crop_params

# which dataset each DATA name opens, and with which loader options
BOX_DATASETS = ("voc", "imagenet", "demo")


def eval_crop(img: torch.Tensor, resize: int, crop: int) -> tuple[torch.Tensor, ResizeCrop]:
    """uint8 (3, H, W) -> normalised (3, crop, crop) and the geometry that maps boxes the same way."""
    H, W = img.shape[-2:]
    return normalize(eval_view(img, crop, resize)), resize_crop_params(W, H, resize, crop)


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
    """The dataset behind DATA/DATA_ROOT. DATA=demo -> the generated demo VOC (with boxes) under data/demo."""
    from datamodules import build_dataset

    if data in ("", None, "demo"):
        from datamodules.demo import ensure_demo_data
        root = ensure_demo_data()
        return build_dataset("demo_voc", root, split, **({"boxes": True} if boxes else {}), **kw)
    if not data_root:
        raise FileNotFoundError(
            f"DATA={data} needs DATA_ROOT=<folder with the {data} dataset> (see docs/data.md for the expected "
            "layout), or use DATA=demo for the built-in generated data.")
    opts = dict(kw)
    if boxes and data.startswith("voc"):
        opts.setdefault("boxes", True)
    if boxes and data == "imagenet":
        opts.setdefault("boxes", "auto")
    return build_dataset(data, data_root, split, **opts)


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
