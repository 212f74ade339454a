"""``make pretrain``: training through LightningCLI, DINO self-distillation or label-supervised classification.

    python -m lightning_modules.pretrain [--objective dino|supervised] --variant entmax --data demo
        [--data-root R] [--resume 1|PATH] [--preset P|<yaml>] [--runs-dir D] [--dist-timeout MIN]
        [--config my.yaml ...] [any LightningCLI override, e.g. --trainer.max_epochs=5]

This file parses its own flags and launches: ``objectives.py`` says what ``--objective`` picks (module, data,
presets, checkpoint kind), ``cli.py`` resolves the configuration once (preset, configs/variants/<part>.yaml per
part of the variant name, ``--config`` files, overrides), ``launch_checks.py`` checks it here before any model or
other process exists.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Optional

from lightning.pytorch.utilities import rank_zero_info

from backbones import parse_variant
from datamodules.demo import is_demo
from datamodules.errors import DatasetError
from lightning_modules.cli import PretrainCLI, PretrainFlags
from lightning_modules.dino_module import NonFiniteLossError
from lightning_modules.objectives import objective_named
from tokenmix import paths
from tokenmix.cli import error_exit
from tokenmix.io import CheckpointError
from tokenmix.launch import DEFAULT_TIMEOUT_MIN, global_rank, install_stop_handlers


def _flags() -> argparse.ArgumentParser:
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


def parse_launch(argv: Optional[list[str]]) -> PretrainFlags:
    """This entry point's flags -> ``PretrainFlags``; the other arguments go to LightningCLI as they are. ValueError
    for an unknown objective, preset or variant: fail before anything is built."""
    known, rest = _flags().parse_known_args(list(sys.argv[1:] if argv is None else argv))
    if known.help:
        print(__doc__)
        rest = rest + ["--help"]
    objective = objective_named(known.objective)
    preset = objective.preset_file(known.preset or objective.default_preset(demo=is_demo(known.data)))
    return PretrainFlags(objective=objective, variant=parse_variant(known.variant).name, data=known.data,
                         data_root=known.data_root, preset=preset,
                         runs=Path(known.runs_dir) if known.runs_dir else paths.RUNS, resume=known.resume,
                         dist_timeout_min=known.dist_timeout, user_args=tuple(rest))


def main(argv: Optional[list[str]] = None) -> int:
    try:
        launch = parse_launch(argv)
        cli = PretrainCLI(launch)  # resolves the configuration, checks it, then builds the objects
    except SystemExit as e:  # jsonargparse already printed the reason (unknown key, bad value, --help)
        return int(e.code or 0)
    except (ValueError, CheckpointError) as e:  # LaunchError and DatasetError are ValueErrors
        return error_exit(e, 2)
    if cli.resume and cli.resume.finished:
        if global_rank() == 0:  # a requeued job, a study cell run again: train nothing, write nothing
            print(cli.resume.finished, flush=True)
        return 0
    return fit(cli, launch.objective.quiet)


def fit(cli: PretrainCLI, quiet: tuple[str, ...] = ()) -> int:
    """``trainer.fit``: exit 0, or 1 with the reason on a non-finite loss, an incompatible checkpoint or bad data
    met during training. ``quiet``: Lightning's warnings (regexes) expected by design, ignored during this fit."""
    resume_path = cli.resume.path if cli.resume else None
    if resume_path:
        rank_zero_info(f"resuming from {resume_path}")
    try:
        with warnings.catch_warnings():
            for pattern in quiet:
                warnings.filterwarnings("ignore", message=pattern)
            cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=resume_path)
    except (NonFiniteLossError, CheckpointError, DatasetError) as e:
        return error_exit(e, 1)
    return 0


if __name__ == "__main__":
    install_stop_handlers()  # SIGTERM / SIGINT end every rank within seconds (tokenmix/launch.py)
    sys.exit(main())
