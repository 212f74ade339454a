"""Precision of the evaluation passes (probes, k-NN, analyses, TensorBoard callbacks).

``inference_autocast(device, enabled)``: the frozen backbone of the dense probes, analyses and TensorBoard callbacks
runs under bf16 autocast on CUDA (the 16-bit attention kernels: tensor cores, no register spills; fp32 inputs would
take the slower fp32 path), and in fp32 on the CPU. DINO's own protocols (k-NN, linear, revisited Oxford / Paris,
Copydays, DAVIS) run in fp32 on CUDA too, as DINO does, unless ``make probe ARGS=--bf16`` (docs/probes/).
Outputs are bf16 on CUDA: the call sites cast what they keep with ``.float()``.

The training presets' GPU mixed precision (demo: ``bf16-mixed``, paper: ``16-mixed``) becomes fp32 where the run
will be on the CPU and the user's arguments set no precision: ``lightning_modules/cli.py``.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def inference_autocast(device: torch.device | str, enabled: bool = True) -> Iterator[None]:
    """bf16 autocast when ``enabled`` and ``device`` is a CUDA device that supports bf16, else nothing (fp32)."""
    dev = torch.device(device)
    if enabled and dev.type == "cuda" and torch.cuda.is_bf16_supported():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            yield
    else:
        yield


def device_line(device: torch.device | str, bf16: bool = True) -> str:
    """What rank 0 of ``make probe`` / ``make analyze`` prints: where the backbone runs and in which precision
    (``bf16``: the run asks for bf16 autocast on CUDA)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        amp = "bf16 autocast" if bf16 and torch.cuda.is_bf16_supported() else "fp32"
        return f"device: {torch.cuda.get_device_name(dev)} (cuda), backbone in {amp}"
    return f"device: {dev.type}, backbone in fp32"
