"""``make pretrain OBJECTIVE=supervised``: label-supervised training (LaSt-ViT's cls_pretrain recipe) via LightningCLI.

    python -m lightning_modules.supervised --variant lastvit --data demo [--data-root R] [--resume 1|PATH]
        [--preset supervised_demo|supervised_paper|<yaml>] [any LightningCLI override]

Config = configs/pretrain/<preset>.yaml (``supervised_demo`` for DATA=demo, ``supervised_paper`` otherwise),
then configs/variants/<part>.yaml per part of the variant name, then the overrides; the same pre-parser,
argument builder and CLI class as ``make pretrain`` (lightning_modules/pretrain.py). Logs, checkpoints and
summary.json: runs/<variant>/pretrain/<preset>/version_N/.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import torch
from lightning.pytorch.cli import LightningArgumentParser

from datamodules.errors import DatasetError
from datamodules.supervised import SupervisedDataModule
from lightning_modules.checkpoint_io import AtomicCheckpointIO
from lightning_modules.pretrain import (CONFIGS, PretrainCLI, build_args, build_cli, early_checks, fit,
                                         nodes_from_cluster, parse_common, resolve_resume)
from lightning_modules.supervised_module import SupervisedModule, validate_supervised_checkpoint
from tokenmix import paths
from tokenmix.io import CheckpointError
from tokenmix.launch import LaunchError, install_stop_handlers, refuse_unlaunched_multinode

PRESETS = ("supervised_demo", "supervised_paper")


class SupervisedCLI(PretrainCLI):
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("trainer.max_epochs", "model.epochs")

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list) -> Any:
        plugins = config.get("plugins") or []
        plugins = plugins if isinstance(plugins, list) else [plugins]
        if not any(isinstance(p, AtomicCheckpointIO) for p in plugins):  # PretrainCLI then keeps this one
            plugins.append(AtomicCheckpointIO(validate=validate_supervised_checkpoint))
        config["plugins"] = plugins
        return super()._instantiate_trainer(config, callbacks)


def resolve_supervised_resume(resume: str, variant: str, runs: Path) -> Optional[str]:
    """As ``pretrain.resolve_resume``, but RESUME=1 only looks at supervised runs (never a DINO last.ckpt)."""
    if resume.lower() in ("1", "true", "yes", "last"):
        base = runs / variant / "pretrain"
        found = sorted((p for p in base.glob("supervised*/**/last.ckpt")), key=lambda p: p.stat().st_mtime)
        if not found:
            raise CheckpointError(f"RESUME={resume}: no supervised last.ckpt under {base}; run `make pretrain "
                                  f"OBJECTIVE=supervised VARIANT={variant}` first or pass RESUME=<path to a .ckpt>")
        return str(found[-1])
    return resolve_resume(resume, variant, runs)


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def main(argv: Optional[list[str]] = None) -> int:
    try:
        known, rest, variant = parse_common(argv, __doc__)
    except ValueError as e:
        return _fail(str(e))
    preset = known.preset or ("supervised_demo" if known.data == "demo" else "supervised_paper")
    preset_file = CONFIGS / "pretrain" / f"{preset}.yaml" if preset in PRESETS else Path(preset)
    if not preset_file.is_file():
        return _fail(f"unknown preset '{preset}'; valid: {', '.join(PRESETS)} (configs/pretrain/) or a YAML path")
    runs = Path(known.runs_dir) if known.runs_dir else paths.RUNS
    try:
        resume_path = resolve_supervised_resume(known.resume, variant, runs)
        if resume_path:  # a DINO checkpoint must not get as far as the Trainer
            from tokenmix.io import safe_torch_load
            validate_supervised_checkpoint(safe_torch_load(Path(resume_path)), resume_path)
    except CheckpointError as e:
        return _fail(str(e))
    rest = nodes_from_cluster(rest) + rest
    try:  # the same launch checks as DINO pretraining, before any model or process exists
        early_checks(known.data, known.data_root, preset_file, rest)
    except (LaunchError, DatasetError) as e:
        return _fail(str(e))
    PretrainCLI.dist_timeout_min = known.dist_timeout
    args = build_args(variant, known.data, known.data_root, str(preset_file), runs, resume_path, rest)
    if not torch.cuda.is_available() and not any(a.startswith("--trainer.precision") for a in rest):
        args.append("--trainer.precision=32-true")  # a GPU AMP override in a preset falls back to fp32 on CPU
    try:
        cli = build_cli(SupervisedCLI, SupervisedModule, SupervisedDataModule, args)
    except SystemExit as e:
        return int(e.code or 0)
    except ValueError as e:
        return _fail(str(e))
    try:
        refuse_unlaunched_multinode(cli.trainer.num_nodes)
        have = cli.datamodule.num_classes
        if have != cli.model.hparams.num_classes:
            return _fail(f"the dataset has {have} classes but model.num_classes={cli.model.hparams.num_classes}; "
                         f"pass --model.num_classes={have}")
    except (LaunchError, DatasetError) as e:
        return _fail(str(e))
    return fit(cli, resume_path, quiet=(r".*does not have many workers.*",))


if __name__ == "__main__":
    install_stop_handlers()  # SIGTERM / SIGINT end every rank within seconds (tokenmix/launch.py)
    sys.exit(main())
