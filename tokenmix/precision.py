"""Precision of the evaluation passes, and of the demo run, in one place.

``inference_autocast(device)``: the frozen backbone of the probes, k-NN, analyses and TensorBoard callbacks runs
under bf16 autocast on CUDA (the 16-bit attention kernels: tensor cores, no register spills; fp32 inputs would
take the slower fp32 path), and exactly as before, in fp32, on the CPU. Outputs are bf16 on CUDA: the call sites
cast what they keep with ``.float()``.

``demo_trainer_args(rest)``: what ``make pretrain`` adds on the command line for the demo preset (``accelerator:
auto``, ``precision: bf16-mixed`` in configs/pretrain/demo.yaml): nothing on a GPU; ``--trainer.precision=32-true``
where the run will be on the CPU (no CUDA, or ``--trainer.accelerator=cpu``), so CPU runs stay bit for bit as before.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def inference_autocast(device: torch.device | str) -> Iterator[None]:
    """bf16 autocast when ``device`` is a CUDA device that supports bf16, else nothing (fp32 as it was)."""
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_bf16_supported():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            yield
    else:
        yield


def runs_on_cpu(rest: list[str]) -> bool:
    """Whether a training CLI with overrides ``rest`` will run on the CPU (no CUDA, or the accelerator set to cpu)."""
    acc = [a.split("=", 1)[1] for a in rest if a.startswith("--trainer.accelerator=")]
    return not torch.cuda.is_available() or (bool(acc) and acc[-1] == "cpu")


def cpu_precision_args(rest: list[str]) -> list[str]:
    """``["--trainer.precision=32-true"]`` when the run will be on the CPU and the command line sets no precision:
    a preset's GPU mixed precision (demo: bf16-mixed, paper: 16-mixed) falls back to fp32 there."""
    if runs_on_cpu(rest) and not any(a.startswith("--trainer.precision") for a in rest):
        return ["--trainer.precision=32-true"]
    return []


def device_line(device: torch.device | str) -> str:
    """What rank 0 of ``make probe`` / ``make analyze`` prints: where the backbone runs and in which precision."""
    dev = torch.device(device)
    if dev.type == "cuda":
        amp = "bf16 autocast" if torch.cuda.is_bf16_supported() else "fp32"
        return f"device: {torch.cuda.get_device_name(dev)} (cuda), backbone in {amp}"
    return f"device: {dev.type}, backbone in fp32"
