"""What ``make pretrain OBJECTIVE=...`` chooses (``OBJECTIVES``): the LightningModule and DataModule LightningCLI
builds, the presets, the checkpoint kind, and the check each objective makes once its objects exist.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lightning.pytorch.cli import LightningCLI
from backbones.checkpoint import DINO, SUPERVISED
from datamodules.pretraining import DINOPretrainDataModule
from datamodules.supervised import SupervisedDataModule
from lightning_modules.dino_module import DINOPretrainModule, scaled_lr
from lightning_modules.supervised_module import SupervisedModule
from tokenmix import paths
from tokenmix.launch import global_rank

PRESETS_DIR = paths.REPO / "configs" / "pretrain"
PAPER_TOTAL_BATCH = 1024  # 64 per GPU x 8 GPUs x 2 nodes


@dataclass(frozen=True)
class Objective:
    """What ``--objective`` chooses: the classes LightningCLI builds and what differs around them."""
    name: str
    model: type
    data: type
    kind: str                        # the kind its checkpoints record (backbones.checkpoint)
    presets: tuple[str, ...]         # configs/pretrain/<preset>.yaml
    default_presets: tuple[str, str]  # for DATA=demo, for a real dataset
    links: tuple[tuple[str, str], ...]  # one source of truth for values two objects need
    quiet: tuple[str, ...]           # Lightning's warnings expected by design (regexes), silenced during the fit
    check: Callable[[LightningCLI], None]  # its check once the objects exist (before other processes)

    def default_preset(self, demo: bool) -> str:
        return self.default_presets[0 if demo else 1]

    def preset_file(self, preset: str) -> Path:
        """configs/pretrain/<preset>.yaml of its presets, else ``preset`` as a YAML path; else ValueError."""
        if preset in self.presets:
            return PRESETS_DIR / f"{preset}.yaml"
        if Path(preset).is_file():
            return Path(preset)
        raise ValueError(f"unknown preset '{preset}' for --objective {self.name}; valid: {', '.join(self.presets)} "
                         "(configs/pretrain/) or a YAML path")


def scale_line(cli: LightningCLI) -> str:
    """World size, per-device / total batch, lr after the linear scaling rule, precision, vs the paper's 1024."""
    trainer, hp, dm = cli.trainer, cli.model.hparams, cli.datamodule
    world = trainer.world_size
    total = int(dm.batch_size) * world
    lr = scaled_lr(hp.lr, total, hp.scale_lr)
    where = (f"{trainer.num_nodes} node(s) x {trainer.num_devices} {type(trainer.accelerator).__name__[:-11]}"
             f" device(s)")
    ratio = (f"= the paper's {PAPER_TOTAL_BATCH}" if total == PAPER_TOTAL_BATCH
             else f"= {total / PAPER_TOTAL_BATCH:.4g} x the paper's {PAPER_TOTAL_BATCH}")
    return (f"scale: world size {world} ({where}), batch {dm.batch_size} per device x {world} = {total} total "
            f"{ratio}, lr {lr:.3g} (base {hp.lr:g} x {total}/256), precision {trainer.precision}")


def check_dino(cli: LightningCLI) -> None:
    """The dataset layout (``DataModule.setup``, which fit reuses), and the validation split the callbacks read on
    the first step. Rank 0 prints the scale line."""
    dm = cli.datamodule
    dm.setup("fit")  # DatasetError naming DATA_ROOT and the expected layout
    if any(type(cb).__name__ in ("PretrainVisuals", "KNNCheck") for cb in cli.trainer.callbacks):
        dm.eval_dataset(dm.val_split)
    if global_rank() == 0:  # the processes Lightning starts run this too
        print(scale_line(cli), flush=True)


def check_supervised(cli: LightningCLI) -> None:
    """The dataset's class count is the classifier's."""
    have, want = cli.datamodule.num_classes, cli.model.hparams.num_classes
    if have != want:
        raise ValueError(f"the dataset has {have} classes but model.num_classes={want}; "
                         f"pass --model.num_classes={have}")


OBJECTIVES = {
    # the frozen EMA teacher is in eval mode on purpose (no drop-path, as the official teacher)
    "dino": Objective("dino", DINOPretrainModule, DINOPretrainDataModule, DINO, ("paper", "demo", "demo_long", "tiny"),
                      ("demo", "paper"), (("trainer.max_epochs", "model.epochs"),
                                          ("data.n_local_crops", "model.n_local_crops")),
                      (r"Found \d+ module\(s\) in eval mode",), check_dino),
    "supervised": Objective("supervised", SupervisedModule, SupervisedDataModule, SUPERVISED,
                            ("supervised_demo", "supervised_paper"), ("supervised_demo", "supervised_paper"),
                            (("trainer.max_epochs", "model.epochs"),), (r".*does not have many workers.*",),
                            check_supervised),
}


def objective_named(name: str) -> Objective:
    if name not in OBJECTIVES:
        raise ValueError(f"--objective {name!r}: valid are {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name]
