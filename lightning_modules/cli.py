"""The LightningCLI of ``make pretrain`` (``PretrainCLI``): the argument list, the configuration resolved once,
and the Trainer every training run gets. Arguments in LightningCLI's order: the preset, the variant's files
(``configs/variants/<part>.yaml``), the entry point's flags, then the user's ``--config`` files and overrides;
the node count (SLURM / torchrun) and fp32 on the CPU where the arguments set none; then
``launch_checks.check_launch`` reads the result before any class is built.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from datamodules.demo import is_demo
from datamodules.pretraining import FOLDER
from lightning_modules.callbacks.end_checkpoint import EndCheckpoint
from lightning_modules.callbacks.progress import LogStepProgressBar
from lightning_modules.checkpoint_io import AtomicCheckpointIO
from lightning_modules.launch_checks import RunSettings, check_launch
from lightning_modules.objectives import Objective
from tokenmix import paths
from tokenmix.launch import (DEFAULT_TIMEOUT_MIN, cluster_num_nodes, ddp_strategy, hide_lightning_tips, on_gpu,
                             wants_sync_batchnorm)

VARIANTS_DIR = paths.REPO / "configs" / "variants"
UNSET = {"num_nodes": 0, "precision": "null"}  # markers: a parse over them tells what the user's arguments set


@dataclass(frozen=True)
class PretrainFlags:
    """What the entry point's own flags decide (``lightning_modules/pretrain.py``)."""
    objective: Objective
    variant: str            # canonical variant name
    data: str
    data_root: str
    preset: Path            # the preset's YAML
    runs: Path = paths.RUNS
    resume: str = ""
    dist_timeout_min: float = DEFAULT_TIMEOUT_MIN
    user_args: tuple[str, ...] = ()  # the user's LightningCLI arguments (--config files, --key=value), in order


def base_args(launch: PretrainFlags) -> list[str]:
    """The arguments before the user's: the preset, the variant's files, the entry point's flags."""
    args = [f"--config={launch.preset}"]
    args += [f"--config={f}" for part in launch.variant.split("+") if (f := VARIANTS_DIR / f"{part}.yaml").is_file()]
    return args + [f"--model.variant={launch.variant}", f"--data.data={launch.data}",
                   f"--data.data_root={launch.data_root}",
                   "--trainer.logger=lightning.pytorch.loggers.TensorBoardLogger",
                   f"--trainer.logger.save_dir={launch.runs / launch.variant / 'pretrain'}",
                   f"--trainer.logger.name={launch.preset.stem}"]


def run_settings(config: Namespace, launch: PretrainFlags) -> RunSettings:
    trainer, data = config.trainer, config.data
    return RunSettings(kind=launch.objective.kind, objective=launch.objective.name, variant=launch.variant,
                       data=str(data.data), demo=is_demo(str(data.data)), data_root=str(data.data_root or ""),
                       accelerator=str(trainer.accelerator), num_nodes=int(trainer.num_nodes or 1),
                       deterministic=trainer.deterministic, max_epochs=trainer.max_epochs,
                       max_steps=int(trainer.max_steps if trainer.max_steps is not None else -1), resume=launch.resume,
                       runs=launch.runs)


class PretrainCLI(LightningCLI):
    """LightningCLI for both objectives, built from a ``PretrainFlags`` (``run=False``: ``pretrain.fit`` runs it).
    ``resume``: the RESUME point (None: a fresh run; ``resume.finished``: it already reached this run's end).
    ``build=False``: resolve and check the configuration (``config``), build nothing."""

    def __init__(self, launch: PretrainFlags, build: bool = True):
        self.launch, self.build, self.resume = launch, build, None
        self.base = base_args(launch)
        # --print_config prints the configuration the run will use, so after _fill_from_machine (not in the parse)
        self.print_config = [a.partition("=")[2] for a in launch.user_args if a.partition("=")[0] == "--print_config"]
        self.user = [a for a in launch.user_args if a.partition("=")[0] != "--print_config"]
        hide_lightning_tips()
        super().__init__(launch.objective.model, launch.objective.data, run=False, args=self.base + self.user,
                         subclass_mode_model=False, subclass_mode_data=False, save_config_kwargs={"overwrite": True},
                         auto_configure_optimizers=False)

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        # always the argument list built here, never sys.argv (which still holds the entry point's own flags):
        # LightningCLI's warning about being given both does not apply
        self.config = parser.parse_args(args)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        for source, target in self.launch.objective.links:
            parser.link_arguments(source, target)

    def before_instantiate_classes(self) -> None:
        self._fill_from_machine()
        if self.print_config:
            print(self.parser.dump(self.config, skip_none="skip_null" in self.print_config[-1], skip_check=True))
            raise SystemExit(0)
        self.resume = check_launch(run_settings(self.config, self.launch))  # every ValueError before a model exists
        trainer, data = self.config.trainer, self.config.data
        if self.resume and self.resume.version and isinstance(trainer.logger, Namespace):
            trainer.logger.init_args.version = self.resume.version  # keep logging into the run being resumed
        if data.data == FOLDER and not data.get("index_dir"):  # the folder's index beside the run's version folders
            data.index_dir = str(self.launch.runs / self.launch.variant / "pretrain" / self.launch.preset.stem)

    def _fill_from_machine(self) -> None:
        """Where the user's arguments set no value: the node count the cluster environment states (SLURM /
        torchrun), and fp32 on the CPU for the presets' GPU mixed precision (demo: bf16-mixed, paper: 16-mixed)."""
        trainer = self.config.trainer
        # what the user's arguments set: parsed once more over markers no preset holds
        marks = [f"--trainer.{k}={v}" for k, v in UNSET.items()]
        marked = self.parser.parse_args(self.base + marks + self.user).trainer
        if marked.num_nodes == 0 and (n := cluster_num_nodes()):
            trainer.num_nodes = n
        if marked.precision is None and not on_gpu(trainer.accelerator):
            trainer.precision = "32-true"

    def instantiate_classes(self) -> None:
        if self.build:
            super().instantiate_classes()

    def after_instantiate_classes(self) -> None:
        if self.build and not (self.resume and self.resume.finished):  # a finished run: nothing will train
            self.launch.objective.check(self)

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list) -> Any:
        # always on: atomic validated checkpoints, and our own (resumable, rank-aware) sampler
        plugins = config.get("plugins") or []
        plugins = plugins if isinstance(plugins, list) else [plugins]
        if not any(isinstance(p, AtomicCheckpointIO) for p in plugins):
            plugins.append(AtomicCheckpointIO(kind=self.launch.objective.kind))
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
                                          self.launch.dist_timeout_min)
        if getattr(self.model.hparams, "use_bn_in_head", False):
            # official DINO: convert_sync_batchnorm on student and teacher under DDP
            config["sync_batchnorm"] = wants_sync_batchnorm(config["strategy"], config.get("accelerator", "auto"),
                                                            "model.use_bn_in_head")
        return super()._instantiate_trainer(config, callbacks)
