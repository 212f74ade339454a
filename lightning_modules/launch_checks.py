"""What ``make pretrain`` checks in the launching process, before any model or other process exists, on the
configuration the run will use (``RunSettings``, which ``cli.PretrainCLI`` reads from LightningCLI's resolved
config: preset, variant files, ``--config`` files, then overrides), and the RESUME point.

``check_launch`` refuses, with the reason and the fix: ``num_nodes > 1`` outside a cluster launcher (it would wait
forever), a real dataset without DATA_ROOT or whose folder is missing, a real dataset on the CPU because no GPU is
usable, DINO with ``deterministic: true`` on CUDA; and a RESUME checkpoint that is not a complete one of the
run's objective. ``RESUME=1`` continues the newest ``last.ckpt`` of the variant whose checkpoint records the
objective's kind, whatever its preset file is called.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from backbones.checkpoint import DINO, validate_lightning
from datamodules.demo import is_demo
from datamodules.errors import needs_data_root
from lightning_modules.checkpoint_io import checkpoint_kind
from lightning_modules.loop_state import epoch_end_form, epochs_trained
from tokenmix import paths
from tokenmix.io import CheckpointError, safe_torch_load
from tokenmix.launch import LaunchError, on_gpu, refuse_silent_cpu, refuse_unlaunched_multinode

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
    data_root: str
    accelerator: str
    num_nodes: int
    deterministic: Any     # True / False / "warn" / None, as Lightning takes it
    max_epochs: Optional[int] = None
    max_steps: int = -1
    resume: str = ""       # RESUME: '' (none), 1 / last (the newest run of the objective) or a checkpoint path
    runs: Path = paths.RUNS


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a run continues: where it is, how far it trained, the version folder it logs into, and, when
    that run already reached this run's end, the one line saying so (a requeued job, a study cell run again: such a
    fit would train nothing but still rewrite the run's summary and logs)."""
    path: str
    step: int
    epochs: int
    version: Optional[str]
    finished: Optional[str] = None


def check_launch(run: RunSettings) -> Optional[ResumePoint]:
    """Every check that needs no model (ValueError subclasses saying what to change) -> the RESUME point."""
    resume = resume_point(run)
    refuse_unlaunched_multinode(run.num_nodes)
    if not is_demo(run.data):  # the demo data is generated on first use instead
        if not run.data_root:
            raise needs_data_root(run.data)
        if not Path(run.data_root).is_dir():
            from datamodules.pretraining import load_split
            load_split(run.data, run.data_root, "train")  # the dataset's own error (names the layout and the source)
        refuse_silent_cpu(run.data, run.accelerator)
    if run.kind == DINO and on_gpu(run.accelerator) and str(run.deterministic).lower() == "true":
        raise LaunchError(DETERMINISTIC_CUDA)
    return resume


def resume_point(run: RunSettings) -> Optional[ResumePoint]:
    """The RESUME checkpoint, validated as one of the run's objective (another objective's checkpoint must not get
    as far as the Trainer), with its counters as Lightning resumes them (loop_state.py)."""
    path = resume_path(run.resume, run.variant, run.runs, run.kind, run.objective)
    if path is None:
        return None
    ckpt = validate_lightning(safe_torch_load(Path(path)), path, kind=run.kind)
    epoch_end_form(ckpt)
    where = Path(path).resolve()  # a checkpoint in <version>/checkpoints/: the resumed run keeps logging there
    in_version = where.parent.name == "checkpoints" and re.fullmatch(r"version_\d+", where.parent.parent.name)
    step, epochs = int(ckpt.get("global_step", 0)), epochs_trained(ckpt)
    return ResumePoint(path, step, epochs, where.parent.parent.name if in_version else None,
                       finished_line(path, step, epochs, run.max_epochs, run.max_steps))


def resume_path(resume: str, variant: str, runs: Path, kind: str = DINO, objective: str = "dino") -> Optional[str]:
    """'' -> None; '1' / 'last' / 'true' -> the newest last.ckpt of the variant whose checkpoint is of ``kind``
    (read from the file: unreadable ones are kept, for the validation to name); otherwise a path."""
    if not resume or resume.lower() in ("0", "false", "no"):
        return None
    if resume.lower() in ("1", "true", "yes", "last"):
        try:
            return str(paths.latest_checkpoint(variant, runs, accept=lambda p: checkpoint_kind(p) in (None, kind),
                                               objective=objective))
        except FileNotFoundError as e:
            raise CheckpointError(f"RESUME={resume}: {e}") from None
    if not Path(resume).is_file():
        raise CheckpointError(f"RESUME={resume}: no such checkpoint file")
    return resume


def finished_line(path: str, step: int, epochs: int, max_epochs: Optional[int], max_steps: int) -> Optional[str]:
    """The line saying a checkpoint at ``step`` after ``epochs`` epochs already reached ``max_epochs`` or
    ``max_steps`` (Lightning's limits: no max_epochs and no max_steps means 1000 epochs), or None."""
    if max_epochs is None:
        max_epochs = 1000 if max_steps == -1 else -1
    if not (0 <= max_steps <= step or max_epochs != -1 and epochs >= max_epochs):
        return None
    return (f"run already finished: step {step}, epoch {epochs} of max_epochs={max_epochs}, checkpoint "
            f"{path}; nothing to train (raise --trainer.max_epochs to extend it)")
