"""Multi-device launch checks shared by ``make pretrain`` and ``make probe``, run in the launching process
before Lightning starts any other process.

    >>> from tokenmix.launch import ddp_strategy, refuse_unlaunched_multinode
    >>> refuse_unlaunched_multinode(num_nodes=1)        # fine: one node needs no cluster launcher
    >>> ddp_strategy("auto", accelerator="cpu", devices=1, num_nodes=1, timeout_min=10)
    'auto'

Cluster environments are Lightning's own classes (TorchElastic, SLURM, LSF, MPI, in Lightning's priority order),
so what counts as "launched on a cluster" here is exactly what Lightning will use.
"""
from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, Optional, Union

import torch

DEFAULT_TIMEOUT_MIN = 10.0


class LaunchError(ValueError):
    """A launch configuration that would hang or cannot work; the message says how to launch instead."""


def cluster_environment() -> Optional[str]:
    """Name of the cluster environment Lightning would detect ('TorchElasticEnvironment', 'SLURMEnvironment',
    ...), or None on a plain machine."""
    from lightning.fabric.plugins.environments import (LSFEnvironment, MPIEnvironment, SLURMEnvironment,
                                                       TorchElasticEnvironment)
    for env in (TorchElasticEnvironment, SLURMEnvironment, LSFEnvironment, MPIEnvironment):
        if env.detect():
            return env.__name__
    return None


def cluster_num_nodes() -> Optional[int]:
    """Nodes of the job as the cluster environment states them (SLURM_NNODES; torchrun's
    WORLD_SIZE / LOCAL_WORLD_SIZE), None where no environment states it."""
    env = cluster_environment()
    if env == "SLURMEnvironment":
        n = os.environ.get("SLURM_NNODES") or os.environ.get("SLURM_JOB_NUM_NODES")
        return int(n) if n else None
    if env == "TorchElasticEnvironment":
        world, local = os.environ.get("WORLD_SIZE"), os.environ.get("LOCAL_WORLD_SIZE")
        return max(1, int(world) // int(local)) if world and local else None
    return None


def refuse_unlaunched_multinode(num_nodes: int) -> None:
    """``num_nodes > 1`` on a machine no cluster launcher started would wait forever for the other nodes."""
    if int(num_nodes) > 1 and cluster_environment() is None:
        raise LaunchError(
            f"num_nodes={num_nodes} but this process was not started by a cluster launcher (no SLURM / torchrun "
            "environment variables), so the other nodes would never join and the run would hang. On one machine "
            "use num_nodes=1 (the default). On several nodes start one process per device with `srun` (SLURM, "
            "see configs/slurm/pretrain_2x8.sbatch) or `torchrun --nnodes N --nproc-per-node 8 ...` on every "
            "node; the node count is then read from the cluster environment (docs/scale.md).")


def count_devices(accelerator: str, devices: Union[int, str, list, None]) -> int:
    """Devices per node Lightning will use for ``accelerator`` / ``devices`` (``auto`` / -1 = all present)."""
    if isinstance(devices, (list, tuple)):
        return len(devices)
    gpu = str(accelerator) in ("gpu", "cuda") or (str(accelerator) == "auto" and torch.cuda.is_available())
    if devices is None or str(devices).strip() in ("auto", "-1"):
        if gpu:
            return torch.cuda.device_count()
        return 1 if str(devices).strip() != "-1" else (os.cpu_count() or 1)
    s = str(devices).strip()
    if "," in s:  # "0,1": an explicit list of device ids
        return len([x for x in s.split(",") if x.strip()])
    return int(s)


def ddp_strategy(strategy: Any, accelerator: str, devices: Any, num_nodes: int,
                 timeout_min: float = DEFAULT_TIMEOUT_MIN) -> Any:
    """``strategy`` unchanged, except that ``auto`` / ``ddp`` on more than one process becomes
    ``DDPStrategy(timeout=...)``: a world that never forms ends in an error after ``timeout_min`` minutes."""
    if not isinstance(strategy, str) or strategy not in ("auto", "ddp"):
        return strategy
    if count_devices(accelerator, devices) * int(num_nodes) <= 1:
        return strategy
    from lightning.pytorch.strategies import DDPStrategy
    return DDPStrategy(timeout=timedelta(minutes=float(timeout_min)))


def wants_sync_batchnorm(strategy: Any, accelerator: str, what: str) -> bool:
    """Lightning's ``sync_batchnorm`` for a model with BatchNorm (``what`` names it): on for DDP on GPUs. torch's
    DDP refuses SyncBatchNorm on CPU, so several CPU processes normalise with their own batch (warned)."""
    if isinstance(strategy, str):  # one process
        return False
    if str(accelerator) in ("gpu", "cuda") or (str(accelerator) == "auto" and torch.cuda.is_available()):
        return True
    from lightning.pytorch.utilities import rank_zero_warn
    rank_zero_warn(f"{what} on several CPU processes: torch's DDP has no CPU SyncBatchNorm, so each process "
                   "normalises with its own batch statistics (GPU runs synchronise them)")
    return False


def global_rank() -> int:
    """This process's rank as set by Lightning's launcher or the cluster (0 in the launching process)."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only
    return int(getattr(rank_zero_only, "rank", 0) or 0)
