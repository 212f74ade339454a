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

from typing import Any, Callable, Optional

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from datamodules.demo.names import DEMO, demo_dataset, is_demo
from datamodules.transforms.batched import BatchedMultiCrop, DecodedBatch, collate_decoded, pack_params
from datamodules.transforms.multicrop import MultiCropTransform, make_config, sample_generator
from datamodules.transforms.views import eval_resize, eval_view, normalize

AUGMENT_ON = ("auto", "gpu", "cpu")
FOLDER = "folder"  # any folder of images, no labels (datamodules/datasets/folder.py)


def load_split(data: str, data_root: str, split: str, unlabeled: bool = False, demo_lazy: float = 0.0,
               **folder) -> Dataset:
    """Dict-item dataset (uint8 "image" (3,H,W), int "label") for ``data`` in {demo, folder, <registered name>};
    demo (``is_demo``): ``demo_cls``, or the demo dataset ``data`` names, generated in DATA_ROOT or data/demo.
    ``unlabeled``: a dataset without labels (folder, segmentation, depth) is accepted, its items labelled -1.
    ``demo_lazy``: the demo's lazy-aggregation knob (``DemoSpec.lazy_p``; 0: the environment's, TOKENMIX_DEMO_LAZY).
    ``folder``: the options of DATA=folder (file_list, verify, max_corrupt, index_dir: ``open_folder``)."""
    from datamodules import build_dataset
    from datamodules.datasets.imagenet import ImageNetDataset
    if is_demo(data):
        from dataclasses import replace

        from datamodules.demo import ensure_demo_data
        from datamodules.demo.cache import DEFAULT_SPEC
        root = ensure_demo_data(data_root or None, spec=replace(DEFAULT_SPEC, lazy_p=demo_lazy) if demo_lazy else None)
        ds = build_dataset(demo_dataset(data, "demo_cls"), root, split)
        return Unlabeled(ds) if unlabeled and not isinstance(ds, ImageNetDataset) else ds
    if not data_root:
        from datamodules.errors import needs_data_root
        raise needs_data_root(data)
    if data == FOLDER:
        return open_folder(data_root, **folder)
    ds = build_dataset(data, data_root, split)
    return Unlabeled(ds) if unlabeled and not isinstance(ds, ImageNetDataset) else ds


def open_folder(data_root: str, file_list: Optional[str] = None, verify: bool = False, max_corrupt: float = 0.01,
                index_dir: str = "") -> Dataset:
    """DATA=folder: rank 0 (the launching process) scans once and caches the index in ``index_dir`` (beside the
    run); the other ranks read that file. See datamodules/datasets/folder.py."""
    from datamodules.datasets.folder import FolderDataset, open_index
    index, path = open_index(data_root, file_list=file_list or None, verify=verify, index_dir=index_dir,
                             max_corrupt=max_corrupt)
    return FolderDataset(data_root, index=index, index_path=path, max_corrupt=max_corrupt)


class Unlabeled(Dataset):
    """Items of a dataset without class labels, with ``"label": -1`` (DINO never reads it)."""

    def __init__(self, base: Dataset):
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i):
        return {**self.base[i], "label": -1}


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


class DecodedMultiCropDataset(MultiCropDataset):
    """``data.augment_on=gpu``: ``ds[(epoch, i)] -> (uint8 (3, H, W), packed crop rows, label)``. The worker
    decodes and draws the crops (the same ``plan`` code and generator as the CPU path); the DataModule's
    ``on_after_batch_transfer`` cuts and colours them in batch (datamodules/transforms/batched.py)."""

    def __getitem__(self, key):
        epoch, idx = key
        item = self.base[idx]
        img, params = self.transform.plan(item["image"], generator=sample_generator(self.seed, epoch, idx))
        return img, pack_params(params), int(item["label"])


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
        augment_on: ``gpu``: workers only decode and draw the crops, the augmentation runs in batch in
            ``on_after_batch_transfer`` on the batch's device; ``cpu``: workers make the crops
            (``MultiCropTransform``); ``auto`` (default): gpu when the trainer runs on CUDA, else cpu.
        val_split: split used for k-NN tests and the TensorBoard images (DATA=folder: the training images).
        file_list / verify / max_corrupt / index_dir: DATA=folder only (datamodules/datasets/folder.py): a text file of
            image paths instead of the scan; decode every file while scanning; the share of unreadable files
            that stops the run; where the index is cached (``make pretrain`` sets it beside the run).
        demo_lazy: the demo data's lazy-aggregation marker share (``load_split``); > 0 needs a data_root.
    """

    def __init__(self, data: str = DEMO, data_root: str = "", batch_size: int = 64, num_workers: int = 4,
                 seed: int = 0, n_local_crops: int = 8, multicrop_preset: str = "official",
                 multicrop: Optional[dict[str, Any]] = None, batches_per_epoch: Optional[int] = None,
                 eval_resize_ratio: float = 256 / 224, train_split: str = "train", val_split: str = "val",
                 pin_memory: bool = True, file_list: Optional[str] = None, verify: bool = False,
                 max_corrupt: float = 0.01, index_dir: str = "", augment_on: str = "auto", demo_lazy: float = 0.0):
        super().__init__()
        if augment_on not in AUGMENT_ON:
            raise ValueError(f"data.augment_on must be one of {AUGMENT_ON}, got {augment_on!r}")
        self.save_hyperparameters()
        self.data, self.data_root, self.demo_lazy = data, data_root or "", demo_lazy
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
        self.folder = dict(file_list=file_list, verify=verify, max_corrupt=max_corrupt, index_dir=index_dir)
        if data == FOLDER:  # a folder has no splits: the visuals (and a k-NN check) read the training images
            self.val_split = train_split
        self.augment_on = augment_on
        self._train = self._eval = None
        self._batched = BatchedMultiCrop(self.crop_cfg)

    def setup(self, stage: Optional[str] = None) -> None:
        if self._train is None:
            self._train = load_split(self.data, self.data_root, self.train_split, unlabeled=True,
                                     demo_lazy=self.demo_lazy, **self.folder)

    def _position(self) -> int:
        trainer = self.trainer
        if trainer.accumulate_grad_batches != 1:
            raise ValueError("DINO pretraining does not use trainer.accumulate_grad_batches (the resumable "
                             "sampler counts one batch per optimizer step); raise data.batch_size instead.")
        return trainer.global_step

    def same_index_on_every_rank(self) -> None:
        """DATA=folder under DDP: every rank trains on rank 0's index (a rank a cluster launcher started may have
        read an older cache before rank 0 rewrote it: it reads it again). A collective: every rank calls it."""
        from datamodules.datasets.folder import FolderDataset, read_index
        if not isinstance(self._train, FolderDataset) or self.trainer is None or self.trainer.world_size == 1:
            return
        sha = self.trainer.strategy.broadcast(self._train.index["sha256"], src=0)
        if sha != self._train.index["sha256"] and self._train.index_path is not None:
            self._train = FolderDataset(self.data_root, index=read_index(self._train.index_path),
                                        index_path=self._train.index_path, max_corrupt=self.folder["max_corrupt"])
        if sha != self._train.index["sha256"]:
            from datamodules.errors import DatasetError
            raise DatasetError(f"rank {self.trainer.global_rank}: folder index {self._train.index_path} differs "
                               "from rank 0's; the runs folder must be shared by every node.")

    def data_report(self) -> dict:
        """What summary.json records about the data: DATA=folder's index and its unreadable files."""
        from datamodules.datasets.folder import FolderDataset
        return {"data_index": self._train.report()} if isinstance(self._train, FolderDataset) else {}

    def train_dataloader(self) -> DataLoader:
        self.setup("fit")
        self.same_index_on_every_rank()
        world, rank = 1, 0
        if self.trainer is not None:
            world, rank = self.trainer.world_size, self.trainer.global_rank
            if self.trainer.limit_train_batches not in (1.0, None):
                raise ValueError("trainer.limit_train_batches is not supported by the resumable sampler; "
                                 "set data.batches_per_epoch instead.")
        sampler = ResumableBatchSampler(len(self._train), self.batch_size, seed=self.seed, num_replicas=world,
                                        rank=rank, batches_per_epoch=self.batches_per_epoch,
                                        position=self._position if self.trainer is not None else None)
        on_gpu = self.resolved_augment_on() == "gpu"
        ds = (DecodedMultiCropDataset if on_gpu else MultiCropDataset)(self._train, MultiCropTransform(self.crop_cfg),
                                                                      seed=self.seed)
        # own generator: creating the iterator must not consume the global RNG (drop-path uses it)
        return DataLoader(ds, batch_sampler=sampler, num_workers=self.num_workers,
                          collate_fn=collate_decoded if on_gpu else None,
                          pin_memory=self.pin_memory and torch.cuda.is_available(),
                          persistent_workers=self.num_workers > 0, generator=torch.Generator().manual_seed(self.seed))

    def resolved_augment_on(self) -> str:
        """``gpu`` | ``cpu``: ``auto`` is gpu when the trainer runs on CUDA (CPU runs stay bit for bit as before)."""
        if self.augment_on != "auto":
            return self.augment_on
        on_cuda = self.trainer is not None and self.trainer.strategy.root_device.type == "cuda"
        return "gpu" if on_cuda else "cpu"

    def on_after_batch_transfer(self, batch, dataloader_idx: int = 0):
        """augment_on=gpu: the decoded batch, now on the training device, becomes ([global1, global2,
        *locals], labels), each crop (B, 3, size, size): what the CPU path's DataLoader yields."""
        if isinstance(batch, DecodedBatch):
            return self._batched(batch), batch.labels
        return batch

    def eval_dataset(self, split: str) -> EvalDataset:
        base = self._train if split == self.train_split and self._train is not None else \
            load_split(self.data, self.data_root, split, demo_lazy=self.demo_lazy)
        return EvalDataset(base, self.crop_cfg.global_size, self.eval_resize_ratio, self.crop_cfg.mean,
                           self.crop_cfg.std)

