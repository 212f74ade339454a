"""One descriptor per image, for the image-level evaluations (revisited Oxford/Paris retrieval, Copydays copy
detection): ``extract_descriptors(backbone, dataset, describe, batch_size, how)``.

``describe(backbone, images)`` turns a uint8 batch (B, 3, H, W) into (B, D) rows. With ``how.trainer`` (the probes'
Lightning Trainer factory) the dataset is sharded over the processes as the other probes shard theirs
(``ShardSampler``: every world-th image, no padding) and the rows are gathered back in dataset order on every
process (``gather_shards``); without it, one loop in this process. Images of different sizes go in batches of 1.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

from probes.core.features import gather_shards, sharded_predict

Describe = Callable[[nn.Module, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Extraction:
    """How descriptors are computed: ``trainer`` (a no-argument factory of a Lightning Trainer, e.g. the probes'
    ``make_trainer``) shards over its processes; None computes in this process on ``device``."""
    trainer: Optional[Callable[[], Any]] = None
    device: str = "cpu"
    num_workers: int = 0


def image_side(task: str, img_size: Optional[str]) -> int:
    """The image-level tasks' one size: --img-size's first value ('S' or 'S,S'), else the task's (probes.core.task_table)."""
    from probes.core.task_table import get_task
    side = int(str(img_size).split(",")[0]) if img_size else int(get_task(task).img_size[0])
    if side < 1:
        raise ValueError(f"--img-size {img_size}: a positive number of pixels")
    return side


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
    if how.trainer is None:
        return _local_loop(backbone, dataset, describe, batch_size, how)

    def step(m, batch):
        return describe(m.net.eval(), batch["image"]).float()

    def end(m):  # every process: all_gather is a collective; an empty shard (fewer images than processes) too
        dim = m.local[0].shape[1] if m.local else step(m, {"image": dataset[0]["image"][None].to(m.device)}).shape[1]
        rows = torch.cat(m.local) if m.local else torch.zeros(0, dim, device=m.device)
        return gather_shards(rows, len(dataset), m.global_rank, m.trainer.world_size, m.all_gather).cpu()

    return sharded_predict(how.trainer(), backbone, dataset, step, end, batch_size=batch_size,
                           collate_fn=stack_images, num_workers=how.num_workers)
