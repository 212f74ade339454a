"""Label-supervised training data (LaSt-ViT's cls_pretrain recipe) with resumable, seed-determined crops.

Train: RandomResizedCrop(img_size, scale, bilinear) + horizontal flip + ImageNet normalisation, nothing else
(no mixup / cutmix / RandAugment / random erasing). Val: Resize(img_size * 256/224, bilinear, torchvision's
default as the released ``T.Resize(256)``) + CenterCrop(img_size). The sampler is DINO pretraining's
``ResumableBatchSampler`` and each sample's crop comes from a generator seeded by (seed, epoch, index), so a
resumed run continues with exactly the batches the interrupted one had not trained on.

    dm = SupervisedDataModule(data="demo", img_size=64, batch_size=64)   # data/demo ImageFolder, 8 classes
"""
from __future__ import annotations

from typing import Optional

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torchvision.transforms import InterpolationMode

from datamodules.demo.names import DEMO
from datamodules.pretraining import ResumableBatchSampler, load_split
from datamodules.transforms.classification import RandomHorizontalFlip, RandomResizedCrop, ResizeCenterCrop
from datamodules.transforms.common import Normalize
from datamodules.transforms.multicrop import sample_generator


class TrainViews(Dataset):
    """``ds[(epoch, i)] -> (image, label)``; the crop depends only on (seed, epoch, i)."""

    def __init__(self, base: Dataset, size: int, scale=(0.08, 1.0), seed: int = 0):
        self.base, self.size, self.scale, self.seed = base, size, tuple(scale), seed
        self.norm = Normalize()

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, key):
        epoch, idx = key
        g = sample_generator(self.seed, epoch, idx)
        item = self.base[idx]
        item = {"image": item["image"], "label": item["label"]}  # boxes / masks are not needed here
        item = RandomHorizontalFlip(generator=g)(RandomResizedCrop(self.size, self.scale, generator=g)(item))
        return self.norm(item)["image"], int(item["label"])


class EvalViews(Dataset):
    def __init__(self, base: Dataset, size: int, resize: int):
        self.base = base
        self.rc = ResizeCenterCrop(resize, size, interpolation=InterpolationMode.BILINEAR)
        self.norm = Normalize()

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, idx):
        item = self.base[idx]
        item = self.norm(self.rc({"image": item["image"], "label": item["label"]}))
        return item["image"], int(item["label"])


class SupervisedDataModule(pl.LightningDataModule):
    """Args:
        data / data_root: ``demo`` or a ``datamodules.build_dataset`` name (``imagenet``) and its folder.
        img_size: crop size (224 in the paper); scale: RandomResizedCrop area range.
        batch_size: per device (the release: 512 per GPU x 8); val_batch_size: per device.
        batches_per_epoch: cap on the batches of one epoch (a step budget); None = the full epoch.
        eval_resize_ratio: val resize of the short side relative to img_size (256/224).
        demo_lazy: the demo data's lazy-aggregation marker share (``pretraining.load_split``); > 0 needs a data_root.
    """

    def __init__(self, data: str = DEMO, data_root: str = "", img_size: int = 224, scale: tuple = (0.08, 1.0),
                 batch_size: int = 512, val_batch_size: int = 128, num_workers: int = 8, seed: int = 0,
                 batches_per_epoch: Optional[int] = None, eval_resize_ratio: float = 256 / 224,
                 train_split: str = "train", val_split: str = "val", pin_memory: bool = True, demo_lazy: float = 0.0):
        super().__init__()
        self.save_hyperparameters()
        self.data, self.data_root, self.img_size, self.scale = data, data_root or "", img_size, tuple(scale)
        self.batch_size, self.val_batch_size, self.num_workers, self.seed = batch_size, val_batch_size, num_workers, seed
        self.batches_per_epoch, self.eval_resize_ratio = batches_per_epoch, eval_resize_ratio
        self.train_split, self.val_split, self.pin_memory = train_split, val_split, pin_memory
        self.demo_lazy = demo_lazy
        self._train = self._val = None

    def setup(self, stage: Optional[str] = None) -> None:
        if self._train is None:
            self._train, self._val = (load_split(self.data, self.data_root, s, demo_lazy=self.demo_lazy)
                                      for s in (self.train_split, self.val_split))

    @property
    def num_classes(self) -> int:
        self.setup()
        return len(self._train.classes) if hasattr(self._train, "classes") else \
            int(max(int(self._train[i]["label"]) for i in range(len(self._train)))) + 1

    def _loader(self, ds, **kw) -> DataLoader:
        return DataLoader(ds, num_workers=self.num_workers, pin_memory=self.pin_memory and torch.cuda.is_available(),
                          persistent_workers=self.num_workers > 0, **kw)

    def train_dataloader(self) -> DataLoader:
        self.setup("fit")
        world, rank, position = 1, 0, None
        if self.trainer is not None:
            world, rank = self.trainer.world_size, self.trainer.global_rank
            if self.trainer.accumulate_grad_batches != 1 or self.trainer.limit_train_batches not in (1.0, None):
                raise ValueError("the resumable sampler counts one batch per optimizer step: use data.batch_size "
                                 "and data.batches_per_epoch, not trainer.accumulate_grad_batches / "
                                 "limit_train_batches")
            position = lambda: self.trainer.global_step  # noqa: E731
        sampler = ResumableBatchSampler(len(self._train), self.batch_size, seed=self.seed, num_replicas=world,
                                        rank=rank, batches_per_epoch=self.batches_per_epoch, position=position)
        # own generator: building the iterator must not consume the global RNG
        return self._loader(TrainViews(self._train, self.img_size, self.scale, self.seed), batch_sampler=sampler,
                            generator=torch.Generator().manual_seed(self.seed))

    def eval_dataset(self, split: Optional[str] = None) -> EvalViews:
        self.setup()
        split = split or self.val_split
        base = {self.train_split: self._train, self.val_split: self._val}.get(split) or \
            load_split(self.data, self.data_root, split, demo_lazy=self.demo_lazy)
        return EvalViews(base, self.img_size, int(round(self.img_size * self.eval_resize_ratio)))

    def val_dataloader(self) -> DataLoader:
        ds = self.eval_dataset(self.val_split)
        world = self.trainer.world_size if self.trainer is not None else 1
        # DDP: each rank sees its shard (DistributedSampler pads with repeats to equal length; torchmetrics sums)
        sampler = DistributedSampler(ds, num_replicas=world, rank=self.trainer.global_rank, shuffle=False) \
            if world > 1 else None
        return self._loader(ds, batch_size=self.val_batch_size, shuffle=False, sampler=sampler)
