"""The official facebookresearch/dino training step beside ``DINOPretrainModule`` under a real ``Trainer.fit``.

The official code is imported at run time from a checkout (``--official-repo``: a folder holding its
``main_dino.py``, ``utils.py`` and ``vision_transformer.py``; nothing of it is vendored here). Its
``train_one_epoch`` is called as it is, one iteration per call, on a one-batch loader, with the student
wrapped in a ``.module`` holder (as DDP holds it), ``Tensor.cuda`` / ``torch.cuda.synchronize`` made no-ops
on a CPU-only machine, ``DINOLoss.update_center``'s ``all_reduce`` the identity (a world of one) and its
printing silenced. Its student starts from the project's initial student weights (strict ``load_state_dict``:
same keys), its teacher from its student, as main_dino.py. Same fixed batch for every path.

Step 1 is a check: every eager student runs it with drop-path off (the two codes draw drop-path masks differently),
and the step-1 losses of the official and the project softmax paths must agree (``--loss-tol``). Then one more
warm-up step, then ``--rounds`` timed rounds, each one step of every path in turn (``bench.dino_step.interleave``).
Reported: median wall and process-CPU seconds per step, and medians of the per-round ratios
official-softmax / path. The default is docs/performance.md's configuration (ViT-S/16, out_dim 65536, norm_last_layer
false, drop path 0.1, batch 8, 2 x 224 + 8 x 96 crops, fp32, 2 threads).

    python -m bench.official_dino --official-repo PATH [--batch 8] [--rounds 10] [--compiled [VARIANT ...]] [--profile]

``--profile``: instead of timing, one ``torch.profiler`` (CPU) step of the official softmax path and of the
project softmax path (eager; with ``--compiled`` the compiled one too), time split by phase.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import torch

from bench.dino_step import FULL, LightningStep, first_step, interleave, make_batch

DEFAULTS = dict(FULL, rounds=10)


def import_official(repo: str):
    """(main_dino, utils, vision_transformer) from a facebookresearch/dino checkout."""
    path = str(Path(repo).resolve())
    if not (Path(path) / "main_dino.py").is_file():
        raise SystemExit(f"--official-repo {repo}: no main_dino.py there (a facebookresearch/dino checkout)")
    sys.path.insert(0, path)
    try:
        import main_dino
        import utils
        import vision_transformer
    finally:
        sys.path.remove(path)
    return main_dino, utils, vision_transformer


@contextlib.contextmanager
def cpu_as_cuda():
    """The official body moves images with ``.cuda()`` and calls ``torch.cuda.synchronize()``: no-ops on CPU."""
    if torch.cuda.is_available():
        yield
        return
    cuda, sync = torch.Tensor.cuda, torch.cuda.synchronize
    torch.Tensor.cuda, torch.cuda.synchronize = (lambda self, *a, **k: self), (lambda *a, **k: None)
    try:
        yield
    finally:
        torch.Tensor.cuda, torch.cuda.synchronize = cuda, sync


class _Holder(torch.nn.Module):
    """What DDP is to the official student: ``.module`` plus a forwarding call."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(x)


class OfficialStep:
    """One official ``train_one_epoch`` iteration per call; the schedules of a run of ``steps`` iterations."""

    def __init__(self, official, s: dict, project_student: torch.nn.Module, steps: int):
        main_dino, utils, vits = official
        arch = {"vit_small_patch16": "vit_small", "vit_base_patch16": "vit_base"}[s["arch"]]
        self.utils = utils

        def build(dpr):
            vit = vits.__dict__[arch](patch_size=16, drop_path_rate=dpr)
            return utils.MultiCropWrapper(vit, vits.DINOHead(vit.embed_dim, s["out_dim"], norm_last_layer=False))
        student, self.teacher = build(0.1), build(0.0)
        student.load_state_dict(project_student.state_dict())  # strict: the same keys
        self.teacher.load_state_dict(student.state_dict())
        for p in self.teacher.parameters():
            p.requires_grad = False
        self.student = _Holder(student)
        self.args = SimpleNamespace(epochs=100, clip_grad=3.0, freeze_last_layer=1)  # main_dino.py defaults
        ncrops = 2 + s["n_local"]
        self.loss = main_dino.DINOLoss(s["out_dim"], ncrops, 0.04, 0.04, 0, self.args.epochs)
        self.optimizer = torch.optim.AdamW(utils.get_params_groups(student))
        lr = 0.0005 * s["batch"] / 256.0
        self.lr = utils.cosine_scheduler(lr, 1e-6, self.args.epochs, steps, warmup_epochs=10)
        self.wd = utils.cosine_scheduler(0.04, 0.4, self.args.epochs, steps)
        self.mom = utils.cosine_scheduler(0.996, 1.0, self.args.epochs, steps)
        self.main_dino, self.it = main_dino, 0
        self.batch = None
        self.losses: list[torch.Tensor] = []  # the body returns only averaged meters: keep each loss
        self.loss.register_forward_hook(lambda mod, inp, out: self.losses.append(out.detach()))

    def __call__(self) -> float:
        it, self.it = self.it, self.it + 1
        with cpu_as_cuda(), contextlib.redirect_stdout(io.StringIO()):
            self.main_dino.train_one_epoch(
                self.student, self.teacher, self.teacher, self.loss, [self.batch], self.optimizer,
                self.lr[it:], self.wd[it:], self.mom[it:], 0, None, self.args)
        return float(self.losses[-1])


def one_process_world(main_dino) -> None:
    """``DINOLoss.update_center`` all-reduces the batch centre: in a world of one that is the identity. (A real
    one-process gloo group would also make ``MetricLogger`` sync its meters through a CUDA tensor.)"""
    main_dino.dist = SimpleNamespace(all_reduce=lambda t, *a, **k: None, get_world_size=lambda: 1)


def build_paths(a, s: dict, official) -> dict:
    steps = s["warmup"] + s["rounds"]  # exactly the calls made: the fits end after the last
    paths = {}
    for v in a.variants:
        paths[f"project {v}"] = LightningStep(s, v, False, steps)
        if a.compiled is not None and (not a.compiled or v in a.compiled):
            paths[f"project compiled {v}"] = LightningStep(s, v, True, steps)
    batch = paths[f"project {a.variants[0]}"].module  # same initial student for every variant
    off = OfficialStep(official, s, batch.student, steps)
    off.batch = make_batch(s)
    return {"official softmax": off, **paths}


def _progress(name: str, step):
    """Prints every step's wall time as it ends (a long run on a busy machine shows where it is)."""
    def call():
        t0 = time.perf_counter()
        out = step()
        print(f"  {name}: {time.perf_counter() - t0:.2f} s, loss {out:.6f}, load {os.getloadavg()[0]:.1f}", flush=True)
        return out
    return call


def time_paths(a, s: dict, paths: dict) -> dict:
    losses = first_step(paths)
    wall, cpu = interleave({k: _progress(k, v) for k, v in paths.items()}, s["warmup"] - 1, s["rounds"])
    ref = "official softmax"
    rows = []
    for kind, times in (("wall", wall), ("cpu", cpu)):
        for name, ts in times.items():
            rows.append({"path": name, "clock": kind, "median_s": statistics.median(ts), "min_s": min(ts),
                         "max_s": max(ts), "official_softmax_over_this":
                         statistics.median(b / t for b, t in zip(times[ref], ts))})
    return {"step1_loss": losses, "rows": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--official-repo", required=True)
    p.add_argument("--batch", type=int, default=DEFAULTS["batch"])
    p.add_argument("--rounds", type=int, default=DEFAULTS["rounds"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--variants", nargs="+", default=["softmax", "entmax"])
    p.add_argument("--compiled", nargs="*", default=None, metavar="VARIANT",
                   help="also the project with compile=True (for these variants; none listed: all)")
    p.add_argument("--profile", action="store_true", help="one profiled step per path instead of timing")
    p.add_argument("--loss-tol", type=float, default=1e-5, help="step-1 loss agreement (relative)")
    p.add_argument("--linear-backend", default="auto", choices=("auto", "aten", "onednn"),
                   help="GEMM of the project backbone's linear layers (backbones/linear.py)")
    p.add_argument("--json", default="", help="write the result here")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    s = dict(DEFAULTS, batch=a.batch, rounds=a.rounds, compile=a.compiled is not None,
             linear_backend=a.linear_backend)
    official = import_official(a.official_repo)
    one_process_world(official[0])
    pl.seed_everything(0, verbose=False)
    load0 = os.getloadavg()
    paths = build_paths(a, s, official)
    try:
        if a.profile:
            from bench.dino_profile import profile_paths
            result = profile_paths(paths, s)
        else:
            result = time_paths(a, s, paths)
    finally:
        for step in paths.values():
            if isinstance(step, LightningStep):
                step.close()
    result.update(config={**s, "threads": a.threads}, load_before=load0, load_after=os.getloadavg(),
                  created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    report(result)
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1, default=str))
    losses = result.get("step1_loss", {})
    if "project softmax" in losses:
        o, m = losses["official softmax"], losses["project softmax"]
        if abs(o - m) > a.loss_tol * abs(o):
            print(f"step-1 losses differ: official {o:.7f} vs project {m:.7f}", file=sys.stderr)
            return 1
    return 0


def report(r: dict) -> None:
    print(f"config {json.dumps(r['config'])}; load average before {r['load_before']}, after {r['load_after']}")
    for name, loss in r.get("step1_loss", {}).items():
        print(f"step-1 loss (drop-path off) {name:<28} {loss:.7f}")
    for row in r.get("rows", []):
        print(f"{row['path']:<28} {row['clock']:<5} median {row['median_s']:7.3f} s "
              f"(range {row['min_s']:.3f}-{row['max_s']:.3f})  official softmax / this "
              f"{row['official_softmax_over_this']:.3f}")
    for line in r.get("table", []):
        print(line)


if __name__ == "__main__":
    sys.exit(main())
