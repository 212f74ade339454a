"""DINO pretraining data: multi-crop views with resumable, seed-determined randomness.

Reproducibility contract (bitwise resume, see tests/test_resume.py):
  * the sample order of epoch ``e`` is ``randperm(n, seed + e)``, sharded over ranks like DistributedSampler;
  * the crops of sample ``i`` in epoch ``e`` come from a generator seeded by ``(seed, e, i)``;
  * where an epoch starts is read from the trainer's step counter when the iterator is created, so a run
    resumed from a mid-epoch checkpoint continues with exactly the batches the killed run had not trained on.
Lightning (2.6) restores its loop counters but not the position of a plain DataLoader; deriving the position
from ``global_step`` makes that restore unnecessary. Lightning's ``limit_train_batches`` is not used
(the position maths needs the epoch length up front): set ``data.batches_per_epoch`` instead.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from datamodules.transforms.multicrop import MultiCropTransform, make_config, sample_generator
from datamodules.transforms.views import eval_resize, eval_view, normalize

DEMO = "demo"


def load_split(data: str, data_root: str, split: str) -> Dataset:
    """Dict-item dataset (uint8 "image" (3,H,W), int "label") for ``data`` in {demo, <registered name>}."""
    if data == DEMO:
        from datamodules.demo import ensure_demo_data
        from datamodules.imagenet import ImageNetDataset  # the demo data is an ImageFolder of PNGs
        root = ensure_demo_data(data_root or None)
        return ImageNetDataset(Path(root) / "imagefolder", split)
    if not data_root:
        from datamodules.errors import MissingDataError
        raise MissingDataError(
            f"DATA={data} needs DATA_ROOT=<folder holding the dataset>; for imagenet that is the ImageFolder root "
            "with train/<wnid>/*.JPEG and val/<wnid>/*.JPEG (see docs/pretraining.md). Use DATA=demo for the "
            "built-in demo data.")
    from datamodules import build_dataset
    return build_dataset(data, data_root, split)


class ResumableBatchSampler(Sampler):
    """Batches of ``(epoch, index)`` keys. ``position()`` (optional) returns the number of batches already
    trained; the iterator starts at that epoch and batch. Without it, ``set_epoch`` picks the epoch."""

    def __init__(self, num_samples: int, batch_size: int, seed: int = 0, shuffle: bool = True,
                 num_replicas: int = 1, rank: int = 0, batches_per_epoch: Optional[int] = None,
                 position: Optional[Callable[[], int]] = None):
        full = num_samples // (batch_size * num_replicas)  # drop_last, as the official loader
        if full == 0:
            raise ValueError(f"{num_samples} samples cannot fill one batch of {batch_size} on {num_replicas} "
                             "device(s); lower data.batch_size or use more data.")
        if batches_per_epoch is not None and batches_per_epoch <= 0:
            raise ValueError(f"data.batches_per_epoch must be positive, got {batches_per_epoch}")
        self.num_samples, self.batch_size, self.seed, self.shuffle = num_samples, batch_size, seed, shuffle
        self.num_replicas, self.rank = num_replicas, rank
        self.length = min(full, batches_per_epoch) if batches_per_epoch else full
        self.position = position
        self.epoch = 0

    def __len__(self) -> int:
        return self.length

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def order(self, epoch: int) -> torch.Tensor:
        if self.shuffle:
            perm = torch.randperm(self.num_samples, generator=torch.Generator().manual_seed(self.seed + epoch))
        else:
            perm = torch.arange(self.num_samples)
        used = perm[: self.length * self.batch_size * self.num_replicas]
        return used[self.rank::self.num_replicas]

    def __iter__(self):
        if self.position is not None:
            epoch, start = divmod(int(self.position()), self.length)
        else:
            epoch, start = self.epoch, 0
        mine = self.order(epoch)
        for b in range(start, self.length):
            yield [(epoch, int(i)) for i in mine[b * self.batch_size:(b + 1) * self.batch_size]]


class MultiCropDataset(Dataset):
    """``ds[(epoch, i)] -> ([global1, global2, *locals], label)``; the crops depend only on (seed, epoch, i)."""

    def __init__(self, base: Dataset, transform: MultiCropTransform, seed: int = 0):
        self.base, self.transform, self.seed = base, transform, seed

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, key):
        epoch, idx = key
        item = self.base[idx]
        crops = self.transform(item["image"], generator=sample_generator(self.seed, epoch, idx))
        return crops, int(item["label"])


class EvalDataset(Dataset):
    """Deterministic view for k-NN and visualisations: resize the short side to ``size * resize_ratio``
    (DINO eval: 256/224), centre-crop ``size``, normalise."""

    def __init__(self, base: Dataset, size: int, resize_ratio: float, mean, std):
        self.base, self.size, self.resize_ratio = base, size, resize_ratio
        self.mean, self.std = mean, std

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, idx):
        item = self.base[idx]
        view = eval_view(item["image"], self.size, eval_resize(self.size, self.resize_ratio))
        return normalize(view, self.mean, self.std), int(item["label"])


class DINOPretrainDataModule(pl.LightningDataModule):
    """Multi-crop training batches (list of crop tensors, labels) plus deterministic eval views.

    Args:
        data: ``demo`` or a dataset name known to ``datamodules.build_dataset`` (e.g. ``imagenet``).
        data_root: dataset folder; empty for the demo data (generated under data/demo on first use).
        batch_size: per device (the official 64 per GPU; the learning rate scales with the total).
        n_local_crops: number of local crops (linked to the model's DINOLoss ``ncrops``).
        multicrop_preset: ``official`` | ``released_vits16`` | ``demo`` (datamodules/transforms/multicrop.py).
        multicrop: overrides of the preset (global_size, local_size, global_scale, local_scale, ...).
        batches_per_epoch: cap on the batches of one epoch (a step budget on big datasets); None = full epoch.
        eval_resize_ratio: eval resize of the short side relative to the crop (256/224 as DINO; 1.0 = none).
        val_split: split used for k-NN tests and the TensorBoard images.
    """

    def __init__(self, data: str = DEMO, data_root: str = "", batch_size: int = 64, num_workers: int = 4,
                 seed: int = 0, n_local_crops: int = 8, multicrop_preset: str = "official",
                 multicrop: Optional[dict[str, Any]] = None, batches_per_epoch: Optional[int] = None,
                 eval_resize_ratio: float = 256 / 224, train_split: str = "train", val_split: str = "val",
                 pin_memory: bool = True):
        super().__init__()
        self.save_hyperparameters()
        self.data, self.data_root = data, data_root or ""
        self.batch_size, self.num_workers, self.seed = batch_size, num_workers, seed
        self.n_local_crops = n_local_crops
        overrides = dict(multicrop or {})
        for k in ("global_scale", "local_scale", "ratio", "blur_radius", "blur_p", "solarize_p", "mean", "std"):
            if k in overrides:  # YAML gives lists; the config wants tuples
                overrides[k] = tuple(overrides[k])
        if isinstance(overrides.get("color_jitter"), list):
            overrides["color_jitter"] = tuple(overrides["color_jitter"])
        self.crop_cfg = make_config(multicrop_preset, n_local=n_local_crops, **overrides)
        self.batches_per_epoch, self.eval_resize_ratio = batches_per_epoch, eval_resize_ratio
        self.train_split, self.val_split, self.pin_memory = train_split, val_split, pin_memory
        self._train = self._eval = None

    def setup(self, stage: Optional[str] = None) -> None:
        if self._train is None:
            self._train = load_split(self.data, self.data_root, self.train_split)

    def _position(self) -> int:
        trainer = self.trainer
        if trainer.accumulate_grad_batches != 1:
            raise ValueError("DINO pretraining does not use trainer.accumulate_grad_batches (the resumable "
                             "sampler counts one batch per optimizer step); raise data.batch_size instead.")
        return trainer.global_step

    def train_dataloader(self) -> DataLoader:
        self.setup("fit")
        world, rank = 1, 0
        if self.trainer is not None:
            world, rank = self.trainer.world_size, self.trainer.global_rank
            if self.trainer.limit_train_batches not in (1.0, None):
                raise ValueError("trainer.limit_train_batches is not supported by the resumable sampler; "
                                 "set data.batches_per_epoch instead.")
        sampler = ResumableBatchSampler(len(self._train), self.batch_size, seed=self.seed, num_replicas=world,
                                        rank=rank, batches_per_epoch=self.batches_per_epoch,
                                        position=self._position if self.trainer is not None else None)
        ds = MultiCropDataset(self._train, MultiCropTransform(self.crop_cfg), seed=self.seed)
        # own generator: creating the iterator must not consume the global RNG (drop-path uses it)
        return DataLoader(ds, batch_sampler=sampler, num_workers=self.num_workers,
                          pin_memory=self.pin_memory and torch.cuda.is_available(),
                          persistent_workers=self.num_workers > 0, generator=torch.Generator().manual_seed(self.seed))

    def eval_dataset(self, split: str) -> EvalDataset:
        base = self._train if split == self.train_split and self._train is not None else \
            load_split(self.data, self.data_root, split)
        return EvalDataset(base, self.crop_cfg.global_size, self.eval_resize_ratio, self.crop_cfg.mean,
                           self.crop_cfg.std)

    def eval_dataloader(self, split: str, batch_size: int = 256, indices: Optional[list[int]] = None) -> DataLoader:
        ds = self.eval_dataset(split)
        if indices is not None:
            ds = torch.utils.data.Subset(ds, indices)
        return DataLoader(ds, batch_size=batch_size, shuffle=False, num_workers=0,
                          generator=torch.Generator().manual_seed(0))

    def steps_per_epoch(self) -> int:
        self.setup("fit")
        world = self.trainer.world_size if self.trainer is not None else 1
        full = len(self._train) // (self.batch_size * world)
        return min(full, self.batches_per_epoch) if self.batches_per_epoch else full
