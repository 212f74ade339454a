"""Dense quality watched during pretraining: a closed-form linear segmentation probe on the frozen teacher's patch
tokens, and the semantic-diffusion measures on the same images (``tokenmix.diffusion``).

At the exact starting weights (before the first step), every ``every_n_epochs`` epochs or ``every_n_steps`` steps,
and at the end, on a small labelled set (``task`` voc / ade20k; the demo VOC scenes for ``data: demo``, else the
dataset at ``data_root`` or ``$TOKENMIX_DENSE_ROOT``, evenly spaced ``max_samples`` of each split):

- ``dense_mIoU`` (+ aAcc, mAcc): ``probes.dense.ridge`` on the probe protocol's views: the same number as
  ``make probe TASK=voc CKPT=<that checkpoint> ARGS="--solver ridge --max-samples N --ridge-lambda L"``;
- ``dense_retrieval_mIoU``: dense nearest-neighbour retrieval with no head to fit (``Retrieval``: the Hummingbird
  core of ``probes.headfree.retrieval`` on the same forwards), memory of ``retrieval_memory`` training patches;
- the per-image measures of ``tokenmix.dense_measures`` (Point-in-Box of [CLS] with each class's extent in the
  validation masks as boxes, Patch Score spread, cos(patch, [CLS]), effective rank, and on the first
  ``attn_images`` validation images the attention rows' entropy and share of exact zeros over every block).

Keys: the registry's (``tokenmix.dense_measures.MEASURES``), the same as TensorBoard tags and in summary.json.

TensorBoard scalars at each point, and the whole series in summary.json (``RunSummary`` reads ``series``). Under
DDP each rank takes the shard ``shard_indices`` gives it (as ``KNNCheck``) and every statistic is a sum, added up
by one all-reduce (``reduce_sums``), so every rank gets the numbers one process gets; the retrieval memory is built
from the training shards and gathered on every rank (``gather_shards``, as ``make probe KIND=retrieval``). Each
labelled image goes through the teacher once: the first ``attn_images`` validation images with their attention
weights recorded (the explicit attention lines instead of the fused kernel, equal to float rounding).
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

from datamodules.demo import is_demo
from lightning_modules.callbacks.periodic import epoch_check_due
from probes.headfree import retrieval as hb
from tokenmix.dense_measures import ATTENTION_TERMS, MEASURES, SCALAR_TERMS, Sums, image_record

ROOT_ENV = "TOKENMIX_DENSE_ROOT"


@contextmanager
def _eval_mode(model: torch.nn.Module):
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


def _forward(model, images: torch.Tensor, device, record: bool = False):
    """``TokenMixViT.forward_record`` of the probe protocol's normalised ``images`` (what
    ``probes.core.features.FrozenFeatures`` gives the probe CLI: same call, same bits), every block recorded with
    ``record``."""
    from datamodules.transforms.views import normalize
    return model.forward_record(normalize(images.to(device)), range(model.depth) if record else ())


def add_record(sums: Sums, rec: dict[str, torch.Tensor]) -> None:
    """Add one batch's ``image_record`` terms to ``sums``."""
    for k, v in rec.items():
        sums[k] = sums.get(k, 0) + v.sum(0)


def reduce_sums(sums: Sums, dim: int, reduce) -> Sums:
    """The sums over all ranks in one ``reduce`` (every term, also one a rank never saw: zeros)."""
    names = SCALAR_TERMS
    flat = torch.cat([torch.tensor([float(sums.get(n, 0.0)) for n in names], dtype=torch.float64),
                      torch.as_tensor(sums.get("gram", torch.zeros(dim, dim)), dtype=torch.float64).flatten(),
                      sums["confusion"].double().flatten()])
    s = reduce(flat)
    g, c = s[len(names):len(names) + dim * dim], s[len(names) + dim * dim:]
    return {**{n: float(s[i]) for i, n in enumerate(names)}, "gram": g.reshape(dim, dim),
            "confusion": c.reshape(sums["confusion"].shape)}


class Retrieval:
    """Hummingbird dense retrieval on the check's own forwards, with the probe's core (``probes.headfree.retrieval``).
    Each training image gives its ``per_image(memory_size, n_train, 1, patches)`` patches (``sample_patches``,
    rarest classes first, drawn from ``image_generator(seed, 0, index)``: the same memory however the images are
    sharded); ``gather`` joins the shards on every rank; each validation patch takes the labels of its k nearest
    memory patches (cosine, softmax(cos / temperature)), scored by Hungarian matching as the probe.
    Deviations from ``make probe KIND=retrieval`` (the check has one forward per image and no second pass): the
    memory comes from the probe's plain training views (no RandomResizedCrop / colour jitter), and validation
    masks stay at label size (the ridge probe's; equal to the probe size on the demo scenes)."""

    def __init__(self, memory_size: int, n_train: int, num_patches: int, num_classes: int, patch: int,
                 k: int, temperature: float, seed: int = 0):
        self.n_keep, self.n_train = hb.per_image(memory_size, n_train, 1, num_patches), n_train
        self.C, self.patch, self.k, self.temperature, self.seed = num_classes, patch, k, temperature, seed
        self.rows: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.memory: Optional[tuple[torch.Tensor, torch.Tensor]] = None

    def add_train(self, grid: torch.Tensor, masks: torch.Tensor, indices) -> None:
        """(B, D, h, w) features and (B, H, W) masks of training images ``indices`` (their dataset indices)."""
        gens = [hb.image_generator(self.seed, 0, int(i)) for i in indices]
        self.rows.append(hb.memory_rows(grid.float(), masks, gens, self.n_keep, self.patch, self.C))

    def gather(self, dim: int, device, rank: int, world: int, all_gather) -> None:
        """Every rank calls this once (a collective when ``world`` > 1): the whole memory, on every rank."""
        from probes.core.features import gather_shards
        f = torch.cat([r[0] for r in self.rows]) if self.rows else torch.zeros(0, self.n_keep, dim, device=device)
        y = torch.cat([r[1] for r in self.rows]) if self.rows else torch.zeros(0, self.n_keep, self.C, device=device)
        f, y = (gather_shards(t.to(device), self.n_train, rank, world, all_gather) for t in (f, y))
        self.memory, self.rows = hb.memory_bank(f[:, None], y[:, None], self.n_keep), []

    def confusion(self, grid: torch.Tensor, masks) -> torch.Tensor:
        """(C, C) counts of the retrieval labelling of (B, D, h, w) validation features against their masks."""
        return hb.confusion_of(grid.float(), masks, *self.memory, self.C, self.k, self.temperature)

    @staticmethod
    def miou(confusion: torch.Tensor) -> float:
        from probes.headfree.matching import hungarian, matched_miou
        cm = confusion.round().long()
        return 100.0 * matched_miou(cm, hungarian(cm))["mIoU"]


def _results(out: dict, s: Sums, retrieval: bool, t0: float, c0: float) -> dict[str, float]:
    """One point of the series from the ridge probe's metrics and the reduced sums."""
    res = {"dense_mIoU": out["mIoU"], "dense_aAcc": out["aAcc"], "dense_mAcc": out["mAcc"],
           **({"dense_retrieval_mIoU": Retrieval.miou(s["confusion"])} if retrieval else {}),
           **{m.key: m.value(s) for m in MEASURES if m.value is not None}}
    return {**res, "dense_seconds": time.perf_counter() - t0, "dense_cpu_seconds": time.process_time() - c0}


class DenseProbeCheck(pl.Callback):
    """Configured as ``KNNCheck``: the start, ``every_n_epochs`` / ``every_n_steps`` (0: off) and the end. Place it
    before ``RunSummary`` in the callbacks, which writes its ``series`` to summary.json (module docstring: what it
    measures)."""

    def __init__(self, task: str = "voc", data: str = "demo", data_root: str = "", max_samples: int = 64,
                 ridge_lambda: float = 1e-2, batch_size: int = 16, img_size: Optional[int] = None,
                 attn_images: int = 16, every_n_epochs: int = 0, every_n_steps: int = 0,
                 retrieval_memory: int = hb.PAPER_MEMORY[0], retrieval_k: int = hb.K_NEIGHBOURS,
                 retrieval_temperature: float = hb.TEMPERATURE):
        self.task, self.data, self.data_root = task, data, data_root
        # retrieval (0: off): memory in patches (default the reference's smallest, capped at every patch), k and
        # temperature the reference's (probes.headfree.retrieval)
        self.retrieval_memory, self.retrieval_k = retrieval_memory, retrieval_k
        self.retrieval_t = retrieval_temperature
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
            from probes.core.data import probe_datamodule, probe_dataset
            from probes.core.task_table import get_task
            task = get_task(self.task)
            demo = is_demo(self.data)
            name, root = probe_dataset(task, self.data, self.data_root or os.environ.get(ROOT_ENV, ""))
            size = (self.img_size,) * 2 if self.img_size else (task.demo_img_size if demo else task.img_size)
            self._dm = probe_datamodule(task, name, root, size, patch_size, batch_size=self.batch_size,
                                        max_samples=self.max_samples)
            self._dm.setup("fit")
        return self._dm

    def setup(self, trainer, pl_module, stage=None):
        if not self.data_root and not is_demo(self.data) and not os.environ.get(ROOT_ENV):
            rank_zero_warn(f"DenseProbeCheck: data={self.data} needs data_root or ${ROOT_ENV} (the folder holding "
                           f"{self.task}); the dense check is off for this run")
            self.disabled = True
            return
        self.datamodule(pl_module.teacher.backbone.patch_size)  # a missing or malformed dataset fails here, first

    # -- the check --------------------------------------------------------------------------------
    def _loader(self, ds, rank: int, world: int) -> tuple[DataLoader, list[int]]:
        """This rank's shard of ``ds`` and the shard's indices into ``ds``, in loader order."""
        from datamodules.datamodule_base import dense_collate, shard_indices
        idx = shard_indices(len(ds), rank, world)
        return DataLoader(Subset(ds, idx), batch_size=self.batch_size, shuffle=False, collate_fn=dense_collate), idx

    def _retrieval(self, dm, model) -> Optional[Retrieval]:
        if not self.retrieval_memory:
            return None
        h, w = (s // model.patch_size for s in dm.img_size)
        return Retrieval(self.retrieval_memory, len(dm.train_set), h * w, dm.num_classes, model.patch_size,
                         self.retrieval_k, self.retrieval_t)

    @torch.no_grad()
    def evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, float]:
        """Every rank calls this (the probe's two all-reduces, the retrieval memory's gather, then ``reduce_sums``'
        one); returns the same numbers on every rank."""
        from probes.dense.ridge import run_ridge_probe
        t0, c0 = time.perf_counter(), time.process_time()
        model = pl_module.teacher.backbone
        dm = self.datamodule(model.patch_size)
        rank, world, device, bs = trainer.global_rank, trainer.world_size, pl_module.device, self.batch_size

        def reduce(t: torch.Tensor) -> torch.Tensor:  # sum over processes (float64 on CPU; NCCL needs the device)
            if world == 1:
                return t
            return trainer.strategy.reduce(t.to(device), reduce_op="sum").to("cpu", torch.float64)

        C, D = dm.num_classes, model.embed_dim
        sums: Sums = {"confusion": torch.zeros(C, C, dtype=torch.float64)}
        retrieval = self._retrieval(dm, model)

        def train():  # one forward feeds the ridge probe and the retrieval memory
            loader, idx = self._loader(dm.train_set, rank, world)
            for b, batch in enumerate(loader):
                grid = _forward(model, batch["image"], device)[2]
                if retrieval is not None:
                    retrieval.add_train(grid, batch["mask"], idx[b * bs:][:len(grid)])
                yield grid, batch["mask"]

        def val():  # one forward feeds both probes, the diffusion measures and (first images) the attention's
            if retrieval is not None:  # every rank, before its first batch (a shard may be empty)
                retrieval.gather(D, device, rank, world, lambda t: trainer.strategy.all_gather(t))
            loader, idx = self._loader(dm.val_set, rank, world)
            for b, batch in enumerate(loader):
                first = torch.tensor(idx[b * bs:][:len(batch["image"])]) < self.attn_images
                cls, patch, grid, attns = _forward(model, batch["image"], device, record=bool(first.any()))
                masks = batch["mask"] if isinstance(batch["mask"], list) else list(batch["mask"])
                add_record(sums, image_record(cls, patch, masks, grid.shape[-2:]))
                if attns:
                    add_record(sums, {k: v for k, v in image_record(
                        cls.cpu()[first], patch.cpu()[first], [m for m, f in zip(masks, first) if f], grid.shape[-2:],
                        [a[first.to(a.device)] for a in attns]).items() if k in ATTENTION_TERMS})
                if retrieval is not None:
                    sums["confusion"] += retrieval.confusion(grid, masks).double()
                yield grid, masks

        with _eval_mode(model):
            out = run_ridge_probe(train(), val(), C, self.ridge_lambda, D, reduce)
        return _results(out, reduce_sums(sums, D, reduce), retrieval is not None, t0, c0)

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
        retrieval = f", retrieval mIoU {res['dense_retrieval_mIoU']:.2f}" if "dense_retrieval_mIoU" in res else ""
        rank_zero_info(f"dense check ({when}, step {step}): mIoU {res['dense_mIoU']:.2f}{retrieval}, PiB "
                       f"{res['diffusion_pib_cls']:.1f}, cos(patch, CLS) {res['diffusion_cls_patch_cosine']:.3f}, "
                       f"eff. rank {res['diffusion_effective_rank']:.1f} ({res['dense_seconds']:.1f} s)")

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
            spent = sum(p["dense_seconds"] for p in self.series[self._first:])
            self.share = spent / max(time.perf_counter() - self._t0, 1e-9)
            rank_zero_info(f"dense checks: {spent:.1f} s, {100 * self.share:.1f} % of this fit's wall time")

    def summary_entries(self) -> dict[str, Any]:
        """summary.json entries: the series and the last point's values."""
        if not self.series:
            return {}
        last = self.series[-1]
        return {"dense_series": self.series, "dense_check_share": self.share,
                **{k: v for k, v in last.items() if k.startswith(("dense_", "diffusion_"))}}
