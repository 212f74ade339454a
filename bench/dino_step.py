"""One DINO training step, images/s: the plain step written as main_dino.py vs DINOPretrainModule (eager and
``compile=True``) under a real ``Trainer.fit``, for softmax and entmax-1.5, interleaved in one process.

``run(quick=False) -> {"rows": [...]}``. The issue's configuration: ViT-S/16, out_dim 65536, norm_last_layer
false, drop path 0.1, batch 8 with 2 x 224 + 8 x 96 crops, fp32, torch's default threads. Every path gets the
same fixed batch (no augmentation timed) and starts from the same weights. The steps run in epoch 0, so the
head's last layer is frozen (the official code computes its gradient and drops it; the module does not).

Each Lightning run lives in a helper thread parked in ``on_train_batch_end`` until the main thread asks for
its next step, so one round times one step of every path in turn and load on a shared machine hits all of them
alike. A step's time runs from the request to the next ``on_train_batch_end``: the whole Lightning loop
(logging, hooks, data fetch) is inside. Reported: median wall time per step over the timed rounds (after the
warm-up rounds, which also absorb compilation), images/s, and the median per-round ratio to the plain path.
Step 1 is a check, not timed: the eager paths run it with drop-path off (the plain step and timm draw the same
masks, but in a different order once paths interleave), and each variant's plain and optimised losses must
agree to ``LOSS_TOL``. On a GPU (``device="cuda"``, ``make gpu-check`` part (d)) the same rows measure it.

    python -m bench.dino_step [--quick] [--rounds N] [--batch B] [--device cpu|cuda]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import threading
import time

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from lightning_modules.dino_module import DINOPretrainModule
from lightning_modules.schedules import cancel_gradients_last_layer, clip_gradients, get_params_groups

FULL = dict(arch="vit_small_patch16", out_dim=65536, batch=8, global_size=224, local_size=96, n_local=8,
            warmup=2, rounds=5, compile=True)
QUICK = dict(arch="vit_test_patch8", out_dim=256, batch=2, global_size=32, local_size=16, n_local=2,
             warmup=1, rounds=2, compile=False)  # smoke test: compiling takes minutes, left to the full run
VARIANTS = ("softmax", "entmax")


def make_module(s: dict, variant: str, compile: bool = False, linear_backend: str | None = None) -> DINOPretrainModule:
    """``linear_backend`` (backbones/linear.py): default ``s["linear_backend"]``, else ``auto``."""
    torch.manual_seed(0)  # same initial weights for every path of a variant
    backbone = {"drop_path_rate": 0.1, "img_size": s["global_size"],
                "linear_backend": linear_backend or s.get("linear_backend", "auto")}
    return DINOPretrainModule(arch=s["arch"], variant=variant, out_dim=s["out_dim"], norm_last_layer=False,
                              backbone=backbone, n_local_crops=s["n_local"], compile=compile)


def make_batch(s: dict, device: torch.device | str = "cpu"):
    g = torch.Generator().manual_seed(0)
    crops = [torch.randn(s["batch"], 3, s["global_size"], s["global_size"], generator=g) for _ in range(2)]
    crops += [torch.randn(s["batch"], 3, s["local_size"], s["local_size"], generator=g) for _ in range(s["n_local"])]
    return [c.to(device) for c in crops], torch.zeros(s["batch"], dtype=torch.long, device=device)


@contextlib.contextmanager
def no_drop_path(*models):
    """Drop-path off (timm and the official code both keep the rate in ``drop_prob``), restored after: paths
    that draw their masks differently then compute the same step."""
    mods = [m for model in models for m in model.modules() if hasattr(m, "drop_prob")]
    saved = [m.drop_prob for m in mods]
    for m in mods:
        m.drop_prob = 0.0
    try:
        yield
    finally:
        for m, p in zip(mods, saved):
            m.drop_prob = p


def first_step(paths: dict) -> dict:
    """Step 1 of every eager path with drop-path off -> {name: loss}. Compiled paths run it with drop-path on
    and are not compared (switching it off and on would compile twice)."""
    losses = {}
    for name, step in paths.items():
        if "compiled" in name:
            step()
            continue
        with no_drop_path(step.student):
            losses[name] = step()
    return losses


class PlainStep:
    """The main_dino.py train_one_epoch body: for-loop AdamW, per-parameter clipping and EMA loops."""

    def __init__(self, s: dict, variant: str, device: torch.device | str = "cpu"):
        m = make_module(s, variant, linear_backend="aten").to(device)  # torch's own GEMMs, as main_dino.py
        self.student, self.teacher, self.dino_loss, self.hp = m.student, m.teacher, m.dino_loss, m.hparams
        self.optimizer = torch.optim.AdamW(get_params_groups(self.student), foreach=False)
        self.images = make_batch(s, device)[0]
        self.student.train()

    def __call__(self) -> float:
        lr, wd, m, epoch = 1e-5, 0.04, 0.996, 0
        for i, param_group in enumerate(self.optimizer.param_groups):
            param_group["lr"] = lr
            if i == 0:
                param_group["weight_decay"] = wd
        teacher_output = self.teacher(self.images[:2])
        student_output = self.student(self.images)
        loss = self.dino_loss(student_output, teacher_output, epoch)
        if not torch.isfinite(loss).item():
            raise RuntimeError("non-finite loss")
        self.optimizer.zero_grad()
        loss.backward()
        clip_gradients(self.student, self.hp.clip_grad)
        cancel_gradients_last_layer(epoch, self.student, self.hp.freeze_last_layer)
        self.optimizer.step()
        with torch.no_grad():
            for param_q, param_k in zip(self.student.parameters(), self.teacher.parameters()):
                param_k.data.mul_(m).add_((1 - m) * param_q.detach().data)
        return loss.item()


class _Data(pl.LightningDataModule):
    def __init__(self, batch, n: int):
        super().__init__()
        self.items, self.batch_size = [batch] * n, batch[1].shape[0]

    def train_dataloader(self):
        return DataLoader(self.items, batch_size=None, shuffle=False)


class _Gate(pl.Callback):
    def __init__(self):
        self.go, self.done = threading.Semaphore(0), threading.Semaphore(0)
        self.error: BaseException | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.done.release()
        self.go.acquire()


class LightningStep:
    """DINOPretrainModule under Trainer.fit in a helper thread; each call lets it run exactly one more step."""

    def __init__(self, s: dict, variant: str, compile: bool, steps: int, device: torch.device | str = "cpu"):
        self.module = make_module(s, variant, compile)
        self.student = self.module.student
        self.gate = _Gate()
        trainer = pl.Trainer(max_epochs=self.module.hparams.epochs, max_steps=steps,
                             accelerator=torch.device(device).type, devices=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             callbacks=[self.gate], num_sanity_val_steps=0)
        data = _Data(make_batch(s), steps)

        def fit():
            try:
                trainer.fit(self.module, datamodule=data)
            except BaseException as e:  # surfaced in the main thread
                self.gate.error = e
            finally:
                self.gate.done.release()

        self.thread = threading.Thread(target=fit, daemon=True)
        self.first = True

    def __call__(self) -> float:
        if self.first:
            self.first = False
            self.thread.start()
        else:
            self.gate.go.release()
        self.gate.done.acquire()
        if self.gate.error is not None:
            raise self.gate.error
        return self.module.last_stats["train/loss"]

    def close(self) -> None:
        if not self.first:
            self.gate.go.release()  # lets fit reach max_steps
            self.thread.join(timeout=60)


def interleave(paths: dict, warmup: int, rounds: int, sync=lambda: None) -> tuple[dict, dict]:
    """Round-robin: every path one step per round; returns the timed rounds' wall and process-CPU seconds
    per path (only one path runs at a time, so the process CPU time is that path's; other processes' load
    inflates it much less than the wall time)."""
    wall, cpu = {k: [] for k in paths}, {k: [] for k in paths}
    for r in range(warmup + rounds):
        for name, step in paths.items():
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            step()
            sync()
            if r >= warmup:
                wall[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
    return wall, cpu


def _ratio(base: list[float], ts: list[float]) -> float:
    return statistics.median(b / t for b, t in zip(base, ts))


LOSS_TOL = 1e-5  # relative: the plain and the optimised step-1 losses (the same maths, rounded differently)


def run(quick: bool = False, rounds: int | None = None, device: str | None = None, batch: int | None = None) -> dict:
    """Every path for both variants, interleaved: -> {"rows": [...], "step1_loss": {...}, ...}. ``device``:
    default the GPU when there is one. Raises if a plain and an optimised step-1 loss disagree."""
    s = dict(QUICK if quick else FULL)
    s.update({k: v for k, v in (("rounds", rounds), ("batch", batch)) if v})
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    steps = s["warmup"] + s["rounds"]
    paths = {}
    for v in VARIANTS:
        paths[f"plain {v}"] = PlainStep(s, v, dev)
        paths[f"optimised {v}"] = LightningStep(s, v, False, steps, dev)
        if s["compile"]:
            paths[f"compiled {v}"] = LightningStep(s, v, True, steps, dev)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    try:
        losses = first_step(paths)
        wall, cpu = interleave(paths, s["warmup"] - 1, s["rounds"], sync)
    finally:
        for p in paths.values():
            if isinstance(p, LightningStep):
                p.close()
    for v in VARIANTS:
        a, b = losses[f"plain {v}"], losses[f"optimised {v}"]
        if abs(a - b) > LOSS_TOL * abs(a):
            raise RuntimeError(f"{v}: step-1 loss plain {a!r} vs optimised {b!r}: the paths compute different steps")
    rows = []
    for kind, times in (("", wall), (" [CPU time]", cpu)):
        for name, ts in times.items():
            med = statistics.median(ts)
            rows.append({"name": f"{name}{kind} (median {med:.2f} s/step, range {min(ts):.2f}-{max(ts):.2f})",
                         "value": s["batch"] / med, "unit": "images/s",
                         "ratio": _ratio(times["plain " + name.split()[-1]], ts), "seconds": ts})
        rows.append({"name": f"optimised entmax vs plain softmax{kind}", "value": None, "unit": "",
                     "ratio": _ratio(times["plain softmax"], times["optimised entmax"])})
    return {"rows": rows, "step1_loss": losses, "config": s, "device": str(dev), "threads": torch.get_num_threads()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--device", default=None, help="default: cuda when there is a GPU, else cpu")
    a = p.parse_args()
    r = run(a.quick, a.rounds, a.device, a.batch)
    for row in r["rows"]:
        print(f"{row['name']:<75} {row['value'] or 0:8.2f} {row['unit']:<9} ratio {row['ratio']:.3f}")
    print(json.dumps(r["config"]))


if __name__ == "__main__":
    main()
