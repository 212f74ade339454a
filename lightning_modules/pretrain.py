"""``make pretrain``: DINO pretraining through LightningCLI.

    python -m lightning_modules.pretrain --variant entmax --data demo [--data-root R] [--resume 1|PATH]
        [--preset demo|paper|tiny] [--dist-timeout MIN] [any LightningCLI override, e.g. --trainer.max_epochs=5]

Config = configs/pretrain/<preset>.yaml (preset defaults: ``demo`` for DATA=demo, ``paper`` otherwise), then
configs/variants/<part>.yaml for each part of the variant name (``entmax+lastvit`` -> entmax.yaml, lastvit.yaml),
then the command-line overrides. Logs and checkpoints: runs/<variant>/pretrain/<preset>/version_N/.

Before Lightning starts any other process this (launching) process checks the dataset layout, refuses
``num_nodes > 1`` outside a cluster launcher, reads the node count from SLURM / torchrun when not given, and
gives DDP a process-group timeout (``--dist-timeout``, minutes) so a world that never forms ends in an error.
"""
from __future__ import annotations

import argparse
import re
import sys
import warnings
from pathlib import Path
from typing import Any, Optional

from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info

from backbones import parse_variant
from datamodules.errors import DatasetError
from datamodules.pretraining import DINOPretrainDataModule
from lightning_modules.checkpoint_io import AtomicCheckpointIO
from lightning_modules.dino_module import DINOPretrainModule, NonFiniteLossError
from tokenmix import paths
from tokenmix.io import CheckpointError
from tokenmix.precision import cpu_precision_args
from tokenmix.launch import (DEFAULT_TIMEOUT_MIN, LaunchError, cluster_num_nodes, ddp_strategy, global_rank,
                             install_stop_handlers, refuse_unlaunched_multinode, wants_sync_batchnorm)

CONFIGS = paths.REPO / "configs"
PRESETS = ("paper", "demo", "tiny")
PAPER_TOTAL_BATCH = 1024  # 64 per GPU x 8 GPUs x 2 nodes


class PretrainCLI(LightningCLI):
    dist_timeout_min = DEFAULT_TIMEOUT_MIN

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # one source of truth for values two objects need
        parser.link_arguments("trainer.max_epochs", "model.epochs")
        parser.link_arguments("data.n_local_crops", "model.n_local_crops")

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list) -> Any:
        # always on: atomic validated checkpoints, and our own (resumable, rank-aware) sampler
        plugins = config.get("plugins") or []
        plugins = plugins if isinstance(plugins, list) else [plugins]
        if not any(isinstance(p, AtomicCheckpointIO) for p in plugins):
            plugins.append(AtomicCheckpointIO())
        config["plugins"] = plugins
        config["use_distributed_sampler"] = False
        cbs = config.get("callbacks") or []
        cbs = cbs if isinstance(cbs, list) else [cbs]
        if config.get("enable_progress_bar", True) is not False and not any(
                isinstance(c, RichProgressBar) for c in cbs):
            cbs.append(RichProgressBar())
        config["callbacks"] = cbs
        config["strategy"] = ddp_strategy(config.get("strategy", "auto"), config.get("accelerator", "auto"),
                                          config.get("devices", "auto"), config.get("num_nodes", 1),
                                          self.dist_timeout_min)
        if getattr(self.model.hparams, "use_bn_in_head", False):
            # official DINO: convert_sync_batchnorm on student and teacher under DDP
            config["sync_batchnorm"] = wants_sync_batchnorm(config["strategy"], config.get("accelerator", "auto"),
                                                            "model.use_bn_in_head")
        return super()._instantiate_trainer(config, callbacks)


def _pre_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--variant", default="softmax")
    p.add_argument("--data", default="demo")
    p.add_argument("--data-root", default="")
    p.add_argument("--resume", default="")
    p.add_argument("--preset", default="")
    p.add_argument("--runs-dir", default="", help="where runs/ lives (default: tokenmix.paths.RUNS)")
    p.add_argument("--dist-timeout", type=float, default=DEFAULT_TIMEOUT_MIN,
                   help="minutes DDP waits for the other processes before failing")
    p.add_argument("-h", "--help", action="store_true")
    return p


def resolve_resume(resume: str, variant: str, runs: Path) -> Optional[str]:
    """'' -> None; '1' / 'last' / 'true' -> newest last.ckpt of the variant; otherwise a path."""
    if not resume or resume.lower() in ("0", "false", "no"):
        return None
    if resume.lower() in ("1", "true", "yes", "last"):
        found = sorted((p for p in (runs / variant / "pretrain").glob("**/last.ckpt")  # DINO runs only
                        if not p.relative_to(runs / variant / "pretrain").parts[0].startswith("supervised")),
                       key=lambda p: p.stat().st_mtime)
        if not found:
            raise CheckpointError(f"RESUME={resume}: no last.ckpt under {runs / variant / 'pretrain'}; run "
                                  f"`make pretrain VARIANT={variant}` first or pass RESUME=<path to a .ckpt>")
        return str(found[-1])
    path = Path(resume)
    if not path.is_file():
        raise CheckpointError(f"RESUME={resume}: no such checkpoint file")
    return str(path)


def preset_file(preset: str) -> Path:
    return Path(preset) if preset not in PRESETS else CONFIGS / "pretrain" / f"{preset}.yaml"


def build_args(variant: str, data: str, data_root: str, preset: str, runs: Path, resume_path: Optional[str],
               rest: list[str]) -> list[str]:
    args = [f"--config={preset_file(preset)}"]
    for part in variant.split("+"):
        f = CONFIGS / "variants" / f"{part}.yaml"
        if f.is_file():
            args.append(f"--config={f}")
    version = None
    if resume_path:  # keep logging into the run being resumed
        ck = Path(resume_path).resolve()
        if ck.parent.name == "checkpoints" and re.fullmatch(r"version_\d+", ck.parent.parent.name):
            version = ck.parent.parent.name
    args += [f"--model.variant={variant}", f"--data.data={data}", f"--data.data_root={data_root}",
             "--trainer.logger=lightning.pytorch.loggers.TensorBoardLogger",
             f"--trainer.logger.save_dir={runs / variant / 'pretrain'}",
             f"--trainer.logger.name={preset_file(preset).stem}"]
    if version:
        args.append(f"--trainer.logger.version={version}")
    if data == "folder":  # the folder's index is cached beside the run's version folders (datamodules/folder.py)
        args.append(f"--data.index_dir={runs / variant / 'pretrain' / preset_file(preset).stem}")
    return args + rest


def nodes_from_cluster(rest: list[str]) -> list[str]:
    """``--trainer.num_nodes`` from SLURM / torchrun when the command line does not set it (else the preset's 1)."""
    if any(a.startswith("--trainer.num_nodes") for a in rest):
        return []
    n = cluster_num_nodes()
    return [f"--trainer.num_nodes={n}"] if n else []


def early_checks(data: str, data_root: str, preset_file: Path, rest: list[str]) -> None:
    """The launch checks that need no model (before a ViT is built): the node count and that DATA_ROOT exists.
    The dataset itself is read once, by ``check_launch`` (``DataModule.setup``, which fit reuses), still in
    the launching process."""
    nodes = [a.split("=", 1)[1] for a in rest if a.startswith("--trainer.num_nodes=")]
    if not nodes:
        import yaml
        nodes = [((yaml.safe_load(preset_file.read_text()) or {}).get("trainer") or {}).get("num_nodes", 1)]
    refuse_unlaunched_multinode(int(nodes[-1]))
    if data != "demo" and not Path(data_root).is_dir():  # the demo data is generated on first use instead
        from datamodules.pretraining import load_split
        load_split(data, data_root, "train")  # the dataset's own error (names the layout and the source)


def check_launch(cli: LightningCLI) -> None:
    """Everything checkable before Lightning starts other processes: node launch and the dataset layout."""
    refuse_unlaunched_multinode(cli.trainer.num_nodes)
    dm = cli.datamodule
    dm.setup("fit")  # DatasetError naming DATA_ROOT and the expected layout
    if any(type(cb).__name__ in ("PretrainVisuals", "KNNCheck") for cb in cli.trainer.callbacks):
        dm.eval_dataset(dm.val_split)  # the callbacks read the validation split on the first step


def scale_line(cli: LightningCLI) -> str:
    """World size, per-device / total batch, lr after the linear scaling rule, precision, vs the paper's 1024."""
    trainer, hp, dm = cli.trainer, cli.model.hparams, cli.datamodule
    world = trainer.world_size
    total = int(dm.batch_size) * world
    lr = hp.lr * total / 256.0 if hp.scale_lr else hp.lr  # as DINOPretrainModule.build_schedules
    where = (f"{trainer.num_nodes} node(s) x {trainer.num_devices} {type(trainer.accelerator).__name__[:-11]}"
             f" device(s)")
    ratio = (f"= the paper's {PAPER_TOTAL_BATCH}" if total == PAPER_TOTAL_BATCH
             else f"= {total / PAPER_TOTAL_BATCH:.4g} x the paper's {PAPER_TOTAL_BATCH}")
    return (f"scale: world size {world} ({where}), batch {dm.batch_size} per device x {world} = {total} total "
            f"{ratio}, lr {lr:.3g} (base {hp.lr:g} x {total}/256), precision {trainer.precision}")


def parse_common(argv: Optional[list[str]], doc: str) -> tuple[argparse.Namespace, list[str], str]:
    """The flags every training CLI shares (DINO, supervised): -> (known, LightningCLI rest, variant name).
    Raises ValueError for an unknown variant or a real dataset without DATA_ROOT: fail before building a ViT."""
    known, rest = _pre_parser().parse_known_args(list(sys.argv[1:] if argv is None else argv))
    if known.help:
        print(doc)
        rest = rest + ["--help"]
    variant = parse_variant(known.variant).name
    if known.data != "demo" and not known.data_root:
        raise ValueError(f"DATA={known.data} needs DATA_ROOT=<folder holding the dataset> (for imagenet: the "
                         "ImageFolder root with train/<wnid>/*.JPEG and val/<wnid>/*.JPEG). Use DATA=demo for the "
                         "built-in demo data.")
    return known, rest, variant


def main(argv: Optional[list[str]] = None) -> int:
    try:
        known, rest, variant = parse_common(argv, __doc__)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    preset = known.preset or ("demo" if known.data == "demo" else "paper")
    if preset not in PRESETS and not Path(preset).is_file():
        print(f"error: unknown preset '{preset}'; valid: {', '.join(PRESETS)} (configs/pretrain/)", file=sys.stderr)
        return 2
    runs = Path(known.runs_dir) if known.runs_dir else paths.RUNS
    try:
        resume_path = resolve_resume(known.resume, variant, runs)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rest = nodes_from_cluster(rest) + rest
    try:
        early_checks(known.data, known.data_root, preset_file(preset), rest)
    except (LaunchError, DatasetError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args = build_args(variant, known.data, known.data_root, preset, runs, resume_path, rest)
    # mixed precision only where the device supports it (paper: 16-mixed, demo: bf16-mixed): fp32 on the CPU
    args += cpu_precision_args(rest)
    PretrainCLI.dist_timeout_min = known.dist_timeout
    try:
        cli = build_cli(PretrainCLI, DINOPretrainModule, DINOPretrainDataModule, args)
    except SystemExit as e:  # jsonargparse already printed the reason (unknown key, bad value, --help)
        return int(e.code or 0)
    except ValueError as e:  # e.g. a dataset layout error raised while building objects
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        check_launch(cli)
    except (LaunchError, DatasetError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if global_rank() == 0:  # the processes Lightning starts run this too
        print(scale_line(cli), flush=True)
    # the frozen EMA teacher is in eval mode on purpose (no drop-path, as the official teacher)
    return fit(cli, resume_path, quiet=(r"Found \d+ module\(s\) in eval mode",))


def build_cli(cli_class: type, model_class: type, data_class: type, args: list[str]) -> LightningCLI:
    """The CLI from ``args`` alone (``main(argv)`` may be called with the process's own arguments still in
    sys.argv: LightningCLI's warning about both is silenced for this call only)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
        return cli_class(model_class, data_class, run=False, args=args, subclass_mode_model=False,
                         subclass_mode_data=False, save_config_kwargs={"overwrite": True},
                         auto_configure_optimizers=False)


def fit(cli: LightningCLI, resume_path: Optional[str], quiet: tuple[str, ...] = ()) -> int:
    """``trainer.fit`` for every training CLI: exit 0, or 1 with the reason on a non-finite loss, an incompatible
    checkpoint or bad data met during training. ``quiet``: warning messages (regexes) expected by design,
    ignored during this fit only."""
    if resume_path:
        rank_zero_info(f"resuming from {resume_path}")
    try:
        with warnings.catch_warnings():
            for pattern in quiet:
                warnings.filterwarnings("ignore", message=pattern)
            cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=resume_path)
    except (NonFiniteLossError, CheckpointError, DatasetError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    install_stop_handlers()  # SIGTERM / SIGINT end every rank within seconds (tokenmix/launch.py)
    sys.exit(main())
