"""One descriptor per image, for the image-level evaluations (revisited Oxford/Paris retrieval, Copydays copy
detection): ``extract_descriptors(backbone, dataset, describe, batch_size, how)``.

``describe(backbone, images)`` turns a uint8 batch (B, 3, H, W) into (B, D) rows. With ``how.launch`` the dataset is
sharded over its processes by the probes' one sharded extraction (``probes.core.features.sharded_predict``) and the
rows come back in dataset order on every process; without it, one loop in this process. Images of different sizes
go in batches of 1.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

from tokenmix.cli import Launch

from probes.core.features import sharded_predict

Describe = Callable[[nn.Module, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Extraction:
    """How descriptors are computed: sharded over the processes of ``launch``, or (None) in this process on
    ``device``."""
    launch: Optional[Launch] = None
    device: str = "cpu"
    num_workers: int = 0
    progress: bool = False


def patch_multiple(x: torch.Tensor, backbone: nn.Module) -> torch.Tensor:
    """``x`` cut to whole patches at the bottom and right: what DINO's stride-p patch convolution reads of an image
    whose sides are not multiples of p (our timm patch embedding refuses such sizes instead)."""
    p = int(getattr(backbone, "patch_size", 1))
    return x[..., : x.shape[-2] // p * p, : x.shape[-1] // p * p]


def stack_images(items: list[dict]) -> dict[str, torch.Tensor]:
    return {"image": torch.stack([it["image"] for it in items]),
            "index": torch.tensor([int(it["index"]) for it in items])}


def _local_loop(backbone: nn.Module, dataset: Dataset, describe: Describe, batch_size: int,
                how: Extraction) -> torch.Tensor:
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=stack_images,
                        num_workers=how.num_workers)
    backbone = backbone.to(how.device).eval()
    with torch.no_grad():
        rows = [describe(backbone, b["image"].to(how.device)).float().cpu() for b in loader]
    return torch.cat(rows)


def extract_descriptors(backbone: nn.Module, dataset: Dataset, describe: Describe, batch_size: int,
                        how: Extraction) -> torch.Tensor:
    """(len(dataset), D) float32 on the CPU, in dataset order (every process gets all rows)."""
    if how.launch is None:
        return _local_loop(backbone, dataset, describe, batch_size, how)

    def step(m, batch):
        return (describe(m.net.eval(), batch["image"]).float(),)

    return sharded_predict(how.launch, backbone, [dataset], step, batch_size=batch_size, collate_fn=stack_images,
                           num_workers=how.num_workers, progress=how.progress)[0][0]
