"""Helpers of the multi-process tests, importable by the processes Lightning starts (tests/ is on their PYTHONPATH);
the pausable pretraining below also serves the 1-process SIGKILL test (tests/test_resume.py).

``RankSeed``: a different RNG stream per rank. ``RankReport``: every rank writes what only it can see (BatchNorm types and running means of the teacher head,
its world size) to ``<dir>/rank<r>.json`` at the end of training.
Run as a script: ``probes ...`` / ``analyses ...`` (see ``_probes_main``, ``_analyses_main``), or ``lightning_modules.pretrain.main`` with an optional pause inside step ``PAUSE_AT_STEP`` (every
rank writes ``<PAUSE_DIR>/rank<r>`` and sleeps) so a test can SIGKILL the whole run mid-training. Marker files,
not a line on the shared stdout: two ranks writing one pipe can interleave a line so that no line starts with
the word, and a blocking ``readline`` cannot honour a deadline.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import torch


class RankReport(pl.Callback):
    def __init__(self, out_dir: str):
        self.out_dir = out_dir

    def on_train_end(self, trainer, pl_module):
        bns = [m for m in pl_module.teacher.head.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
        report = {"world_size": trainer.world_size, "rank": trainer.global_rank,
                  "teacher_head_bn": [type(m).__name__ for m in bns],
                  "teacher_head_bn_training": [m.training for m in bns],
                  "teacher_head_running_mean": [m.running_mean.tolist() for m in bns]}
        Path(self.out_dir).mkdir(parents=True, exist_ok=True)
        (Path(self.out_dir) / f"rank{trainer.global_rank}.json").write_text(json.dumps(report))


class RankSeed(pl.Callback):
    """Gives each rank its own drop-path RNG stream from the first step (official DINO seeds every rank alike),
    so a resume that restored rank 0's state on every rank would not reproduce rank 1's draws."""

    def on_train_start(self, trainer, pl_module):
        if trainer.global_step == 0:
            torch.manual_seed(1000 + trainer.global_rank)


def _pausing_main() -> int:
    from lightning_modules import dino_module
    pause = int(os.environ.get("PAUSE_AT_STEP", "-1"))
    orig = dino_module.DINOPretrainModule.training_step

    def step(self, batch, batch_idx):
        if self.global_step == pause:
            marker = Path(os.environ["PAUSE_DIR"]) / f"rank{self.global_rank}"
            marker.write_text(str(os.getpid()))
            time.sleep(600)
        return orig(self, batch, batch_idx)
    dino_module.DINOPretrainModule.training_step = step
    from lightning_modules.pretrain import main
    return main(sys.argv[1:])


def _probes_main() -> int:
    """``probes <common flags> -- <task> <task> ...``: one probe per task in this one multi-process session
    (Lightning reuses the process group for every Trainer of the script)."""
    from probes.run import main
    args = sys.argv[2:]
    common, tasks = args[:args.index("--")], args[args.index("--") + 1:]
    for task in tasks:
        main(["--task", task, *common, *(["--no-aug"] if task == "imagenet" else [])])
    return 0


def _analyses_main() -> int:
    """``analyses <common flags> -- <task> <task> ...``: ``analysis.run`` for each task in this one session."""
    from analysis.run import main
    args = sys.argv[2:]
    common, tasks = args[:args.index("--")], args[args.index("--") + 1:]
    for task in tasks:
        main(["--task", task, *common])
    return 0


if __name__ == "__main__":
    from tokenmix.launch import install_stop_handlers
    install_stop_handlers()
    mode = {"probes": _probes_main, "analyses": _analyses_main}.get(sys.argv[1] if len(sys.argv) > 1 else "")
    sys.exit(mode() if mode else _pausing_main())
