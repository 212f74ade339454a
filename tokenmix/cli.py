"""The flags every evaluation CLI shares (``make probe``, ``make analyze``), as one argparse parent parser, the
way dinov2's eval scripts share ``get_args_parser``:

    >>> import argparse
    >>> from tokenmix.cli import eval_parent_parser, finish_eval_args
    >>> p = argparse.ArgumentParser(parents=[eval_parent_parser()])
    >>> ev = finish_eval_args(p.parse_args(["--ckpt", "random"]), demo=True, accelerator="cpu")
    >>> ev.backbone.variant, ev.backbone.arch, ev.launch.num_nodes
    ('softmax', 'vit_demo_patch8', 1)

``finish_eval_args`` turns the parsed flags into typed settings (``EvalSettings``) once, in the CLI's own file;
nothing below a CLI sees its argparse Namespace. Which backbone those flags name is
``backbones.load.resolve_backbone``'s job.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Optional

from .launch import DEFAULT_TIMEOUT_MIN, cluster_num_nodes, count_devices, refuse_unlaunched_multinode

DEMO_ARCH = "vit_demo_patch8"
REAL_ARCH = "vit_small_patch16"


@dataclass(frozen=True)
class BackboneFlags:
    """Which backbone the flags name: --variant, --ckpt ('' / file / random / pixels), --which, --arch."""
    variant: str
    ckpt: str
    which: Which
    arch: str


class Which(str, Enum):
    """The network of a DINO checkpoint an evaluation reads."""
    TEACHER = "teacher"
    STUDENT = "student"


@dataclass(frozen=True)
class Launch:
    """The processes of an evaluation: Lightning's accelerator x --devices per node x --num-nodes."""
    accelerator: str  # "auto" | "cpu" | "gpu" | "cuda" (Lightning's names)
    devices: str
    num_nodes: int
    dist_timeout: float  # minutes DDP waits for the other processes
    world: int = 1       # processes of the run: devices per node x nodes


@dataclass(frozen=True)
class EvalSettings:
    """The shared flags of every eval CLI, checked and typed: backbone, data, processes."""
    backbone: BackboneFlags
    data: str
    data_root: str
    launch: Launch


def eval_parent_parser(p: Optional[argparse.ArgumentParser] = None) -> argparse.ArgumentParser:
    """Backbone (--variant/--ckpt/--which/--arch), data (--data/--data-root) and launch (--devices/--num-nodes/
    --dist-timeout) flags, added to ``p`` (default: a new parent parser for ``parents=[eval_parent_parser()]``)."""
    p = p or argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("backbone and data (shared by every eval CLI)")
    g.add_argument("--variant", default="softmax", help="variant whose latest pretraining checkpoint is used "
                   "when --ckpt is empty; also the variant of --ckpt random")
    g.add_argument("--ckpt", default="", help="checkpoint file (tokenmix .ckpt, official DINO / DINOv2 .pth, "
                   "timm / DeiT / MAE weights: docs/backbones.md), or the "
                   "baselines 'random' (untrained ViT) / 'pixels' (raw patches); '' = latest pretraining run of "
                   "--variant")
    g.add_argument("--which", choices=("teacher", "student"), default="teacher",
                   help="which network of a DINO checkpoint")
    g.add_argument("--arch", default=None, help=f"arch of --ckpt random (default: {DEMO_ARCH} on demo data, "
                   f"{REAL_ARCH} otherwise); a timm model name (vit_small_patch14_reg4_dinov2) also says whose "
                   "weights a --ckpt file holds (docs/backbones.md)")
    g.add_argument("--data", default="demo", help="'demo' (generated data) or the dataset name (with --data-root); "
                   "your own data: folder, imagefolder, custom_seg, custom_depth (docs/data.md)")
    g.add_argument("--data-root", default="", help="folder of the real dataset")
    g = p.add_argument_group("processes (Lightning DDP)")
    g.add_argument("--devices", default="1", help="devices per node ('auto' = all present)")
    g.add_argument("--num-nodes", type=int, default=None, help="default: from SLURM / torchrun, else 1")
    g.add_argument("--dist-timeout", type=float, default=DEFAULT_TIMEOUT_MIN,
                   help="minutes DDP waits for the other processes")
    return p


def finish_eval_args(args: argparse.Namespace, demo: bool, accelerator: str) -> EvalSettings:
    """The typed settings of the shared flags, with the defaults that depend on other flags, and the checks the
    launching process makes before any spawn: '' variant -> softmax, --arch by data (``demo``: --data is the demo
    data, ``datamodules.demo.is_demo``, a rule this lower layer does not import), --num-nodes from the cluster, a
    multi-node run without a launcher and a malformed --devices refused. ``accelerator``: the CLI's own choice
    (``--accelerator``, or the device of ``--device``)."""
    data = (args.data or "demo").strip()
    num_nodes = args.num_nodes if args.num_nodes is not None else cluster_num_nodes() or 1
    refuse_unlaunched_multinode(num_nodes)
    devices = str(args.devices).strip()
    if devices not in ("auto", "-1") and not devices.replace(",", "").isdigit():
        raise ValueError(f"--devices {args.devices!r}: expected a number, a list like '0,1', or 'auto'")
    backbone = BackboneFlags(variant=(args.variant or "softmax").strip(), ckpt=(args.ckpt or "").strip(),
                             which=Which(args.which), arch=args.arch or (DEMO_ARCH if demo else REAL_ARCH))
    return EvalSettings(backbone, data, args.data_root or "",
                        Launch(accelerator, args.devices, int(num_nodes), float(args.dist_timeout),
                               count_devices(accelerator, devices) * int(num_nodes)))


def parse_eval(p: argparse.ArgumentParser, argv, demo: Callable[[str], bool]) -> tuple[argparse.Namespace,
                                                                                      EvalSettings]:
    """A CLI's one trip here: the shared flags added to ``p`` (which holds the CLI's own), ``argv`` parsed once and
    the shared flags typed (``finish_eval_args``; ``demo``: ``datamodules.demo.is_demo``; the accelerator:
    --accelerator, else the device of --device)."""
    f = eval_parent_parser(p).parse_args(argv)
    accelerator = getattr(f, "accelerator", None) or ("gpu" if str(f.device).startswith("cuda") else "cpu")
    return f, finish_eval_args(f, demo=demo(f.data), accelerator=accelerator)


def error_exit(e: BaseException, code: int) -> int:
    """The CLIs' one error line: ``error: <reason>`` on stderr; returns ``code`` (the process's exit status)."""
    import sys
    print(f"error: {e}", file=sys.stderr)
    return code
