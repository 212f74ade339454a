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
from typing import Optional

from backbones.load import resolve_backbone
from datamodules.demo import is_demo
from tokenmix import paths
from tokenmix.io import CheckpointError
from tokenmix.launch import LaunchError, count_devices, global_rank, install_stop_handlers, on_gpu
from tokenmix.precision import device_line
from tokenmix.results import backbone_entry, write_results

from probes.core.data import DATAMODULES, probe_datamodule, probe_dataset, voc_trainaug
from probes.core.flags import ProbeConfig, make_config, parse_args  # noqa: F401  (make_config: tests patch it)
from probes.core.kinds import KINDS, ProbeContext, parse_layers, run_layers, summary  # noqa: F401 (parse_layers: tests)
from probes.core.trainer import lightning_console
from probes.headfree.runners import RetrievalOptions


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
    return ProbeContext(cfg.task, info, dm, d.size, name, root, cfg.launch, options, cfg.probe_kind, cfg.progress,
                        kind=cfg.kind)


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
    cfg = parse_args(argv)
    if cfg is None:  # --print-config
        return None
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
