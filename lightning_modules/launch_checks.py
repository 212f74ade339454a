"""What ``make pretrain`` checks in the launching process, before any model or other process exists, on the
resolved configuration (``RunSettings``) and the RESUME point. ``check_launch`` refuses, with the reason and the
fix: a RESUME checkpoint that is not a complete one of the run's objective, a real dataset without its folder,
then what ``tokenmix.launch.check_machine`` refuses.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from backbones.checkpoint import DINO
from datamodules.pretraining import load_split
from lightning_modules.checkpoint_io import ResumePoint, resume_point
from tokenmix import paths
from tokenmix.launch import check_machine

DETERMINISTIC_CUDA = (
    "trainer.deterministic=true cannot train DINO on CUDA: the 96 px local crops interpolate the position "
    "embeddings bicubically (backbones/vit.py, interpolate_pos_encoding: F.interpolate(mode='bicubic')), "
    "and torch has no deterministic CUDA backward for that (upsample_bicubic2d_backward_out_cuda; "
    "torch.use_deterministic_algorithms lists F.interpolate bicubic among the ops that raise), so the first "
    "backward would fail. Use --trainer.deterministic=false (seeded, not bitwise reproducible) or "
    "--trainer.deterministic=warn, or the CPU (--trainer.accelerator=cpu, as the tiny preset).")


@dataclass(frozen=True)
class RunSettings:
    """The settings of one run the launch checks read, as LightningCLI resolved them."""
    kind: str              # the checkpoint kind of the objective (backbones.checkpoint.DINO / SUPERVISED)
    objective: str         # its name, for messages (dino, supervised)
    variant: str
    data: str
    demo: bool             # the data is the generated demo data (datamodules.demo.is_demo), made on first use
    data_root: str
    accelerator: str
    num_nodes: int
    deterministic: Any     # True / False / "warn" / None, as Lightning takes it
    max_epochs: Optional[int] = None
    max_steps: int = -1
    resume: str = ""       # RESUME: '' (none), 1 / last (the newest run of the objective) or a checkpoint path
    runs: Path = paths.RUNS


def check_launch(run: RunSettings) -> Optional[ResumePoint]:
    """Every check that needs no model (ValueError subclasses saying what to change) -> the RESUME point."""
    resume = resume_point(run)
    if not run.demo and not (run.data_root and Path(run.data_root).is_dir()):
        load_split(run.data, run.data_root, "train")  # the dataset's own error (no DATA_ROOT; the layout, the source)
    deterministic_dino = run.kind == DINO and str(run.deterministic).lower() == "true"
    check_machine(run.num_nodes, run.accelerator, real_data="" if run.demo else run.data,
                  gpu_refusal=DETERMINISTIC_CUDA if deterministic_dino else "")
    return resume
