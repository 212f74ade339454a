"""Dense quality watched during pretraining: a closed-form linear segmentation probe on the frozen teacher's patch
tokens, and the semantic-diffusion measures on the same images (``tokenmix.diffusion``).

At the exact starting weights (before the first step), every ``every_n_epochs`` epochs or ``every_n_steps`` steps,
and at the end, on a small labelled set (``task`` voc / ade20k; the demo VOC scenes for ``data: demo``, else the
dataset at ``data_root`` or ``$TOKENMIX_DENSE_ROOT``, evenly spaced ``max_samples`` of each split):

- ``dense/mIoU`` (+ aAcc, mAcc): ``probes.ridge`` on the probe protocol's views: the same number as
  ``make probe TASK=voc CKPT=<that checkpoint> ARGS="--solver ridge --max-samples N --ridge-lambda L"``;
- ``diffusion/pib_cls``: Point-in-Box of the [CLS] token (boxes: each class's extent in the validation masks);
- ``diffusion/cls_patch_cosine``: mean cosine between the patch tokens and [CLS];
- ``diffusion/effective_rank``: effective rank of the last block's patch features (Roy & Vetterli);
- ``diffusion/attn_entropy`` and ``diffusion/attn_zero_share``: mean over blocks, heads and query rows of the
  attention rows' entropy (nats) and share of exact zeros (0 for softmax; the sparse variants' support), on the
  first ``attn_images`` validation images.

TensorBoard scalars at each point, and the whole series in summary.json (``RunSummary`` reads ``series``). Under
DDP each rank takes the shard ``shard_indices`` gives it (as ``KNNCheck``) and every statistic is a sum, added up
by one all-reduce, so every rank gets the numbers one process gets.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import Any, Optional

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader, Subset

from lightning_modules.callbacks import epoch_check_due
from tokenmix.attention_stats import attention_stats
from tokenmix.diffusion import boxes_patch_mask, cls_patch_cosine, effective_rank_from_gram, mask_boxes, pib_hits, \
    patch_scores

ROOT_ENV = "TOKENMIX_DENSE_ROOT"


@contextmanager
def _eval_mode(model: torch.nn.Module):
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


class DenseProbeCheck(pl.Callback):
    """Configured as ``KNNCheck``: the start, ``every_n_epochs`` / ``every_n_steps`` (0: off) and the end. Place it
    before ``RunSummary`` in the callbacks, which writes its ``series`` to summary.json (module docstring: what it
    measures)."""

    def __init__(self, task: str = "voc", data: str = "demo", data_root: str = "", max_samples: int = 64,
                 ridge_lambda: float = 1e-2, batch_size: int = 16, img_size: Optional[int] = None,
                 attn_images: int = 16, every_n_epochs: int = 0, every_n_steps: int = 0):
        self.task, self.data, self.data_root = task, data, data_root
        self.max_samples, self.ridge_lambda, self.batch_size = max_samples, ridge_lambda, batch_size
        self.img_size, self.attn_images = img_size, attn_images
        self.every_n_epochs, self.every_n_steps = every_n_epochs, every_n_steps
        self.series: list[dict[str, Any]] = []
        self._dm = None
        self.disabled = False
        self._t0: Optional[float] = None
        self._first = 0  # this fit's first entry of the series (a resumed fit restores the earlier ones)
        self.share: Optional[float] = None  # the checks' share of this fit's wall time (set at its end)

    # -- state: the series survives a resume ------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"series": self.series}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.series = list(state_dict.get("series", []))

    # -- data -------------------------------------------------------------------------------------
    def datamodule(self, patch_size: int):
        """The probe protocol's DataModule of the labelled set (both splits, ``max_samples`` evenly spaced)."""
        if self._dm is None:
            from probes.data import probe_datamodule, resolve_data
            from probes.tasks import get_task
            task = get_task(self.task)
            demo = (self.data or "demo") == "demo"
            name, root = resolve_data(task, self.data, self.data_root or os.environ.get(ROOT_ENV, ""))
            size = (self.img_size,) * 2 if self.img_size else (task.demo_img_size if demo else task.img_size)
            self._dm = probe_datamodule(task, name, root, size, patch_size, batch_size=self.batch_size,
                                        max_samples=self.max_samples)
            self._dm.setup("fit")
        return self._dm

    def setup(self, trainer, pl_module, stage=None):
        if not self.data_root and (self.data or "demo") != "demo" and not os.environ.get(ROOT_ENV):
            rank_zero_warn(f"DenseProbeCheck: data={self.data} needs data_root or ${ROOT_ENV} (the folder holding "
                           f"{self.task}); the dense check is off for this run")
            self.disabled = True
            return
        self.datamodule(pl_module.teacher.backbone.patch_size)  # a missing or malformed dataset fails here, first

    # -- the check --------------------------------------------------------------------------------
    def _loader(self, ds, rank: int, world: int, n: Optional[int] = None) -> DataLoader:
        from datamodules.datamodule_base import dense_collate, shard_indices
        if n is not None:
            ds = Subset(ds, list(range(min(n, len(ds)))))
        return DataLoader(Subset(ds, shard_indices(len(ds), rank, world)), batch_size=self.batch_size,
                          shuffle=False, collate_fn=dense_collate)

    @torch.no_grad()
    def evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, float]:
        """Every rank calls this (three all-reduces); returns the same numbers on every rank."""
        from probes.ridge import run_ridge_probe
        t0, c0 = time.perf_counter(), time.process_time()
        model = pl_module.teacher.backbone
        dm = self.datamodule(model.patch_size)
        rank, world = trainer.global_rank, trainer.world_size

        def reduce(t: torch.Tensor) -> torch.Tensor:  # sum over processes (float64 on CPU; NCCL needs the device)
            if world == 1:
                return t
            return trainer.strategy.reduce(t.to(pl_module.device), reduce_op="sum").to("cpu", torch.float64)

        v = torch.zeros(7, dtype=torch.float64)  # see _diffusion_sums
        gram = torch.zeros(model.embed_dim, model.embed_dim, dtype=torch.float64)

        def train():
            for batch in self._loader(dm.train_set, rank, world):
                yield self._tokens(model, batch["image"], pl_module.device)[2], batch["mask"]

        def val():  # the same forward feeds the probe and the diffusion measures
            for batch in self._loader(dm.val_set, rank, world):
                cls, patch, grid = self._tokens(model, batch["image"], pl_module.device)
                masks = batch["mask"] if isinstance(batch["mask"], list) else list(batch["mask"])
                gram.add_(self._diffusion_sums(v, cls.float().cpu(), patch.float().cpu(), masks, grid.shape[-2:]))
                yield grid, masks

        with _eval_mode(model):
            out = run_ridge_probe(train(), val(), dm.num_classes, self.ridge_lambda, model.embed_dim, reduce)
            for batch in self._loader(dm.val_set, rank, world, n=self.attn_images):
                self._attention_sums(v, model, batch["image"], pl_module.device)
        s = reduce(v)
        n_img, n_box, n_attn = (max(float(s[i]), 1.0) for i in (0, 2, 3))
        return {"dense/mIoU": out["mIoU"], "dense/aAcc": out["aAcc"], "dense/mAcc": out["mAcc"],
                "diffusion/pib_cls": 100.0 * float(s[1]) / n_box, "diffusion/cls_patch_cosine": float(s[4]) / n_img,
                "diffusion/effective_rank": effective_rank_from_gram(reduce(gram)),
                "diffusion/attn_entropy": float(s[5]) / n_attn, "diffusion/attn_zero_share": float(s[6]) / n_attn,
                "dense/seconds": time.perf_counter() - t0, "dense/cpu_seconds": time.process_time() - c0}

    @staticmethod
    def _tokens(model, images: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Last block's [CLS] (B, D), patches (B, N, D) and the patch grid (B, D, h, w): the grid is what
        ``probes.features.FrozenFeatures`` gives the probe CLI (same call, same bits)."""
        from probes.features import normalize_images
        x = normalize_images(images.to(device))
        o = model.extract(x, n_last_blocks=1)[-1]
        h, w = model.grid_size(x)
        B, N, D = o["patch"].shape
        return o["cls"], o["patch"], o["patch"].transpose(1, 2).reshape(B, D, h, w)

    @staticmethod
    def _diffusion_sums(v: torch.Tensor, cls: torch.Tensor, patch: torch.Tensor, masks, grid) -> torch.Tensor:
        """Adds [images, PiB hits, images with a box, -, Σ mean cosine] of a batch to ``v``; returns its Gram."""
        boxes = [boxes_patch_mask(mask_boxes(m), tuple(grid), (m.shape[-2] / grid[0], m.shape[-1] / grid[1]))
                 for m in masks]
        has = torch.tensor([b.any().item() for b in boxes])
        hits = pib_hits(patch_scores(cls, patch), torch.stack(boxes))
        v[0] += len(masks)
        v[1] += (hits & has).sum().item()
        v[2] += has.sum().item()
        v[4] += cls_patch_cosine(cls, patch).double().sum().item()
        pd = patch.double().reshape(-1, patch.shape[-1])
        return pd.T @ pd

    @staticmethod
    def _attention_sums(v: torch.Tensor, model, images: torch.Tensor, device) -> None:
        """Adds [-, -, -, images, -, Σ entropy, Σ zero share] (each image's mean over blocks, heads, rows)."""
        from probes.features import normalize_images
        per = [attention_stats(a.float().cpu()) for a in model.attention_maps(normalize_images(images.to(device)))]
        B = images.shape[0]
        v[3] += B
        v[5] += B * torch.stack([p["entropy"].double().mean() for p in per]).mean().item()
        v[6] += B * torch.stack([p["zero_share"].double().mean() for p in per]).mean().item()

    def run(self, trainer: pl.Trainer, pl_module: pl.LightningModule, when: str) -> None:
        if self.disabled:
            return
        step = trainer.global_step
        if self.series and self.series[-1]["step"] == step:  # e.g. the end right after an epoch's check
            return
        res = self.evaluate(trainer, pl_module)
        epochs = trainer.current_epoch + (1 if when == "epoch" else 0)  # completed epochs
        self.series.append({"step": step, "epoch": epochs, "when": when, **res})
        for lg in trainer.loggers:
            lg.log_metrics({k: v for k, v in res.items() if not k.endswith("seconds")}, step=step)
        rank_zero_info(f"dense check ({when}, step {step}): mIoU {res['dense/mIoU']:.2f}, PiB "
                       f"{res['diffusion/pib_cls']:.1f}, cos(patch, CLS) {res['diffusion/cls_patch_cosine']:.3f}, "
                       f"eff. rank {res['diffusion/effective_rank']:.1f} ({res['dense/seconds']:.1f} s)")

    def on_train_start(self, trainer, pl_module):
        self._t0, self._first = time.perf_counter(), len(self.series)  # a resumed fit: only its own checks
        if trainer.global_step == 0:
            self.run(trainer, pl_module, "start")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.every_n_steps and trainer.global_step % self.every_n_steps == 0 and trainer.global_step > 0:
            last = trainer.max_steps and trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps
            if not last:
                self.run(trainer, pl_module, "step")

    def on_train_epoch_end(self, trainer, pl_module):
        if epoch_check_due(trainer, self.every_n_epochs):
            self.run(trainer, pl_module, "epoch")

    def on_train_end(self, trainer, pl_module):
        self.run(trainer, pl_module, "end")
        if self._t0 is not None and self.series:  # its cost, stated on every run (docs/performance.md)
            spent = sum(p["dense/seconds"] for p in self.series[self._first:])
            self.share = spent / max(time.perf_counter() - self._t0, 1e-9)
            rank_zero_info(f"dense checks: {spent:.1f} s, {100 * self.share:.1f} % of this fit's wall time")

    def summary_entries(self) -> dict[str, Any]:
        """summary.json entries: the series and the last point's values."""
        if not self.series:
            return {}
        last = self.series[-1]
        return {"dense_series": self.series, "dense_check_share": self.share,
                **{k.replace("/", "_"): v for k, v in last.items() if k.startswith(("dense/", "diffusion/"))}}
