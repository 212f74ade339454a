"""DINO (v1) self-distillation as a LightningModule, following facebookresearch/dino main_dino.py.

Per iteration ``it`` (= global_step): lr / weight decay / teacher momentum come from the official per-iteration
cosine schedules, the teacher temperature from the per-epoch warm-up. The teacher is a deep copy of the student
(never the same object), gets only the two global crops, has no gradients and is updated by EMA right after
each optimizer step (inside ``optimizer_step``, so a checkpoint taken after the step already holds it).
"""
from __future__ import annotations

import copy
import math
import time
from typing import Any, Optional

import lightning.pytorch as pl
import torch
import torch.nn.functional as F

from backbones import create_vit, parse_variant
from backbones.checkpoint import DINO, check_resume_config, runtime_record, write_entry
from lightning_modules.dino_head import DINOHead, MultiCropWrapper
from lightning_modules.dino_loss import DINOLoss
from lightning_modules.fast_ops import clip_grad_norms_, ema_
from lightning_modules.checkpoint_io import epoch_end_form
from lightning_modules.dino_optim import cancel_gradients_last_layer, cosine_scheduler, get_params_groups
from tokenmix.results import clean


class NonFiniteLossError(RuntimeError):
    """The loss became NaN/inf; training stopped (as the official ``sys.exit(1)``)."""


def scaled_lr(base_lr: float, total_batch: int, scale: bool = True) -> float:
    """The linear scaling rule of main_dino.py: ``base_lr`` is for a total batch of 256 (``scale`` False: as given)."""
    return base_lr * total_batch / 256.0 if scale else base_lr


class DINOPretrainModule(pl.LightningModule):
    """Student/teacher DINO on a tokenmix ViT; defaults and names are main_dino.py's ViT-S/16 arguments.

    Args (the others: DINOHead, DINOLoss and the cosine schedules, as main_dino.py):
        backbone: overrides (drop_path_rate, img_size, ...); variant_options: variant knobs, merged with it
            (two dicts, see __init__). Drop-path applies to the student only.
        lr: base lr for a total batch of 256 (scaled linearly when scale_lr).
        clip_grad: per-parameter gradient-norm clip (0 = off). epochs / n_local_crops: linked by the CLI to
            trainer.max_epochs / the data module.
        stats_every: collapse statistics and schedule scalars every N steps (None: log_every_n_steps).
        compile: ``torch.compile`` the backbones and heads (opt-in; docs/performance.md).
    """

    def __init__(self, arch: str = "vit_small_patch16", variant: str = "softmax",
                 backbone: Optional[dict[str, Any]] = None, variant_options: Optional[dict[str, Any]] = None,
                 out_dim: int = 65536, use_bn_in_head: bool = False,
                 norm_last_layer: bool = True, head_nlayers: int = 3, head_hidden_dim: int = 2048,
                 head_bottleneck_dim: int = 256, warmup_teacher_temp: float = 0.04, teacher_temp: float = 0.04,
                 warmup_teacher_temp_epochs: int = 0, student_temp: float = 0.1, center_momentum: float = 0.9,
                 lr: float = 0.0005, scale_lr: bool = True, min_lr: float = 1e-6, warmup_epochs: int = 10,
                 weight_decay: float = 0.04, weight_decay_end: float = 0.4, momentum_teacher: float = 0.996,
                 momentum_teacher_end: float = 1.0, clip_grad: float = 3.0, freeze_last_layer: int = 1,
                 epochs: int = 100, n_local_crops: int = 8, stats_every: Optional[int] = None,
                 compile: bool = False):
        super().__init__()
        spec = parse_variant(variant)  # clear ValueError listing the valid names
        if warmup_teacher_temp_epochs > epochs or warmup_epochs >= epochs:
            raise ValueError(f"model.warmup_epochs={warmup_epochs} and model.warmup_teacher_temp_epochs="
                             f"{warmup_teacher_temp_epochs} must be shorter than the run (trainer.max_epochs="
                             f"{epochs}); lower them together with max_epochs")
        # two dicts so a preset (drop_path_rate, ...) and a variant file (num_registers, ...) never overwrite
        # each other: a later YAML replaces a whole dict value
        backbone = clean({**(backbone or {}), **(variant_options or {})})
        self.save_hyperparameters({**{k: clean(v) for k, v in locals().items()
                                      if k not in ("self", "__class__", "spec", "variant_options")}, "variant": spec.name})
        student_backbone = create_vit(arch, spec.name, **backbone)
        head = DINOHead(student_backbone.embed_dim, out_dim, use_bn=use_bn_in_head, norm_last_layer=norm_last_layer,
                        nlayers=head_nlayers, hidden_dim=head_hidden_dim, bottleneck_dim=head_bottleneck_dim)
        self.student = MultiCropWrapper(student_backbone, head)
        # a separate object with the same initial weights (official: teacher.load_state_dict(student.state_dict()))
        self.teacher = copy.deepcopy(self.student)
        for p in self.teacher.parameters():
            p.requires_grad = False
        self.teacher.backbone.eval()  # no drop-path; the head keeps train mode (see train())
        # cached parameter lists for the multi-tensor EMA (same order as the official zip over parameters())
        self._ema_pairs = (list(self.teacher.parameters()), list(self.student.parameters()))
        # last-layer parameters the optimizer trains once unfrozen (weight_g stays fixed with norm_last_layer)
        self._last_layer = [p for n, p in self.student.named_parameters() if "last_layer" in n and p.requires_grad]
        if compile:
            for m in (self.student.backbone, self.student.head, self.teacher.backbone, self.teacher.head):
                m.compile(dynamic=False)  # in place: state-dict keys unchanged; one graph per crop size
        self.ncrops = 2 + n_local_crops
        self.dino_loss = DINOLoss(out_dim, self.ncrops, warmup_teacher_temp, teacher_temp,
                                  warmup_teacher_temp_epochs, epochs, student_temp, center_momentum)
        self.lr_schedule = self.wd_schedule = self.momentum_schedule = None
        self._it = 0
        self._rng_to_restore: Optional[dict] = None
        self._last_batch_end: Optional[float] = None
        self._last_loss: Optional[torch.Tensor] = None
        self._stats: dict[str, float] = {}
        self._nonfinite: Optional[torch.Tensor] = None  # device flag: first step with a non-finite loss, or -1

    @property
    def last_stats(self) -> dict[str, float]:
        """Last loss (read back from the device only when asked) and the last collapse statistics."""
        loss = {} if self._last_loss is None else {"train/loss": float(self._last_loss)}
        return {**loss, **self._stats}

    # ------------------------------------------------------------------ structure
    def train(self, mode: bool = True):
        super().train(mode)
        # the official teacher is never put in eval mode but has no drop-path: its backbone stays inactive here,
        # its head follows ``mode`` so a head BatchNorm (use_bn_in_head) uses batch statistics as there
        self.teacher.backbone.eval()
        return self

    @property
    def backbone(self):
        """The teacher backbone: what DINO evaluates and exports."""
        return self.teacher.backbone

    def configure_optimizers(self):
        # lr / weight decay are overwritten every iteration from the schedules (as main_dino.py). One fused
        # multi-tensor AdamW kernel (same update as the official for-loop AdamW, tests/test_dino_fast_step.py)
        self._set_last_layer_trainable(True)  # the groups must hold it even if a previous fit left it frozen
        groups = get_params_groups(self.student)
        # fp16 + GradScaler: a fused AdamW un-scales inside step(), so Lightning would not un-scale before our
        # clipping; use the multi-tensor (foreach) AdamW there, which Lightning un-scales first
        scaled = self._trainer is not None and str(self.trainer.precision).startswith("16")
        eligible = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for g in groups for p in g["params"])
        kind = {} if not eligible else {"foreach": True} if scaled else {"fused": True}
        return torch.optim.AdamW(groups, **kind)

    def _set_last_layer_trainable(self, trainable: bool) -> None:
        for p in self._last_layer:
            p.requires_grad_(trainable)

    def on_train_epoch_start(self) -> None:
        # while frozen the official code computes the 65536 x 256 last layer's gradient and then drops it; we do
        # not compute it. Under DDP the reducer expects every parameter it was built with: keep the official way.
        frozen = self.current_epoch < self.hparams.freeze_last_layer
        self._set_last_layer_trainable(not (frozen and self.trainer.world_size == 1))

    # ------------------------------------------------------------------ schedules
    def total_batch_size(self) -> int:
        dm = self.trainer.datamodule
        return int(dm.batch_size) * self.trainer.world_size

    def build_schedules(self, niter_per_ep: int) -> None:
        hp = self.hparams
        lr = scaled_lr(hp.lr, self.total_batch_size(), hp.scale_lr)
        self.lr_schedule = cosine_scheduler(lr, hp.min_lr, hp.epochs, niter_per_ep, warmup_epochs=hp.warmup_epochs)
        self.wd_schedule = cosine_scheduler(hp.weight_decay, hp.weight_decay_end, hp.epochs, niter_per_ep)
        self.momentum_schedule = cosine_scheduler(hp.momentum_teacher, hp.momentum_teacher_end, hp.epochs,
                                                  niter_per_ep)

    def on_train_start(self) -> None:
        if self.trainer.max_epochs is not None and self.trainer.max_epochs != self.hparams.epochs:
            raise ValueError(f"model.epochs={self.hparams.epochs} but trainer.max_epochs={self.trainer.max_epochs}; "
                             "the schedules need the real length (the CLI links them: set trainer.max_epochs).")
        self.build_schedules(int(self.trainer.num_training_batches))

    def _sched(self, arr, it: int) -> float:
        return float(arr[min(it, len(arr) - 1)])  # past the schedule (max_steps > epochs*niter): hold the end

    # ------------------------------------------------------------------ training
    def training_step(self, batch, batch_idx: int):
        crops, _ = batch
        if len(crops) != self.ncrops:
            raise ValueError(f"got {len(crops)} crops per image but DINOLoss expects {self.ncrops} "
                             "(model.n_local_crops must equal data.n_local_crops; the CLI links them)")
        it = self._it = self.global_step
        epoch = self.current_epoch
        opt = self.optimizers()
        lr, wd = self._sched(self.lr_schedule, it), self._sched(self.wd_schedule, it)
        for i, group in enumerate(opt.param_groups):
            group["lr"] = lr
            if i == 0:  # only the first group is regularised
                group["weight_decay"] = wd

        with torch.no_grad():
            teacher_out = self.teacher(crops[:2])
        student_out = self.student(crops)
        temp = self.dino_loss.teacher_temp(epoch)
        stats_step = self._stats_step(it)
        if stats_step:
            self._stats = self._collapse_stats(teacher_out, temp)  # before the loss moves the centre
        loss = self.dino_loss(student_out, teacher_out, epoch)
        self._last_loss = loss.detach()
        self._watch_finite(self._last_loss, it, now=stats_step or loss.device.type == "cpu")
        log = dict(on_step=True, on_epoch=False, sync_dist=False)
        self.log("train/loss", self._last_loss, **log)  # not prog_bar: read back every step (callbacks/progress.py)
        if stats_step:
            m = self._sched(self.momentum_schedule, it)
            self.log_dict({"train/lr": lr, "train/wd": wd, "train/teacher_momentum": m, "train/teacher_temp": temp,
                           "train/epoch": float(epoch), **self._stats}, **log)
        return loss

    def _stats_step(self, it: int) -> bool:
        every = self.hparams.stats_every or self.trainer.log_every_n_steps
        last = self.trainer.is_last_batch and self.current_epoch + 1 >= (self.trainer.max_epochs or 0)
        return (it + 1) % max(every, 1) == 0 or it == 0 or last

    def _watch_finite(self, loss: torch.Tensor, it: int, now: bool) -> None:
        """Remember the first step with a non-finite loss on the device (no host sync); raise when ``now`` (CPU
        tensors: every step, it costs nothing; GPU: statistics steps) and before any checkpoint is written."""
        if self._nonfinite is None or self._nonfinite.device != loss.device:
            self._nonfinite = torch.full((), -1, dtype=torch.long, device=loss.device)
        bad = ~torch.isfinite(loss) & (self._nonfinite < 0)
        self._nonfinite = torch.where(bad, torch.full_like(self._nonfinite, it), self._nonfinite)
        if now:
            self._raise_if_nonfinite()

    def _raise_if_nonfinite(self) -> None:
        if self._nonfinite is None or int(self._nonfinite) < 0:
            return
        step = int(self._nonfinite)
        ckpt = getattr(self.trainer.checkpoint_callback, "last_model_path", "") or "none saved yet"
        raise NonFiniteLossError(
            f"loss is {float(self._last_loss)} at step {step}"
            f"{'' if step == self._it else f' (first non-finite; seen at step {self._it})'} (epoch "
            f"{self.current_epoch}); training stopped. Last good checkpoint: {ckpt}. Resume from it (RESUME=<path>) "
            "with a lower lr, trainer.precision=32-true or a larger warm-up.")

    @torch.no_grad()
    def _collapse_stats(self, teacher_out: torch.Tensor, temp: float) -> dict[str, float]:
        """Collapse watch: per-image teacher entropy (-> ln K: uniform collapse), entropy of the batch-mean
        distribution (-> 0: everything on one prototype), and the centre's norm."""
        K = teacher_out.shape[-1]
        p = F.softmax((teacher_out.float() - self.dino_loss.center) / temp, dim=-1)
        ent = -torch.special.xlogy(p, p).sum(-1).mean()
        mean_p = p.mean(0)
        batch_ent = -torch.special.xlogy(mean_p, mean_p).sum()
        return {"collapse/teacher_entropy": ent.item(), "collapse/teacher_entropy_frac": ent.item() / math.log(K),
                "collapse/batch_mean_entropy_frac": batch_ent.item() / math.log(K),
                "collapse/center_norm": self.dino_loss.center.norm().item()}

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        # called after AMP un-scaling, right before optimizer.step: clip, then drop frozen-layer gradients
        if gradient_clip_val:
            raise ValueError("use model.clip_grad (DINO's per-parameter clipping), not trainer.gradient_clip_val")
        if self.hparams.clip_grad:
            clip_grad_norms_(self.student.parameters(), self.hparams.clip_grad)
        cancel_gradients_last_layer(self.current_epoch, self.student, self.hparams.freeze_last_layer)

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        optimizer.step(closure=optimizer_closure)
        self.ema_update(self._sched(self.momentum_schedule, self._it))

    def ema_update(self, m: float) -> None:
        ema_(*self._ema_pairs, m)

    def on_train_batch_start(self, batch, batch_idx: int):
        if self._rng_to_restore is not None:  # resumed: continue the RNG streams (drop-path) where they were
            state, self._rng_to_restore = self._rng_to_restore, None
            r = self.global_rank
            ranks = state.get("ranks_torch")  # every rank's stream (older checkpoints: rank 0's only)
            # clone: a row view of the (world, n) tensor is not accepted as a generator state
            torch.set_rng_state(ranks[r].clone() if ranks is not None and r < len(ranks) else state["torch"])
            cuda_ranks = state.get("ranks_cuda")
            if torch.cuda.is_available() and cuda_ranks is not None and r < len(cuda_ranks):
                torch.cuda.set_rng_state(cuda_ranks[r].clone())
            elif torch.cuda.is_available() and state.get("cuda"):
                torch.cuda.set_rng_state_all(state["cuda"])

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        now = time.perf_counter()
        if self._last_batch_end is not None:
            ips = self.total_batch_size() / max(now - self._last_batch_end, 1e-9)
            if self.trainer._logger_connector.should_update_logs:  # a logged float is copied to the device: a sync
                self.log("train/throughput_img_s", ips, on_step=True, on_epoch=False)
        self._last_batch_end = now

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        self._raise_if_nonfinite()  # never write a checkpoint past a non-finite loss
        epoch_end_form(checkpoint)  # an epoch's last batch: the counters Lightning resumes right (checkpoint_io.py)
        write_entry(checkpoint, self.student.backbone.backbone_config, kind=DINO,
                    runtime=runtime_record(self.student.backbone))
        # RNG streams (drop-path draws from the global generator) of every rank: Lightning calls this hook on all
        # ranks (rank 0 writes the file), so the gather is reached by each
        checkpoint["tokenmix_rng"] = {"torch": torch.get_rng_state(),
                                      "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
                                      "ranks_torch": self._gather_rng(torch.get_rng_state())}
        if torch.cuda.is_available() and self.device.type == "cuda":
            checkpoint["tokenmix_rng"]["ranks_cuda"] = self._gather_rng(torch.cuda.get_rng_state(self.device))

    def _gather_rng(self, state: torch.Tensor) -> torch.Tensor:
        """(world, len(state)) uint8: the state of each rank, in rank order."""
        if self.trainer.world_size == 1:
            return state[None].clone()
        return self.trainer.strategy.all_gather(state.to(self.device)).cpu()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        epoch_end_form(checkpoint)  # before Lightning restores its loops (files written before the fix)
        check_resume_config(checkpoint, self.student.backbone.backbone_config, kind=DINO,
                            runtime=runtime_record(self.student.backbone))
        rng = checkpoint.get("tokenmix_rng")
        self._rng_to_restore = rng if isinstance(rng, dict) and "torch" in rng else None
