"""How each kind of probe runs: one ``ProbeKind`` per ``tasks.Kind`` in ``KINDS`` (its features, default epochs
and batch size, how it runs, its summary line), in the style of dinov2's eval registries.

    >>> from probes.core.kinds import KINDS
    >>> from probes.core.task_table import Kind
    >>> KINDS[Kind.SEG].epochs, KINDS[Kind.SEG].batch_size
    (40, 16)
    >>> KINDS[Kind.SEG].summary({"mIoU": 41.2, "aAcc": 80.0})
    'mIoU 41.20, aAcc 80.00'

``run(ctx, spec, logger)`` returns the metrics of one probe on one block selection; the trained kinds also save
the head as ``head_<key>.pt`` in the run folder. A kind reads its own typed options (``ctx.options``, one class of
probes/core/options.py per kind, built once by ``probes.run``) and nothing else of the command line.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from tokenmix.cli import Launch
from tokenmix.knn import knn_top1_topk
from tokenmix.launch import global_rank, on_gpu

from backbones.load import BackboneInfo
from probes.instance import copy_detection as cd
from probes.instance import image_retrieval as ir
from probes.video.davis_probe import DavisSettings, run_davis_kind
from probes.core.features import FeatureSpec, FrozenFeatures, extraction_module
from probes.headfree.runners import run_overcluster, run_retrieval
from probes.core.options import (DepthHead, DepthOptions, KindOptions, KnnOptions, LinearOptions, OverclusterOptions,
                      RetrievalOptions, SegOptions, Solver, Training)
from probes.core.task_table import Kind, TaskSpec
from probes.core.trainer import make_trainer


@dataclass
class ProbeContext:
    """Everything one probe run reads: the task, the backbone, the task's DataModule (both splits, possibly subset,
    with the protocol's views), the processes, and the options of the kind that runs."""
    task: TaskSpec
    info: BackboneInfo
    dm: Any
    size: tuple[int, int]
    dataset: str  # resolved dataset name (demo_voc, voc, ...)
    root: Path
    launch: Launch
    options: KindOptions  # the options of ``probe_kind`` (``KINDS[probe_kind].options``)
    progress: bool = False  # --progress: Lightning's progress bar
    log_dir: Optional[Path] = None
    kind: Optional[Kind] = None  # --kind: the task's own kind (None) or a head-free one (tasks.ALT_KINDS)

    @property
    def probe_kind(self) -> Kind:
        return self.kind or self.task.kind

    @property
    def patch_size(self) -> int:
        return getattr(self.info.model, "patch_size", 16)

    @property
    def depth(self) -> int:
        return int(getattr(self.info.model, "depth", 1))


# --------------------------------------------------------------------------- k-NN (no training)

def extract_all(ctx: ProbeContext, features: FrozenFeatures) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(features, labels) of each split of ``ctx.dm``, sharded over the processes and gathered on every rank."""
    module = extraction_module(features)
    make_trainer(ctx.launch, ctx.progress, logger=False, enable_checkpointing=False).predict(
        module, datamodule=ctx.dm, return_predictions=False)
    return module.results


def run_knn(ctx: ProbeContext, spec: FeatureSpec, logger) -> dict[str, Any]:
    """DINO eval_knn: Resize 256 + CenterCrop 224 for both splits, weighted k-NN vote at temperature T."""
    opts: KnnOptions = ctx.options
    t0 = time.perf_counter()
    (ftr, ytr), (fva, yva) = extract_all(ctx, FrozenFeatures(ctx.info.model, spec))
    if global_rank() != 0:  # every rank took part in the extraction; rank 0 votes and reports
        return {}
    if on_gpu(ctx.launch.accelerator):  # similarity matrix on the GPU (DINO keeps the features there)
        ftr, fva = ftr.cuda(), fva.cuda()
    res = knn_top1_topk(ftr, ytr, fva, yva, ctx.dm.num_classes, ks=list(opts.ks), T=opts.temperature)
    if logger is not None:
        for k, v in res.items():
            logger.experiment.add_scalar(f"knn/top1_k{k}", v["top1"], 0)
        logger.experiment.flush()
    return {"top1": {k: v["top1"] for k, v in res.items()}, "top5": {k: v["top5"] for k, v in res.items()},
            "num_train": len(ytr), "num_val": len(yva), "seconds": time.perf_counter() - t0}


# --------------------------------------------------------------------------- trained heads

def _common(train: Training) -> dict[str, Any]:
    return dict(cache_dtype=torch.float16 if train.cache_fp16 else torch.float32)


def build_linear(ctx: ProbeContext, features: FrozenFeatures, kw: dict):
    from probes.linear.module_linear import LinearClassificationProbe
    opts: LinearOptions = ctx.options  # aug: the DataModule's train view is eval_linear's RandomResizedCrop + flip
    return LinearClassificationProbe(features, ctx.dm, ctx.dm.num_classes, lr=opts.train.lr,
                                     cache=not opts.aug and opts.train.cache, **kw)


def build_seg(ctx: ProbeContext, features: FrozenFeatures, kw: dict):
    from probes.dense.module_seg import SegmentationProbe
    opts: SegOptions = ctx.options
    lr = {"lr": opts.train.lr} if opts.train.lr else {}
    return SegmentationProbe(features, ctx.dm, ctx.dm.num_classes, cache=opts.train.cache, **lr, **kw)


def build_depth(ctx: ProbeContext, features: FrozenFeatures, kw: dict):
    from probes.dense.module_depth import DepthProbe
    from probes.core.task_table import depth_eval_settings
    opts: DepthOptions = ctx.options
    lo, hi, crop, clip = depth_eval_settings(ctx.dataset, getattr(ctx.dm, "val_set", None))  # custom: its own
    return DepthProbe(features, ctx.dm, min_depth=lo, max_depth=hi, crop=crop, clip=clip,
                      classify=opts.depth_head == DepthHead.BINS, norm=opts.bin_norm.value, cache=opts.train.cache,
                      **({"lr": opts.train.lr} if opts.train.lr else {}), **kw)


def train_head(ctx: ProbeContext, spec: FeatureSpec, logger, *, kind: "ProbeKind", key: str) -> dict[str, Any]:
    """Build the kind's probe on frozen features, fit it for --max-epochs (default: the kind's) and save the head."""
    train: Training = ctx.options.train
    module = kind.build(ctx, FrozenFeatures(ctx.info.model, spec), _common(train))
    trainer = make_trainer(ctx.launch, ctx.progress, max_epochs=train.max_epochs or kind.epochs, logger=logger,
                           enable_checkpointing=False, num_sanity_val_steps=0, log_every_n_steps=1,
                           reload_dataloaders_every_n_epochs=1)
    t0 = time.perf_counter()
    trainer.fit(module)  # the frozen backbone is in eval mode on purpose (trainer.lightning_console)
    metrics = {**module.last_metrics, "history": module.history, "seconds": time.perf_counter() - t0}
    if global_rank() == 0 and ctx.log_dir is not None:
        from tokenmix.io import atomic_torch_save
        atomic_torch_save(module.head.state_dict(), ctx.log_dir / f"head_{key}.pt")
    return metrics


def run_ridge(ctx: ProbeContext, spec: FeatureSpec, logger) -> dict[str, Any]:
    """--solver ridge (segmentation): the closed-form probe of probes/dense/ridge.py that the pretraining's
    DenseProbeCheck runs, in one process (fast: one pass over each split)."""
    from torch.utils.data import DataLoader

    from datamodules.datamodule_base import dense_collate

    from probes.dense.ridge import run_ridge_probe
    opts: SegOptions = ctx.options
    if ctx.launch.devices not in (None, 1, "1", "auto") or ctx.launch.num_nodes not in (None, 1):
        raise ValueError("--solver ridge runs in one process: drop --devices / --num-nodes")
    loaders = [DataLoader(ds, batch_size=ctx.dm.batch_size, shuffle=False, collate_fn=dense_collate)
               for ds in (ctx.dm.train_set, ctx.dm.val_set)]
    dev = torch.device("cuda" if on_gpu(ctx.launch.accelerator) else "cpu")  # the GPU when there is one, as k-NN
    features = FrozenFeatures(ctx.info.model, spec).to(dev)
    train, val = (((features(b["image"].to(dev)), b["mask"]) for b in loader) for loader in loaders)
    m = run_ridge_probe(train, val, ctx.dm.num_classes, opts.ridge_lambda, features.out_dim)
    if logger is not None:
        logger.experiment.add_scalar("val/mIoU", m["mIoU"], 0)
        logger.experiment.flush()
    return m


# --------------------------------------------------------------------------- features and summaries

def cls_spec(options: KindOptions, depth: int, blocks, n_last: int = 1) -> FeatureSpec:
    return FeatureSpec(kind="cls", n_last_blocks=min(n_last, depth), blocks=blocks)


def dense_spec(options: "SegOptions | DepthOptions", depth: int, blocks, cls_default: bool = False) -> FeatureSpec:
    with_cls = options.with_cls if options.with_cls is not None else cls_default
    n_last = options.head.blocks
    return FeatureSpec(kind="dense", n_last_blocks=min(n_last, depth), blocks=blocks, with_cls=with_cls)


def patch_spec(options: KindOptions, depth: int, blocks) -> FeatureSpec:
    """The head-free dense probes: the patch tokens of one block (the last, as the Hummingbird reference)."""
    return FeatureSpec(kind="dense", n_last_blocks=1, blocks=blocks, with_cls=False)


def _miou_series(m: dict) -> dict:
    return {k: v["mIoU"] for k, v in m["mIoU"].items()}


def _retrieval_line(m: dict) -> str:
    return "retrieval mIoU " + ", ".join(f"memory {k}: {v['mIoU']:.2f}" for k, v in m["mIoU"].items())


def _cluster_line(m: dict) -> str:
    return "overclustering mIoU " + ", ".join(f"K={k}: {v['mIoU']:.2f}" for k, v in m["mIoU"].items())


def _knn_line(m: dict) -> str:
    return "k-NN top-1 " + ", ".join(f"k={k}: {v:.2f}" for k, v in m["top1"].items())


@dataclass(frozen=True)
class ProbeKind:
    kind: Kind
    options: type                         # the options class it reads (probes/core/options.py)
    features: Callable[..., FeatureSpec]  # (its options, backbone depth, blocks) -> what the probe reads
    summary: Callable[[dict], str]        # one result -> the line printed at the end
    epochs: int = 0                       # default --max-epochs (0: nothing is trained)
    batch_size: int = 64                  # default --batch-size (per device)
    build: Optional[Callable] = None      # (ctx, FrozenFeatures, common kwargs) -> LightningModule
    runner: Optional[Callable] = None     # (ctx, its options, FeatureSpec, logger) -> metrics, no head to train
    profile: Optional[Callable[[dict], dict]] = None  # one result -> {series: value}, plotted over blocks (LAYER=all)

    def run(self, ctx: ProbeContext, spec: FeatureSpec, logger, key: str = "default") -> dict[str, Any]:
        if not isinstance(ctx.options, self.options):
            raise TypeError(f"the {self.kind.value} probe reads {self.options.__name__}, not "
                            f"{type(ctx.options).__name__}")
        if self.runner is not None:
            return self.runner(ctx, ctx.options, spec, logger)
        if self.build is None:
            return run_knn(ctx, spec, logger)
        if isinstance(ctx.options, SegOptions) and ctx.options.solver == Solver.RIDGE:
            return run_ridge(ctx, spec, logger)
        return train_head(ctx, spec, logger, kind=self, key=key)


KINDS: dict[Kind, ProbeKind] = {k.kind: k for k in [
    ProbeKind(Kind.KNN, KnnOptions, cls_spec, _knn_line),  # DINO eval_knn: last-block [CLS]
    ProbeKind(Kind.LINEAR, LinearOptions, partial(cls_spec, n_last=4), lambda m: f"best top-1 {m['best_top1']:.2f}",
              epochs=100, batch_size=256, build=build_linear),  # DINO eval_linear: [CLS] of the last 4 blocks
    ProbeKind(Kind.SEG, SegOptions, dense_spec, lambda m: f"mIoU {m['mIoU']:.2f}, aAcc {m['aAcc']:.2f}",
              epochs=40, batch_size=16, build=build_seg),
    ProbeKind(Kind.DEPTH, DepthOptions, partial(dense_spec, cls_default=True),  # DINOv2 depth: patch tokens + [CLS]
              lambda m: f"RMSE {m['rmse']:.4f}, AbsRel {m['abs_rel']:.4f}, d1 {m['d1']:.4f}",
              epochs=40, batch_size=16, build=build_depth),
    ProbeKind(Kind.RETRIEVAL, RetrievalOptions, patch_spec, _retrieval_line, batch_size=16,
              runner=run_retrieval, profile=_miou_series),  # Hummingbird: mIoU per memory size
    ProbeKind(Kind.OVERCLUSTER, OverclusterOptions, patch_spec, _cluster_line, batch_size=16,
              runner=run_overcluster, profile=_miou_series),  # Leopart-style overclustering: mIoU per K
    ProbeKind(Kind.DAVIS, DavisSettings, patch_spec, lambda m: f"J&F {m['J&F-Mean']:.2f} (J {m['J-Mean']:.2f}, "
              f"F {m['F-Mean']:.2f})", batch_size=8, runner=run_davis_kind),  # DINO's video segmentation
    ProbeKind(Kind.IMAGE_RETRIEVAL, ir.RetrievalConfig, cls_spec, ir.summary_line, batch_size=1,
              runner=ir.run_image_retrieval_kind, profile=ir.profile),  # DINO eval_image_retrieval + revisitop mAP
    ProbeKind(Kind.COPY_DETECTION, cd.CopyDetectionConfig, cd.copy_spec, cd.summary_line, batch_size=16,
              runner=cd.run_copy_detection_kind, profile=cd.profile),  # DINO eval_copy_detection
]}


def summary(kind: Kind, metrics: dict) -> str:
    """The printed line of a probe run (a layer sweep: one part per block)."""
    line = KINDS[kind].summary
    if "layers" in metrics:
        return "; ".join(f"{k}: {line(v)}" for k, v in metrics["layers"].items() if v)
    return line(metrics)
