"""Multi-device launch checks shared by ``make pretrain`` and ``make probe``, run in the launching process
before Lightning starts any other process. Cluster environments are Lightning's own classes, so "launched on a
cluster" here is exactly what Lightning will use.
"""
from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Any, Optional, Union

import torch

DEFAULT_TIMEOUT_MIN = 10.0


class LaunchError(ValueError):
    """A launch configuration that would hang or cannot work; the message says how to launch instead."""


def cluster_environment() -> Optional[str]:
    """The cluster environment Lightning would detect ('SLURMEnvironment', ...), or None on a plain machine."""
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


def cuda_report() -> str:
    """What torch says about CUDA on this machine: its CUDA build (``torch.version.cuda``), whether it sees a
    device, and, when not, the reason its CUDA initialisation gives (no driver, a driver too old for the build)."""
    build = torch.version.cuda
    if not build:
        return f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None)"
    line = f"torch {torch.__version__} is built for CUDA {build}"
    if torch.cuda.is_available():
        return f"{line} and sees {torch.cuda.device_count()} device(s)"
    import warnings
    with warnings.catch_warnings(record=True) as caught:  # the CUDA init warning, where torch gives one
        warnings.simplefilter("always")
        try:
            torch.cuda.init()
            reason = ""
        except Exception as e:  # noqa: BLE001 (the text is the report; nothing else runs after a refusal)
            reason = str(e).strip()
    said = "; ".join(t for t in dict.fromkeys([reason, *(str(w.message).strip() for w in caught)]) if t)
    return f"{line}, but torch.cuda.is_available() is False ({said or 'no reason given by torch'})"


def check_machine(num_nodes: int, accelerator: str, real_data: str = "", gpu_refusal: str = "") -> None:
    """What this machine refuses before any process starts: ``num_nodes > 1`` without a cluster launcher; a real
    dataset (``real_data``) that would train on the CPU only because no GPU is usable (``cpu`` set explicitly is a
    choice, not a fallback); and ``gpu_refusal``, when given, on a GPU."""
    refuse_unlaunched_multinode(num_nodes)
    if real_data and str(accelerator).lower() != "cpu" and not torch.cuda.is_available():
        raise LaunchError(
            f"DATA={real_data} would train on the CPU because no GPU is usable here: {cuda_report()}. Training a "
            "real dataset on the CPU is never chosen silently (one process, precision 32-true). Fix the driver / "
            "install a torch built for it, or pass --trainer.accelerator=cpu to train on the CPU on purpose.")
    if gpu_refusal and on_gpu(accelerator):
        raise LaunchError(gpu_refusal)


class _NoTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("💡 Tip:")


def hide_lightning_tips() -> None:
    """Drop Lightning's advertisements ("💡 Tip: ... install litlogger / litmodels", once per Trainer) from the
    console: a filter on the logger its ``rank_zero_info`` writes to; every other line it logs stays."""
    log = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _NoTips) for f in log.filters):
        log.addFilter(_NoTips())


def on_gpu(accelerator: Any) -> bool:
    """The one CPU/GPU choice: ``gpu`` / ``cuda``, or ``auto`` where torch sees a CUDA device."""
    acc = str(accelerator).lower()
    return acc in ("gpu", "cuda") or (acc == "auto" and torch.cuda.is_available())


def count_devices(accelerator: str, devices: Union[int, str, list, None]) -> int:
    """Devices per node Lightning will use for ``accelerator`` / ``devices`` (``auto`` / -1 = all present)."""
    if isinstance(devices, (list, tuple)):
        return len(devices)
    gpu = on_gpu(accelerator)
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
    if on_gpu(accelerator):
        return True
    from lightning.pytorch.utilities import rank_zero_warn
    rank_zero_warn(f"{what} on several CPU processes: torch's DDP has no CPU SyncBatchNorm, so each process "
                   "normalises with its own batch statistics (GPU runs synchronise them)")
    return False


def global_rank() -> int:
    """This process's rank as set by Lightning's launcher or the cluster (0 in the launching process)."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only
    return int(getattr(rank_zero_only, "rank", 0) or 0)


# --- stopping a multi-process run: SIGTERM / SIGINT end every rank within seconds -----------------------------
# A rank blocked in a gloo collective never returns to the interpreter to run a Python signal handler, so a thread
# of ours reads the C handler's wake-up byte (``signal.set_wakeup_fd``), forwards the signal to the children
# (Lightning's ranks 1..N-1) and ``os._exit``s. Our ranks also die with the launcher (``PR_SET_PDEATHSIG``).
LAUNCHER_PID_ENV = "TOKENMIX_LAUNCHER_PID"
_STOP_SIGNALS = ("SIGTERM", "SIGINT")
_installed: tuple = ()  # the wake-up socket pair, kept open for the life of the process


def _rank_label() -> str:
    return f"rank {os.environ.get('RANK', os.environ.get('LOCAL_RANK', '0'))} (pid {os.getpid()})"


def _children(pid: int) -> list[int]:
    """Live child processes of ``pid`` (Linux /proc; empty elsewhere)."""
    out = []
    for d in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:  # field 4: ppid (after "pid (comm) state")
                out.append(int(d))
    return out


def stop_now(signum: int) -> None:
    """Forward ``signum`` to this process's children and exit at once with 128 + signum, saying so on stderr."""
    import signal
    name = signal.Signals(signum).name
    kids = _children(os.getpid())
    for kid in kids:
        try:
            os.kill(kid, signum)
        except OSError:
            pass
    fwd = f", forwarded to child process(es) {kids}" if kids else ""
    os.write(2, f"\n[tokenmix] {_rank_label()} received {name}: stopping this run now{fwd}\n".encode())
    _flush_with_deadline(0.5)
    os._exit(128 + signum)


def _flush_with_deadline(seconds: float) -> None:
    """Flush stdout/stderr unless that blocks (the main thread may hold their lock, stuck in a collective)."""
    import sys
    import threading
    t = threading.Thread(target=lambda: [s.flush() for s in (sys.stdout, sys.stderr) if s], daemon=True)
    t.start()
    t.join(seconds)


def _die_with_launcher() -> None:
    """In a rank our launcher started: get SIGTERM when the launcher dies; exit now if it is already gone."""
    parent = os.environ.get(LAUNCHER_PID_ENV)
    if not parent or os.environ.get("LOCAL_RANK", "0") == "0":
        return
    try:
        import ctypes
        import signal
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # not Linux
        return
    if os.getppid() != int(parent):  # the launcher died before prctl took effect
        os.write(2, f"[tokenmix] {_rank_label()}: the launching process {parent} is gone, stopping\n".encode())
        os._exit(1)


def install_stop_handlers() -> None:
    """Make SIGTERM / SIGINT stop this process and its ranks within seconds, whatever the main thread is doing.
    Once, from a command-line entry point's main thread (it replaces the process's handling); else a no-op."""
    import signal
    import socket
    import threading
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    _die_with_launcher()
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())  # inherited by the ranks Lightning starts from here
    rsock, wsock = socket.socketpair()
    wsock.setblocking(False)
    signal.set_wakeup_fd(wsock.fileno(), warn_on_full_buffer=False)
    stops = {int(getattr(signal, s)) for s in _STOP_SIGNALS}
    for s in stops:  # a Python-level handler makes the C handler write the wake-up byte; the work is the thread's
        signal.signal(s, lambda *_: None)

    def watch() -> None:
        while True:
            for b in rsock.recv(64):
                if b in stops:
                    stop_now(b)
    threading.Thread(target=watch, name="tokenmix-stop", daemon=True).start()

    def in_forked_child() -> None:  # DataLoader workers: default handling, and not our parent's wake-up socket
        try:
            signal.set_wakeup_fd(-1)
            for s in stops:
                signal.signal(s, signal.SIG_DFL)
        except ValueError:  # not the child's main thread (CPython makes the forking thread main: not expected)
            pass
    os.register_at_fork(after_in_child=in_forked_child)
    _installed = (rsock, wsock)
