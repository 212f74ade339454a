"""One DINO training step, images/s: the transcribed main_dino.py step (``official.main_dino``) vs
DINOPretrainModule (eager and ``compile=True``) under a real ``Trainer.fit``, softmax and entmax-1.5, interleaved.

``run(quick=False) -> {"rows": [...]}``. Configuration (docs/performance.md): ViT-S/16, out_dim 65536, norm_last_layer
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
from functools import partial

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from lightning_modules.dino_module import DINOPretrainModule
from official import main_dino as official_main_dino, vit as official_vit

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


def official_pair(module: DINOPretrainModule, variant: str):
    """(student, teacher) of the transcribed main_dino.py (``official.main_dino``) shaped as ``module``'s
    and starting from its student's weights (strict load: the same parameter names). entmax: the official
    ``Attention``'s softmax replaced by the ``entmax`` library's ``entmax15`` (the official code has no entmax)."""
    hp, bb = module.hparams, module.student.backbone
    vit = dict(arch="custom", patch_size=bb.patch_size, embed_dim=bb.embed_dim, depth=len(bb.blocks),
               num_heads=bb.blocks[0].attn.num_heads, mlp_ratio=4, qkv_bias=True, img_size=[bb.patch_embed.img_size[0]],
               norm_layer=partial(torch.nn.LayerNorm, eps=1e-6))
    student, teacher = official_main_dino.build_student_teacher(
        out_dim=hp.out_dim, drop_path_rate=hp.backbone.get("drop_path_rate", 0.1), use_bn_in_head=hp.use_bn_in_head,
        norm_last_layer=hp.norm_last_layer, head_kwargs=dict(nlayers=hp.head_nlayers, hidden_dim=hp.head_hidden_dim,
                                                             bottleneck_dim=hp.head_bottleneck_dim), **vit)
    student.load_state_dict(module.student.state_dict())
    teacher.load_state_dict(student.state_dict())
    if variant == "entmax":
        import entmax
        for m in list(student.modules()) + list(teacher.modules()):
            if isinstance(m, official_vit.Attention):
                m.normalize = lambda a: entmax.entmax15(a, dim=-1)
    elif variant != "softmax":
        raise ValueError(f"the plain step has softmax and entmax only, not {variant!r}")
    return student, teacher


class PlainStep:
    """The transcribed main_dino.py ``train_one_epoch`` iteration (``official.main_dino``): the official
    ViT, head, loss, for-loop AdamW, per-parameter clipping and EMA loop; no project code on the step's path.
    ``precision``: "32-true", "bf16-mixed" (autocast) or "16-mixed" (autocast + GradScaler, main_dino.py's
    ``--use_fp16``)."""

    def __init__(self, s: dict, variant: str, device: torch.device | str = "cpu", precision: str = "32-true",
                 images=None):
        m = make_module(s, variant)
        self.student, self.teacher = (x.to(device) for x in official_pair(m, variant))
        hp = m.hparams
        self.dino_loss = official_main_dino.DINOLoss(hp.out_dim, 2 + s["n_local"], hp.warmup_teacher_temp,
                                                     hp.teacher_temp, hp.warmup_teacher_temp_epochs,
                                                     hp.epochs).to(device)
        self.clip, self.freeze = hp.clip_grad, hp.freeze_last_layer
        self.optimizer = torch.optim.AdamW(official_vit.get_params_groups(self.student), foreach=False)
        self.amp = {"32-true": None, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}[precision]
        self.scaler = torch.amp.GradScaler(torch.device(device).type) if precision == "16-mixed" else None
        self.images = images if images is not None else make_batch(s, device)[0]
        self.student.train()

    def __call__(self) -> float:
        return official_main_dino.train_step(self.student, self.teacher, self.dino_loss, self.images,
                                             self.optimizer, lr=1e-5, wd=0.04, m=0.996, epoch=0,
                                             fp16_scaler=self.scaler, clip_grad=self.clip,
                                             freeze_last_layer=self.freeze, autocast_dtype=self.amp)


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
        self.stop = False  # set by close(): fit ends after the step it is parked in, whatever max_steps says

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.done.release()
        self.go.acquire()
        if self.stop:
            trainer.should_stop = True


def precision_args(device: torch.device | str, precision: str) -> dict:
    """Trainer arguments for ``precision``. On the CPU Lightning turns "16-mixed" into bf16 (fp16 AMP "not
    supported on CPU"); torch has CPU fp16 autocast and a CPU GradScaler, so the plugin is given directly there:
    the CPU rehearsal then runs the fp16 + GradScaler path a GPU runs."""
    if precision == "16-mixed" and torch.device(device).type == "cpu":
        from lightning.pytorch.plugins import MixedPrecision
        return {"plugins": [MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu"))]}
    return {"precision": precision}


class LightningStep:
    """DINOPretrainModule under Trainer.fit in a helper thread; each call lets it run exactly one more step."""

    def __init__(self, s: dict, variant: str, compile: bool, steps: int, device: torch.device | str = "cpu",
                 precision: str = "32-true", batch=None):
        """``batch``: default ``make_batch(s)`` on the CPU (moved by Lightning each step); a batch already on the
        device makes that move a no-op (gpu-check's compute ceiling)."""
        self.module = make_module(s, variant, compile)
        self.student = self.module.student
        self.gate = _Gate()
        trainer = pl.Trainer(max_epochs=self.module.hparams.epochs, max_steps=steps,
                             accelerator=torch.device(device).type, devices=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             callbacks=[self.gate], num_sanity_val_steps=0, **precision_args(device, precision))
        data = _Data(batch if batch is not None else make_batch(s), steps)

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
        """Ends fit after the step it is parked in (a budget cut leaves steps unrun) and drops the module and
        trainer, so their device memory can be freed."""
        if not self.first:
            self.gate.stop = True
            self.gate.go.release()
            self.thread.join(timeout=60)
            if self.thread.is_alive():
                raise RuntimeError("LightningStep.close: the trainer thread did not stop within 60 s")
        self.module = self.student = self.thread = None


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
