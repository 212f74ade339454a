"""Precision of the evaluation passes (probes, k-NN, analyses, TensorBoard callbacks).

``inference_autocast(device)``: the frozen backbone of the probes, k-NN, analyses and TensorBoard callbacks runs
under bf16 autocast on CUDA (the 16-bit attention kernels: tensor cores, no register spills; fp32 inputs would
take the slower fp32 path), and exactly as before, in fp32, on the CPU. Outputs are bf16 on CUDA: the call sites
cast what they keep with ``.float()``.

The training presets' GPU mixed precision (demo: ``bf16-mixed``, paper: ``16-mixed``) becomes fp32 where the run
will be on the CPU and the user's arguments set no precision: ``lightning_modules/cli.py``.
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


def device_line(device: torch.device | str) -> str:
    """What rank 0 of ``make probe`` / ``make analyze`` prints: where the backbone runs and in which precision."""
    dev = torch.device(device)
    if dev.type == "cuda":
        amp = "bf16 autocast" if torch.cuda.is_bf16_supported() else "fp32"
        return f"device: {torch.cuda.get_device_name(dev)} (cuda), backbone in {amp}"
    return f"device: {dev.type}, backbone in fp32"
