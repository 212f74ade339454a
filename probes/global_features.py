"""One descriptor per image, for the image-level evaluations (revisited Oxford/Paris retrieval, Copydays copy
detection): ``extract_descriptors(backbone, dataset, describe, batch_size, how)``.

``describe(backbone, images)`` turns a uint8 batch (B, 3, H, W) into (B, D) rows. With ``how.trainer`` (the probes'
Lightning Trainer factory) the dataset is sharded over the processes as the other probes shard theirs
(``ShardSampler``: every world-th image, no padding) and the rows are gathered back in dataset order on every
process (``gather_shards``); without it, one loop in this process. Images of different sizes go in batches of 1.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

from datamodules.datamodule_base import ShardSampler

from .features import gather_shards

Describe = Callable[[nn.Module, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Extraction:
    """How descriptors are computed: ``trainer`` (a no-argument factory of a Lightning Trainer, e.g. the probes'
    ``make_trainer``) shards over its processes; None computes in this process on ``device``."""
    trainer: Optional[Callable[[], Any]] = None
    device: str = "cpu"
    num_workers: int = 0


def image_level_flags(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags of the image-level tasks on ``make probe``'s parser (``probes.run`` turns them into
    ``RetrievalConfig`` / ``CopyDetectionConfig``)."""
    p.add_argument("--multiscale", action=argparse.BooleanOptionalAction, default=None,
                   help="roxford5k / rparis6k: [CLS] averaged over scales 1, 1/sqrt2, 1/2 (default: rparis6k on)")
    p.add_argument("--whole-queries", action="store_true", help="roxford5k / rparis6k: queries not cropped to "
                   "their box, as DINO's script reads them (revisitop's protocol crops them)")
    p.add_argument("--whitening-root", default="", help="copydays: whitening images (default <DATA_ROOT>/whitening)")
    p.add_argument("--distractors-root", default="", help="copydays: distractors (default <DATA_ROOT>/distractors)")
    return p


def image_side(task: str, img_size: Optional[str]) -> int:
    """The image-level tasks' one size: --img-size's first value ('S' or 'S,S'), else the task's (probes.tasks)."""
    from .tasks import get_task
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
    import lightning as L

    class DescriptorPass(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.backbone, self.local, self.result = backbone, [], None

        def predict_dataloader(self):
            sampler = ShardSampler(dataset, self.global_rank, self.trainer.world_size, train=False)
            return DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=stack_images,
                              num_workers=how.num_workers)

        def predict_step(self, batch, batch_idx):
            self.local.append(describe(self.backbone.eval(), batch["image"]).float())
            return self.local[-1]  # return_predictions=False: Lightning keeps nothing

        def on_predict_epoch_end(self):  # every process: all_gather is a collective
            dim = self.local[0].shape[1] if self.local else self._dim()
            rows = torch.cat(self.local) if self.local else torch.zeros(0, dim, device=self.device)
            self.result = gather_shards(rows, len(dataset), self.global_rank, self.trainer.world_size,
                                        self.all_gather).cpu()

        def _dim(self) -> int:  # an empty shard (fewer images than processes) still takes part in the gather
            return describe(self.backbone.eval(), dataset[0]["image"][None].to(self.device)).shape[1]

    module = DescriptorPass()
    how.trainer().predict(module, return_predictions=False)
    return module.result
