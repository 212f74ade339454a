"""``make probe TASK=...``: one probe on one frozen backbone, results.json + TensorBoard in a fresh folder.

    python -m probes.run --task voc --variant entmax --ckpt '' --data demo --data-root '' --layer ''
    python -m probes.run --task knn --ckpt random      # baselines: random (untrained ViT), pixels (raw patches)
    python -m probes.run --task nyuv2 --layer all      # one probe per block
    python -m probes.run --task voc --kind retrieval    # head-free: Hummingbird retrieval (or --kind overcluster)

Output: runs/<variant | variant_random | pixels>/probe/<task>/version_N/{results.json, events.*, head*.pt};
results.json follows the one schema of tokenmix/results.py. How each kind of probe runs: probes/core/kinds.py.

The flags (over a --config file's defaults) become one typed ``ProbeConfig`` here, once (``make_config``); below
this file nothing reads the command line: each kind gets its own options (``probes.core.flags.OPTIONS``).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from backbones.load import checkpoint_path, resolve_backbone
from datamodules.demo import is_demo
from tokenmix import paths
from tokenmix.cli import BackboneFlags, Launch, finish_eval_args
from tokenmix.io import CheckpointError
from tokenmix.launch import LaunchError, count_devices, global_rank, install_stop_handlers, on_gpu
from tokenmix.precision import device_line
from tokenmix.results import backbone_entry, write_results

from probes.core.data import DATAMODULES, probe_datamodule, probe_dataset, voc_trainaug
from probes.core.flags import OPTIONS, parse_flags, protocol_img_size
from probes.core.kinds import KINDS, KindOptions, ProbeContext, summary
from probes.core.task_table import ALT_KINDS, Kind, TaskSpec, get_task
from probes.core.trainer import lightning_console
from probes.dense.options import Solver
from probes.headfree.runners import RetrievalOptions


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


def resolve_kind(task: TaskSpec, kind: str) -> Optional[Kind]:
    """--kind: '' or the task's own kind -> None; a head-free kind the task's data feeds (tasks.ALT_KINDS)."""
    kind = (kind or "").strip()
    if not kind or kind == task.kind.value:
        return None
    alts = ALT_KINDS.get(task.kind, ())
    if kind not in [k.value for k in alts]:
        ok = ", ".join(k.value for k in alts) or "none besides its own"
        raise ValueError(f"--kind {kind!r} does not apply to task {task.name!r} ({task.kind.value}); kinds it takes: "
                         f"{ok}. Retrieval and overclustering run on the segmentation tasks (voc, ade20k, "
                         "cityscapes, seg)")
    return Kind(kind)


# --------------------------------------------------------------------------- the run's one typed config

@dataclass(frozen=True)
class ProbeData:
    """The task's data: which dataset, the probe input, the loaders."""
    data: str        # --data ('demo', a dataset name, your own layout)
    data_root: str
    size: tuple[int, int]  # probe input (H, W): --img-size, else the task's (demo: its demo size)
    batch_size: Optional[int]  # per device: --batch-size, else the kind's (None: the kind has no DataModule)
    num_workers: int
    aug: bool              # not --no-aug (the linear probe's training view)
    train_split: str
    val_split: Optional[str]  # None: the task's (val; depth: test)
    max_samples: Optional[int]


@dataclass(frozen=True)
class ProbeConfig:
    """Everything one ``make probe`` reads, typed and resolved once from the flags (``make_config``)."""
    task: TaskSpec
    kind: Optional[Kind]          # --kind: None = the task's own, else a head-free kind (tasks.ALT_KINDS)
    backbone: BackboneFlags
    checkpoint: Optional[Path]    # the file --ckpt names (None: random / pixels), found once before the data
    seed: int
    patch_size: int               # of --ckpt pixels
    data: ProbeData
    layer: str                    # --layer
    launch: Launch
    progress: bool
    options: KindOptions          # the running kind's own (its class beside its protocol)
    runs_dir: Path
    record: dict[str, Any]        # the resolved flags, as results.json's config records them
    note: Optional[str] = None    # the first line of the output: DATA chosen for the user (DATA_ROOT alone)

    @property
    def probe_kind(self) -> Kind:
        return self.kind or self.task.kind


def make_config(f: argparse.Namespace) -> ProbeConfig:
    """The run's config from the parsed flags: the task and kind looked up, the shared eval flags checked
    (``tokenmix.cli.finish_eval_args``), --quick applied, the kind's options built, and the checkpoint file found
    (a wrong CKPT fails before the data is opened or generated)."""
    task = get_task(f.task.strip())
    kind = resolve_kind(task, f.kind)
    probe_kind = kind or task.kind
    if f.solver == Solver.RIDGE.value and probe_kind != Kind.SEG:
        raise ValueError(f"--solver ridge is for segmentation tasks, not {probe_kind.value}")
    note = None
    if not (f.data or "").strip() and f.data_root:  # DATA_ROOT alone names the task's own dataset
        f = argparse.Namespace(**{**vars(f), "data": task.dataset})
        note = f"[probe] DATA={task.dataset}: task {task.name}'s own dataset (DATA_ROOT given, DATA not)"
    demo = is_demo(f.data or "demo")
    ev = finish_eval_args(f, demo=demo, accelerator=f.accelerator)
    max_epochs, max_samples = (f.max_epochs or 2, f.max_samples or 16) if f.quick else (f.max_epochs, f.max_samples)
    f = argparse.Namespace(**{**vars(f), "max_epochs": max_epochs, "max_samples": max_samples})
    record = {**vars(f), "variant": ev.backbone.variant, "ckpt": ev.backbone.ckpt, "data": ev.data,
              "arch": ev.backbone.arch, "num_nodes": ev.launch.num_nodes}
    size = task.input_size(protocol_img_size(f, probe_kind), demo)
    data = ProbeData(ev.data, ev.data_root, size, f.batch_size or KINDS[probe_kind].batch_size, f.num_workers,
                     not f.no_aug, f.train_split, f.val_split, max_samples)
    return ProbeConfig(task, kind, ev.backbone, checkpoint_path(ev.backbone.ckpt, ev.backbone.variant), f.seed,
                       f.patch_size or (8 if demo else 16), data, f.layer, ev.launch, f.progress,
                       OPTIONS[probe_kind](f, task, size[0]), Path(f.runs_dir) if f.runs_dir else paths.RUNS,
                       record, note)


def parse_args(argv: Optional[list[str]] = None) -> ProbeConfig:
    """The command line (and its --config file) -> the run's ``ProbeConfig``."""
    return make_config(parse_flags(argv))


def run_name(ctx: ProbeContext) -> str:
    """The task's folder and results.json name: voc, or voc_retrieval for a head-free kind on it."""
    return ctx.task.name if ctx.kind is None else f"{ctx.task.name}_{ctx.kind.value}"


def build_context(cfg: ProbeConfig) -> ProbeContext:
    """The backbone, the task's DataModule (both splits, subset by --max-samples) and the probe input size."""
    d, b = cfg.data, cfg.backbone
    name, root = probe_dataset(cfg.task, d.data, d.data_root)  # a wrong DATA_ROOT fails before weights are read
    options = cfg.options
    if isinstance(options, RetrievalOptions) and options.trainaug:  # the retrieval protocol's VOC trainaug
        name, note = voc_trainaug(name, root)
        if note:
            import warnings
            warnings.warn(note, stacklevel=2)
            options = replace(options, train_note=note)
    info = resolve_backbone(b.ckpt, b.variant, b.arch, cfg.patch_size, seed=cfg.seed, which=b.which.value,
                            path=cfg.checkpoint)
    dm = None  # a task whose kind has no DataModule (davis) reads its own data
    if cfg.task.kind in DATAMODULES:
        dm = probe_datamodule(cfg.task, name, root, d.size, getattr(info.model, "patch_size", 16),
                              num_workers=d.num_workers, batch_size=d.batch_size, aug=d.aug,
                              train_split=d.train_split, val_split=d.val_split, max_samples=d.max_samples)
        dm.setup("fit")
    return ProbeContext(cfg.task, info, dm, d.size, name, root, cfg.launch, options, cfg.progress,
                        kind=cfg.kind)


def run_layers(ctx: ProbeContext, layer: str, logger) -> tuple[dict[str, Any], Optional[dict]]:
    """One probe per block selection of --layer: (metrics, the last probe's feature spec)."""
    from lightning.pytorch.loggers import TensorBoardLogger
    kind = KINDS[ctx.probe_kind]
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


def write_probe_results(cfg: ProbeConfig, ctx: ProbeContext, metrics: dict, features: Optional[dict]) -> Path:
    info = ctx.info
    config = {**cfg.record, "dataset": ctx.dataset, "data_root": str(ctx.root), "img_size": list(ctx.size),
              "features": features, "val_split": cfg.data.val_split or ctx.task.val_split,
              **({} if ctx.dm is None else {"num_train": len(ctx.dm.train_set), "num_val": len(ctx.dm.val_set)})}
    marker = ctx.root / ".demo_complete.json"
    if is_demo(ctx.dataset) and marker.is_file():  # which generation of the demo data was measured
        config["demo_data"] = json.loads(marker.read_text())
    return write_results(ctx.log_dir, task=run_name(ctx), variant=info.run_name, data=cfg.data.data,
                         metrics=metrics, config=config,
                         backbone=backbone_entry(info.config, info.checkpoint, info.sha256, info.source))


def run(cfg: ProbeConfig) -> Path:
    """One probe run of ``cfg``: results.json, TensorBoard events and heads in a fresh version folder."""
    import lightning as L
    from lightning.pytorch.loggers import TensorBoardLogger
    if cfg.note and global_rank() == 0:
        print(cfg.note, flush=True)
    L.seed_everything(cfg.seed, verbose=False)
    ctx = build_context(cfg)
    if global_rank() == 0:  # GPU + bf16 (DINO's protocols: fp32 unless --bf16), or CPU fp32
        bf16 = getattr(cfg.options, "bf16", True)
        print(f"[probe] {device_line('cuda' if on_gpu(cfg.launch.accelerator) else 'cpu', bf16)}", flush=True)
    probe_dir = cfg.runs_dir / ctx.info.run_name / "probe"
    version = paths.run_version(probe_dir / run_name(ctx), count_devices(cfg.launch.accelerator,
                                                                         cfg.launch.devices) > 1)
    logger = TensorBoardLogger(save_dir=str(probe_dir), name=run_name(ctx), version=version,
                               default_hp_metric=False)
    ctx.log_dir = Path(logger.log_dir)
    try:
        metrics, features = run_layers(ctx, cfg.layer, logger)
        if global_rank() != 0:  # the other processes of a multi-device run: rank 0 writes the results
            return ctx.log_dir / "results.json"
        path = write_probe_results(cfg, ctx, metrics, features)
        if "layers" in metrics and KINDS[ctx.probe_kind].profile is not None:
            from probes.core.profile import plot_depth_profile
            plot_depth_profile(metrics["layers"], KINDS[ctx.probe_kind].profile, ctx.log_dir / "depth_profile.png",
                               title=f"{run_name(ctx)} on {ctx.info.run_name}")
    finally:
        paths.release_version()  # a next run in this process claims its own folder
    print(f"[probe] {run_name(ctx)} on {ctx.info.run_name}: {summary(ctx.probe_kind, metrics)}\n"
          f"[probe] results: {path}")
    return path


def main(argv: Optional[list[str]] = None) -> Optional[Path]:
    flags = parse_flags(argv)
    if flags.print_config:
        get_task(flags.task.strip())  # an unknown task is an error here too
        import yaml
        print(yaml.safe_dump({k: v for k, v in vars(flags).items() if k != "print_config"}, sort_keys=False))
        return None
    cfg = make_config(flags)
    with lightning_console():  # Lightning's device banner once per run, whatever the number of Trainers
        return run(cfg)


def cli() -> None:
    install_stop_handlers()  # SIGTERM / SIGINT end every rank within seconds (tokenmix/launch.py)
    try:
        main()
    except (ValueError, FileNotFoundError, KeyError, CheckpointError, LaunchError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        print(f"probe error: {msg}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    cli()
