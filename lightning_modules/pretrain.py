"""``make pretrain``: training through LightningCLI, DINO self-distillation or label-supervised classification.

    python -m lightning_modules.pretrain [--objective dino|supervised] --variant entmax --data demo
        [--data-root R] [--resume 1|PATH] [--preset P|<yaml>] [--dist-timeout MIN]
        [any LightningCLI override, e.g. --trainer.max_epochs=5]

``--objective`` (``make pretrain OBJECTIVE=...``, default ``dino``) picks the LightningModule, the DataModule, the
presets and the checkpoint kind (``OBJECTIVES``). Config = configs/pretrain/<preset>.yaml (DINO: ``demo`` for
DATA=demo, ``paper`` otherwise, or ``tiny``; supervised: ``supervised_demo`` / ``supervised_paper``), then
configs/variants/<part>.yaml for each part of the variant name (``entmax+lastvit`` -> entmax.yaml, lastvit.yaml),
then the command-line overrides. Logs and checkpoints: runs/<variant>/pretrain/<preset>/version_N/.

Before Lightning starts any other process this (launching) process checks the dataset layout and the RESUME
checkpoint's kind, refuses ``num_nodes > 1`` outside a cluster launcher, reads the node count from SLURM / torchrun
when not given, and gives DDP a process-group timeout (``--dist-timeout``, minutes) so a world that never forms
ends in an error.
"""
from __future__ import annotations

import argparse
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info

from backbones import parse_variant
from datamodules.demo import is_demo
from datamodules.errors import DatasetError
from datamodules.pretraining import DINOPretrainDataModule
from datamodules.supervised import SupervisedDataModule
from lightning_modules.callbacks.checkpoint_io import AtomicCheckpointIO, validate_pretrain_checkpoint
from lightning_modules.callbacks.end_checkpoint import EndCheckpoint
from lightning_modules.callbacks.progress import LogStepProgressBar
from lightning_modules.dino_module import DINOPretrainModule, NonFiniteLossError
from lightning_modules.loop_state import epoch_end_form, epochs_trained
from lightning_modules.supervised_module import SupervisedModule, validate_supervised_checkpoint
from tokenmix import paths
from tokenmix.io import CheckpointError, safe_torch_load
from tokenmix.precision import cpu_precision_args
from tokenmix.launch import (DEFAULT_TIMEOUT_MIN, LaunchError, cluster_num_nodes, ddp_strategy, global_rank,
                             install_stop_handlers, refuse_silent_cpu, refuse_unlaunched_multinode,
                             wants_sync_batchnorm)

CONFIGS = paths.REPO / "configs"
PAPER_TOTAL_BATCH = 1024  # 64 per GPU x 8 GPUs x 2 nodes


@dataclass(frozen=True)
class Objective:
    """What ``--objective`` chooses: the classes LightningCLI builds and what differs around them."""
    name: str
    model: type
    data: type
    presets: tuple[str, ...]         # configs/pretrain/<preset>.yaml
    default_presets: tuple[str, str]  # for DATA=demo, for a real dataset
    validate: Callable[[Any, str], dict]  # a checkpoint of this objective (RESUME, AtomicCheckpointIO)
    links: tuple[tuple[str, str], ...]  # one source of truth for values two objects need
    quiet: tuple[str, ...]           # warnings expected by design (regexes), silenced during the fit
    check: Callable[[LightningCLI], None]  # its launch checks once the CLI is built (before other processes)


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


def check_dino(cli: LightningCLI) -> None:
    """DINO's launch checks: the dataset layout (``DataModule.setup``, which fit reuses), and the validation split
    the callbacks read on the first step. Rank 0 prints the scale line."""
    dm = cli.datamodule
    dm.setup("fit")  # DatasetError naming DATA_ROOT and the expected layout
    if any(type(cb).__name__ in ("PretrainVisuals", "KNNCheck") for cb in cli.trainer.callbacks):
        dm.eval_dataset(dm.val_split)
    if global_rank() == 0:  # the processes Lightning starts run this too
        print(scale_line(cli), flush=True)


def check_supervised(cli: LightningCLI) -> None:
    """The dataset's class count is the classifier's."""
    have = cli.datamodule.num_classes
    if have != cli.model.hparams.num_classes:
        raise ValueError(f"the dataset has {have} classes but model.num_classes={cli.model.hparams.num_classes}; "
                         f"pass --model.num_classes={have}")


OBJECTIVES = {
    # the frozen EMA teacher is in eval mode on purpose (no drop-path, as the official teacher)
    "dino": Objective("dino", DINOPretrainModule, DINOPretrainDataModule, ("paper", "demo", "tiny"), ("demo", "paper"),
                      validate_pretrain_checkpoint, (("trainer.max_epochs", "model.epochs"),
                                                     ("data.n_local_crops", "model.n_local_crops")),
                      (r"Found \d+ module\(s\) in eval mode",), check_dino),
    "supervised": Objective("supervised", SupervisedModule, SupervisedDataModule,
                            ("supervised_demo", "supervised_paper"), ("supervised_demo", "supervised_paper"),
                            validate_supervised_checkpoint, (("trainer.max_epochs", "model.epochs"),),
                            (r".*does not have many workers.*",), check_supervised),
}
PRESETS = OBJECTIVES["dino"].presets


class PretrainCLI(LightningCLI):
    """LightningCLI for both objectives (``objective``, set by ``main``)."""
    dist_timeout_min = DEFAULT_TIMEOUT_MIN
    objective = OBJECTIVES["dino"]

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        for source, target in self.objective.links:
            parser.link_arguments(source, target)

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list) -> Any:
        # always on: atomic validated checkpoints, and our own (resumable, rank-aware) sampler
        plugins = config.get("plugins") or []
        plugins = plugins if isinstance(plugins, list) else [plugins]
        if not any(isinstance(p, AtomicCheckpointIO) for p in plugins):
            plugins.append(AtomicCheckpointIO(validate=self.objective.validate))
        config["plugins"] = plugins
        config["use_distributed_sampler"] = False
        cbs = config.get("callbacks") or []
        cbs = cbs if isinstance(cbs, list) else [cbs]
        if not any(isinstance(c, EndCheckpoint) for c in cbs):
            cbs.append(EndCheckpoint())  # last.ckpt holds the end of fit (a RESUME=1 after it trains nothing)
        if config.get("enable_progress_bar", True) is not False and not any(isinstance(c, ProgressBar) for c in cbs):
            cbs.append(LogStepProgressBar())  # the loss read back once per logging interval, not every step
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
    p.add_argument("--objective", default="dino",
                   help="dino: DINO self-distillation; supervised: LaSt-ViT's label-supervised recipe")
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


def resolve_resume(resume: str, variant: str, runs: Path, objective: str = "dino") -> Optional[str]:
    """'' -> None; '1' / 'last' / 'true' -> newest last.ckpt of the variant's ``objective`` runs; otherwise a path."""
    if not resume or resume.lower() in ("0", "false", "no"):
        return None
    if resume.lower() in ("1", "true", "yes", "last"):
        try:
            return str(paths.latest_checkpoint(variant, objective, runs))
        except FileNotFoundError as e:
            raise CheckpointError(f"RESUME={resume}: {e}") from None
    path = Path(resume)
    if not path.is_file():
        raise CheckpointError(f"RESUME={resume}: no such checkpoint file")
    return str(path)


def preset_file(preset: str) -> Path:
    """A preset's YAML: configs/pretrain/<preset>.yaml for a named preset (either objective), else the path."""
    named = any(preset in o.presets for o in OBJECTIVES.values())
    return CONFIGS / "pretrain" / f"{preset}.yaml" if named else Path(preset)


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
    if data == "folder":  # the folder's index is cached beside the run's version folders (datamodules/datasets/)
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
    refuse_unlaunched_multinode(int(trainer_setting(rest, preset_file, "num_nodes", 1)))
    if not is_demo(data) and not Path(data_root).is_dir():  # the demo data is generated on first use instead
        from datamodules.pretraining import load_split
        load_split(data, data_root, "train")  # the dataset's own error (names the layout and the source)


def trainer_setting(rest: list[str], preset: Path, key: str, default: Any = None) -> Any:
    """``trainer.<key>`` as the run will see it: the last command-line override (``--trainer.key=v`` or
    ``--trainer.key v``), else the preset's, else ``default``."""
    flag, found = f"--trainer.{key}", None
    for i, a in enumerate(rest):
        if a.startswith(flag + "="):
            found = a.split("=", 1)[1]
        elif a == flag and i + 1 < len(rest):
            found = rest[i + 1]
    if found is not None:
        return found
    import yaml
    return ((yaml.safe_load(preset.read_text()) or {}).get("trainer") or {}).get(key, default)


def hardware_checks(objective: str, data: str, preset: Path, rest: list[str]) -> None:
    """No silent hardware choice (LaunchError, in the launching process): a real dataset does not fall back to
    the CPU because no GPU was found, and DINO refuses ``deterministic: true`` on CUDA, whose first backward would
    raise (the reason below)."""
    accelerator = str(trainer_setting(rest, preset, "accelerator", "auto"))
    if not is_demo(data):
        refuse_silent_cpu(data, accelerator)
    on_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    if objective == "dino" and on_gpu and str(trainer_setting(rest, preset, "deterministic")).lower() == "true":
        raise LaunchError(
            "trainer.deterministic=true cannot train DINO on CUDA: the 96 px local crops interpolate the position "
            "embeddings bicubically (backbones/vit.py, interpolate_pos_encoding: F.interpolate(mode='bicubic')), "
            "and torch has no deterministic CUDA backward for that (upsample_bicubic2d_backward_out_cuda; "
            "torch.use_deterministic_algorithms lists F.interpolate bicubic among the ops that raise), so the first "
            "backward would fail. Use --trainer.deterministic=false (seeded, not bitwise reproducible) or "
            "--trainer.deterministic=warn, or the CPU (--trainer.accelerator=cpu, as the tiny preset).")


def parse_common(argv: Optional[list[str]], doc: str) -> tuple[argparse.Namespace, list[str], str]:
    """The pre-parser's flags (both objectives): -> (known, LightningCLI rest, variant name).
    Raises ValueError for an unknown variant or a real dataset without DATA_ROOT: fail before building a ViT."""
    known, rest = _pre_parser().parse_known_args(list(sys.argv[1:] if argv is None else argv))
    if known.help:
        print(doc)
        rest = rest + ["--help"]
    variant = parse_variant(known.variant).name
    if not is_demo(known.data) and not known.data_root:
        raise ValueError(f"DATA={known.data} needs DATA_ROOT=<folder holding the dataset> (for imagenet: the "
                         "ImageFolder root with train/<wnid>/*.JPEG and val/<wnid>/*.JPEG). Use DATA=demo for the "
                         "built-in demo data.")
    return known, rest, variant


def _fail(e: Exception | str) -> int:
    print(f"error: {e}", file=sys.stderr)
    return 2


def launch_plan(argv: Optional[list[str]]) -> tuple[argparse.Namespace, Objective, list[str], Optional[str],
                                                  Optional[tuple[int, int]]]:
    """The checks before any model or process exists -> (known flags, objective, LightningCLI args, resume path,
    (global step, epochs trained) of the resume checkpoint). Raises ValueError / CheckpointError / LaunchError /
    DatasetError saying what is wrong."""
    known, rest, variant = parse_common(argv, __doc__)
    if known.objective not in OBJECTIVES:
        raise ValueError(f"--objective {known.objective!r}: valid are {', '.join(OBJECTIVES)}")
    objective = OBJECTIVES[known.objective]
    preset = known.preset or objective.default_presets[0 if is_demo(known.data) else 1]
    if preset not in objective.presets and not Path(preset).is_file():
        raise ValueError(f"unknown preset '{preset}' for --objective {objective.name}; valid: "
                         f"{', '.join(objective.presets)} (configs/pretrain/) or a YAML path")
    runs = Path(known.runs_dir) if known.runs_dir else paths.RUNS
    resume_path, resume_at = resolve_resume(known.resume, variant, runs, objective.name), None
    if resume_path:  # another objective's checkpoint must not get as far as the Trainer
        ckpt = objective.validate(safe_torch_load(Path(resume_path)), resume_path)
        epoch_end_form(ckpt)  # the counters as Lightning resumes them (loop_state.py)
        resume_at = int(ckpt.get("global_step", 0)), epochs_trained(ckpt)
    rest = nodes_from_cluster(rest) + rest
    early_checks(known.data, known.data_root, preset_file(preset), rest)
    hardware_checks(objective.name, known.data, preset_file(preset), rest)
    args = build_args(variant, known.data, known.data_root, preset, runs, resume_path, rest)
    # mixed precision only where the device supports it (paper: 16-mixed, demo: bf16-mixed): fp32 on the CPU
    return known, objective, args + cpu_precision_args(rest), resume_path, resume_at


def main(argv: Optional[list[str]] = None) -> int:
    try:
        known, objective, args, resume_path, resume_at = launch_plan(argv)
    except (ValueError, CheckpointError) as e:  # LaunchError and DatasetError are ValueErrors
        return _fail(e)
    PretrainCLI.dist_timeout_min, PretrainCLI.objective = known.dist_timeout, objective
    try:
        cli = build_cli(PretrainCLI, objective.model, objective.data, args)
    except SystemExit as e:  # jsonargparse already printed the reason (unknown key, bad value, --help)
        return int(e.code or 0)
    except ValueError as e:  # e.g. a dataset layout error raised while building objects
        return _fail(e)
    if resume_at and (line := finished_line(cli.trainer, resume_path, *resume_at)):
        if global_rank() == 0:  # a requeued job, a study cell run again: train nothing, write nothing
            print(line, flush=True)
        return 0
    try:  # everything checkable before Lightning starts other processes
        refuse_unlaunched_multinode(cli.trainer.num_nodes)
        objective.check(cli)
    except ValueError as e:
        return _fail(e)
    return fit(cli, resume_path, quiet=objective.quiet)


def finished_line(trainer, resume_path: str, step: int, epochs: int) -> Optional[str]:
    """The one line saying the RESUME checkpoint's run (at ``step``, ``epochs`` trained) already reached this
    trainer's end (``max_epochs`` or ``max_steps``), or None. Such a fit would train nothing but still rewrite the
    run's summary and logs."""
    loop = trainer.fit_loop
    if not (0 <= loop.max_steps <= step or loop.max_epochs not in (None, -1) and epochs >= loop.max_epochs):
        return None
    return (f"run already finished: step {step}, epoch {epochs} of max_epochs={loop.max_epochs}, checkpoint "
            f"{resume_path}; nothing to train (raise --trainer.max_epochs to extend it)")


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
