"""Label-supervised classification of any variant, following LaSt-ViT's released recipe (cls_pretrain/conf.py):
the linear ``head`` reads the final-norm [CLS] output (``lastvit``: the aggregated token); AdamW with weight decay
on *every* parameter (detectron2's ``get_default_optimizer_params``), lr x ``lr_multiplier``; plain cross-entropy.
Checkpoints record the backbone without the head and ``num_classes``, so probes get the feature backbone.
"""
from __future__ import annotations

import math
import time
from typing import Any, Optional

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from torchmetrics.classification import MulticlassAccuracy

from backbones import create_vit, parse_variant
from backbones.checkpoint import SUPERVISED, check_resume_config, runtime_record, write_entry
from lightning_modules.dino_module import NonFiniteLossError
from lightning_modules.checkpoint_io import epoch_end_form
from tokenmix.results import clean
from tokenmix.topk import TopK


def lr_multiplier(where: float, warmup_frac: float = 0.01, warmup_factor: float = 0.1,
                  final_factor: float = 0.001) -> float:
    """detectron2 ``WarmupParamScheduler(CosineParamScheduler(1, final), warmup_factor, warmup_frac)`` at
    ``where`` = step / total steps in [0, 1]: the warm-up runs linearly to the cosine's value at warmup_frac."""
    cosine = lambda t: final_factor + 0.5 * (1.0 - final_factor) * (1.0 + math.cos(math.pi * t))  # noqa: E731
    if where < warmup_frac:
        start, end = warmup_factor * cosine(0.0), cosine(warmup_frac)
        return start + (end - start) * where / warmup_frac
    return cosine(min(where, 1.0))


class SupervisedModule(pl.LightningModule):
    """Args: arch, variant, backbone, variant_options as ``DINOPretrainModule``; num_classes must equal the
    dataset's (checked at fit start); AdamW with weight decay on every parameter, clip_grad a global-norm clip
    and label_smoothing 0, as the release; warmup_frac, warmup_factor, final_factor: ``lr_multiplier``;
    zero_init_head: torchvision's (zeros)."""

    def __init__(self, arch: str = "vit_base_patch16", variant: str = "lastvit",
                 backbone: Optional[dict[str, Any]] = None, variant_options: Optional[dict[str, Any]] = None,
                 num_classes: int = 1000, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.95),
                 weight_decay: float = 0.3, warmup_frac: float = 0.01, warmup_factor: float = 0.1,
                 final_factor: float = 0.001, label_smoothing: float = 0.0, clip_grad: float = 0.0,
                 zero_init_head: bool = True, epochs: int = 100):
        super().__init__()
        spec = parse_variant(variant)
        if num_classes < 2:
            raise ValueError(f"model.num_classes must be >= 2, got {num_classes}")
        opts = clean({**(backbone or {}), **(variant_options or {})})
        self.save_hyperparameters({**{k: clean(v) for k, v in locals().items()
                                      if k not in ("self", "__class__", "spec", "variant_options", "opts")},
                                   "variant": spec.name, "backbone": opts})
        self.backbone = create_vit(arch, spec.name, num_classes=num_classes, **opts)
        if zero_init_head:  # torchvision VisionTransformer initialises heads.head to zeros
            torch.nn.init.zeros_(self.backbone.head.weight)
            torch.nn.init.zeros_(self.backbone.head.bias)
        self.val_topk = TopK(num_classes)
        self.train_top1 = MulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.random_init: dict[str, float] = {}  # val metrics before the first step (sanity pass)
        self.last_val: dict[str, float] = {}
        self._last_batch_end: Optional[float] = None

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone(images)

    def configure_optimizers(self):
        hp = self.hparams  # lr is set every step from the schedule
        return torch.optim.AdamW(self.parameters(), lr=hp.lr, betas=tuple(hp.betas), weight_decay=hp.weight_decay)

    def total_steps(self) -> int:
        return max(1, int(self.hparams.epochs) * int(self.trainer.num_training_batches))

    def on_train_start(self) -> None:
        if self.trainer.max_epochs is not None and self.trainer.max_epochs != self.hparams.epochs:
            raise ValueError(f"model.epochs={self.hparams.epochs} but trainer.max_epochs={self.trainer.max_epochs}; "
                             "the lr schedule needs the real length (the CLI links them: set trainer.max_epochs)")

    def lr_at(self, step: int) -> float:
        hp = self.hparams
        return hp.lr * lr_multiplier(step / self.total_steps(), hp.warmup_frac, hp.warmup_factor, hp.final_factor)

    def training_step(self, batch, batch_idx: int):
        images, labels = batch
        lr = self.lr_at(self.global_step)
        for group in self.optimizers().param_groups:
            group["lr"] = lr
        logits = self.backbone(images)
        loss = F.cross_entropy(logits.float(), labels, label_smoothing=self.hparams.label_smoothing)
        if not torch.isfinite(loss):
            ckpt = getattr(self.trainer.checkpoint_callback, "last_model_path", "") or "none saved yet"
            raise NonFiniteLossError(f"loss is {loss.item()} at step {self.global_step}; training stopped. Last good "
                                     f"checkpoint: {ckpt}. Resume from it (RESUME=<path>) with a lower lr or "
                                     "trainer.precision=32-true.")
        self.train_top1(logits.detach(), labels)
        self.log("train/loss", loss.detach(), on_step=True, on_epoch=False)  # the bar: callbacks/progress.py
        self.log("train/lr", lr, on_step=True, on_epoch=False)
        self.log("train/top1", self.train_top1, on_step=False, on_epoch=True)
        return loss

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        if gradient_clip_val:
            raise ValueError("use model.clip_grad, not trainer.gradient_clip_val")
        if self.hparams.clip_grad:
            torch.nn.utils.clip_grad_norm_(self.parameters(), self.hparams.clip_grad)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        now = time.perf_counter()
        if self._last_batch_end is not None:
            ips = batch[0].shape[0] * self.trainer.world_size / max(now - self._last_batch_end, 1e-9)
            self.log("train/throughput_img_s", ips, on_step=True, on_epoch=False)
        self._last_batch_end = now

    # ------------------------------------------------------------------ validation
    def validation_step(self, batch, batch_idx: int) -> None:
        images, labels = batch
        logits = self.backbone(images)
        self.val_topk.update(logits, labels)

    def on_validation_epoch_end(self) -> None:
        # compute() syncs the counts over ranks on every rank (a collective): never rank-0 only
        top1, top5 = self.val_topk.compute()
        if self.trainer.sanity_checking:
            if self.global_step == 0 and not self.random_init:  # the exact starting weights
                self.random_init = {"val_top1": top1, "val_top5": top5}
                rank_zero_info(f"val top-1 at random init: {top1:.2f}% (top-5 {top5:.2f}%)")
            return
        self.last_val = {"val_top1": top1, "val_top5": top5}
        self.log_dict({"val/top1": top1, "val/top5": top5}, sync_dist=False)
        if self.random_init:
            self.log("val/top1_random_init", self.random_init["val_top1"], sync_dist=False)

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        epoch_end_form(checkpoint)  # an epoch's last batch: the counters Lightning resumes right (checkpoint_io.py)
        # the recorded backbone is the feature backbone (probes, analyses); the head's size sits beside it
        write_entry(checkpoint, self.backbone.backbone_config.replace(num_classes=0), kind=SUPERVISED,
                    runtime=runtime_record(self.backbone), num_classes=int(self.hparams.num_classes),
                    random_init=clean(dict(self.random_init)))

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        epoch_end_form(checkpoint)  # before Lightning restores its loops (files written before the fix)
        meta = check_resume_config(checkpoint, self.backbone.backbone_config.replace(num_classes=0), kind=SUPERVISED,
                                   runtime=runtime_record(self.backbone))
        self.random_init = dict(meta.get("random_init") or {})
