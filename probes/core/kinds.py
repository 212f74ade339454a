"""How each kind of probe runs: one ``ProbeKind`` per ``Kind`` in ``KINDS`` (its options class, features, default
epochs and DataModule batch size, how it runs, its summary line), in the style of dinov2's eval registries.

    >>> from probes.core.kinds import KINDS
    >>> from probes.core.task_table import Kind
    >>> KINDS[Kind.SEG].epochs, KINDS[Kind.SEG].batch_size
    (40, 16)
    >>> KINDS[Kind.SEG].summary({"mIoU": 41.2, "aAcc": 80.0})
    'mIoU 41.20, aAcc 80.00'

``run_layers(ctx, layer, logger)`` runs one probe per block selection of --layer (``parse_layers``), each by
``ProbeKind.run(ctx, spec, logger)``, which returns its metrics; the trained kinds also save
the head as ``head_<key>.pt`` in the run folder. A kind reads its own typed options (``ctx.options``, the class
beside its protocol, built once by ``probes.core.flags.kind_options``) and nothing else of the command line.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch

from backbones.load import BackboneInfo
from tokenmix.cli import Launch
from tokenmix.launch import global_rank

from probes.core.features import FeatureSpec, FrozenFeatures
from probes.core.options import Training
from probes.core.task_table import Kind, TaskSpec
from probes.core.trainer import make_trainer
from probes.dense.module_depth import build_depth
from probes.dense.module_seg import build_seg
from probes.dense.options import DepthOptions, SegOptions, Solver, dense_spec
from probes.dense.ridge import run_ridge_kind
from probes.headfree.runners import OverclusterOptions, RetrievalOptions, run_overcluster, run_retrieval
from probes.instance import copy_detection as cd
from probes.instance import image_retrieval as ir
from probes.linear.knn import KnnOptions, run_knn
from probes.linear.knn import summary_line as knn_line
from probes.linear.module_linear import LinearOptions, build_linear
from probes.video.davis_probe import DavisOptions, run_davis_kind

KindOptions = Union[KnnOptions, LinearOptions, SegOptions, DepthOptions, RetrievalOptions, OverclusterOptions,
                    DavisOptions, ir.ImageRetrievalOptions, cd.CopyDetectionOptions]


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
    probe_kind: Kind      # the kind that runs: --kind, else the task's
    progress: bool = False  # --progress: Lightning's progress bar
    log_dir: Optional[Path] = None
    kind: Optional[Kind] = None  # --kind: the task's own kind (None) or a head-free one (task_table.ALT_KINDS)

    @property
    def patch_size(self) -> int:
        return getattr(self.info.model, "patch_size", 16)

    @property
    def depth(self) -> int:
        return int(getattr(self.info.model, "depth", 1))


# --------------------------------------------------------------------------- trained heads

def train_head(ctx: ProbeContext, spec: FeatureSpec, logger, *, kind: "ProbeKind", key: str) -> dict[str, Any]:
    """Build the kind's probe on frozen features, fit it for --max-epochs (default: the kind's) and save the head."""
    train: Training = ctx.options.train
    features = FrozenFeatures(ctx.info.model, spec, bf16=getattr(ctx.options, "bf16", True))  # linear: fp32 (DINO)
    module = kind.build(ctx, features, {"cache_dtype": torch.float16 if train.cache_fp16 else torch.float32})
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


# --------------------------------------------------------------------------- features and summaries

def cls_spec(options: KindOptions, depth: int, blocks, n_last: int = 1) -> FeatureSpec:
    return FeatureSpec(kind="cls", n_last_blocks=min(n_last, depth), blocks=blocks)


def patch_spec(options: KindOptions, depth: int, blocks) -> FeatureSpec:
    """The head-free dense probes: the patch tokens of one block (the last, as the Hummingbird reference)."""
    return FeatureSpec(kind="dense", n_last_blocks=1, blocks=blocks, with_cls=False)


def _miou_series(m: dict) -> dict:
    return {k: v["mIoU"] for k, v in m["mIoU"].items()}


def _retrieval_line(m: dict) -> str:
    return "retrieval mIoU " + ", ".join(f"memory {k}: {v['mIoU']:.2f}" for k, v in m["mIoU"].items())


def _cluster_line(m: dict) -> str:
    return "overclustering mIoU " + ", ".join(f"K={k}: {v['mIoU']:.2f}" for k, v in m["mIoU"].items())


@dataclass(frozen=True)
class ProbeKind:
    kind: Kind
    options: type                         # the options class it reads (beside its protocol)
    features: Callable[..., FeatureSpec]  # (its options, backbone depth, blocks) -> what the probe reads
    summary: Callable[[dict], str]        # one result -> the line printed at the end
    epochs: int = 0                       # default --max-epochs (0: nothing is trained)
    batch_size: Optional[int] = None      # default --batch-size per device of its DataModule (None: no DataModule;
                                          # the options carry their own, e.g. DavisOptions.batch_size)
    build: Optional[Callable] = None      # (ctx, FrozenFeatures, common kwargs) -> LightningModule
    runner: Optional[Callable] = None     # (ctx, its options, FeatureSpec, logger) -> metrics, no head to train
    profile: Optional[Callable[[dict], dict]] = None  # one result -> {series: value}, plotted over blocks (LAYER=all)
    scalars: Optional[Callable[[dict], dict]] = None  # one result -> TensorBoard {tag: value} (trained: their own)

    def run(self, ctx: ProbeContext, spec: FeatureSpec, logger, key: str = "default") -> dict[str, Any]:
        if not isinstance(ctx.options, self.options):
            raise TypeError(f"the {self.kind.value} probe reads {self.options.__name__}, not "
                            f"{type(ctx.options).__name__}")
        if self.runner is not None:
            metrics = self.runner(ctx, ctx.options, spec, logger)
        elif isinstance(ctx.options, SegOptions) and ctx.options.solver == Solver.RIDGE:
            metrics = run_ridge_kind(ctx, spec)
        else:
            return train_head(ctx, spec, logger, kind=self, key=key)
        if logger is not None and metrics and self.scalars is not None and global_rank() == 0:
            for tag, value in self.scalars(metrics).items():
                logger.experiment.add_scalar(tag, value, 0)
            logger.experiment.flush()
        return metrics


KINDS: dict[Kind, ProbeKind] = {k.kind: k for k in [
    ProbeKind(Kind.KNN, KnnOptions, cls_spec, knn_line, batch_size=64, runner=run_knn,  # DINO eval_knn
              scalars=lambda m: {f"knn/top1_k{k}": v for k, v in m["top1"].items()}),
    ProbeKind(Kind.LINEAR, LinearOptions, partial(cls_spec, n_last=4), lambda m: f"best top-1 {m['best_top1']:.2f}",
              epochs=100, batch_size=256, build=build_linear),  # DINO eval_linear: [CLS] of the last 4 blocks
    ProbeKind(Kind.SEG, SegOptions, dense_spec, lambda m: f"mIoU {m['mIoU']:.2f}, aAcc {m['aAcc']:.2f}",
              epochs=40, batch_size=16, build=build_seg, scalars=lambda m: {"val/mIoU": m["mIoU"]}),  # --solver ridge
    ProbeKind(Kind.DEPTH, DepthOptions, partial(dense_spec, cls_default=True),  # DINOv2 depth: patch tokens + [CLS]
              lambda m: f"RMSE {m['rmse']:.4f}, AbsRel {m['abs_rel']:.4f}, d1 {m['d1']:.4f}",
              epochs=40, batch_size=16, build=build_depth),
    ProbeKind(Kind.RETRIEVAL, RetrievalOptions, patch_spec, _retrieval_line, batch_size=16,
              runner=run_retrieval, profile=_miou_series,  # Hummingbird: mIoU per memory size
              scalars=lambda m: {f"retrieval/mIoU_mem{k}": v for k, v in _miou_series(m).items()}),
    ProbeKind(Kind.OVERCLUSTER, OverclusterOptions, patch_spec, _cluster_line, batch_size=16,
              runner=run_overcluster, profile=_miou_series,  # Leopart-style overclustering: mIoU per K
              scalars=lambda m: {f"overcluster/mIoU_K{k}": v for k, v in _miou_series(m).items()}),
    ProbeKind(Kind.DAVIS, DavisOptions, patch_spec, lambda m: f"J&F {m['J&F-Mean']:.2f} (J {m['J-Mean']:.2f}, "
              f"F {m['F-Mean']:.2f})", runner=run_davis_kind),  # DINO's video segmentation
    ProbeKind(Kind.IMAGE_RETRIEVAL, ir.ImageRetrievalOptions, cls_spec, ir.summary_line,
              runner=ir.run_image_retrieval_kind, profile=ir.profile,  # DINO eval_image_retrieval + revisitop mAP
              scalars=lambda m: {f"image_retrieval/mAP_{p}": v for p, v in m["mAP"].items()}),
    ProbeKind(Kind.COPY_DETECTION, cd.CopyDetectionOptions, cd.copy_spec, cd.summary_line,
              runner=cd.run_copy_detection_kind, profile=cd.profile,  # DINO eval_copy_detection
              scalars=lambda m: {f"copy_detection/mAP_{b.replace('/', '_')}": v for b, v in m["mAP"].items()}),
]}


def parse_layers(layer: str, depth: int) -> list[Optional[list[int]]]:
    """'' -> [None] (protocol default); 'all' -> [[0], ..., [depth-1]]; 'k' / 'a,b' -> one probe per block."""
    layer = (layer or "").strip()
    if not layer:
        return [None]
    if layer == "all":
        return [[b] for b in range(depth)]
    try:
        blocks = [int(x) for x in layer.split(",")]
    except ValueError:
        raise ValueError(f"--layer {layer!r}: expected '', 'all', a block index or a comma-separated list") from None
    bad = [b for b in blocks if not -depth <= b < depth]
    if bad:
        raise ValueError(f"--layer {layer!r}: block {bad} out of range for a {depth}-block backbone (0..{depth - 1})")
    return [[b % depth] for b in blocks]


def run_layers(ctx: ProbeContext, layer: str, logger) -> tuple[dict[str, Any], Optional[dict]]:
    """One probe per block selection of --layer: (metrics, the last probe's feature spec)."""
    from lightning.pytorch.loggers import TensorBoardLogger
    kind = KINDS[ctx.probe_kind]  # one trip here for every block of --layer
    layers = parse_layers(layer, ctx.depth)
    per_layer, spec = {}, None
    for blocks in layers:
        key = "default" if blocks is None else f"block_{blocks[0]}"
        sub = logger if len(layers) == 1 else TensorBoardLogger(save_dir=str(ctx.log_dir), name=key, version="",
                                                                default_hp_metric=False)
        spec = kind.features(ctx.options, ctx.depth, blocks)
        per_layer[key] = kind.run(ctx, spec, sub, key)
    metrics = per_layer["default"] if list(per_layer) == ["default"] else {"layers": per_layer}
    return metrics, None if spec is None else spec.describe()


def summary(kind: Kind, metrics: dict) -> str:
    """The printed line of a probe run (a layer sweep: one part per block)."""
    line = KINDS[kind].summary
    if "layers" in metrics:
        return "; ".join(f"{k}: {line(v)}" for k, v in metrics["layers"].items() if v)
    return line(metrics)
