"""Where a DINO step's time goes: ``torch.profiler`` (CPU) over one step, split into labelled phases.

Used by ``bench.official_dino --profile``. The phases are labelled from outside (``record_function`` around
the pieces' ``forward`` / the functions the step calls), so neither code is edited:

* teacher forward, student forward, loss: the modules' ``forward``;
* backward: ``Tensor.backward``; clip: ``utils.clip_gradients`` + ``cancel_gradients_last_layer`` (official),
  ``clip_grad_norms_`` + cancel (project); optimizer: torch's own ``Optimizer.step#AdamW.step`` label
  (official) / the fused ``aten::_fused_adamw_`` op (project: Lightning runs the closure, i.e. the whole
  forward and backward, inside ``optimizer.step``); zero_grad: ``Optimizer.zero_grad#...``;
* EMA: the module's ``ema_update`` (project; in the official body the EMA loop is inline, so it is in "rest");
* logging: ``self.log`` / ``log_dict`` and the collapse statistics (project);
* rest = the step's CPU time minus the phases: Lightning's loop and hooks (project), the inline EMA loop,
  ``loss.item()`` and ``MetricLogger`` (official).

The project step is profiled in a ``Trainer.fit`` on the main thread (the profiler records only the thread that
starts it), from the end of warm-up step 2 to the end of step 3: the whole loop is inside the window.
"""
from __future__ import annotations

import contextlib
import time

import lightning.pytorch as pl
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from bench.dino_step import _Data, make_batch, make_module

PHASES = ("teacher forward", "student forward", "loss", "backward", "clip", "optimizer", "zero_grad", "EMA",
          "logging")


def _wrap(obj, attr: str, label: str):
    fn = getattr(obj, attr)

    def wrapped(*a, **k):
        with record_function(label):
            return fn(*a, **k)
    setattr(obj, attr, wrapped)


@contextlib.contextmanager
def _labelled_backward():
    real = torch.Tensor.backward

    def backward(self, *a, **k):
        with record_function("backward"):
            return real(self, *a, **k)
    torch.Tensor.backward = backward
    try:
        yield
    finally:
        torch.Tensor.backward = real


def _phase_times(prof, wall: float, cpu: float, opt_key: str) -> dict:
    ev = {e.key: e for e in prof.key_averages()}

    def ms(key):
        return ev[key].cpu_time_total / 1e3 if key in ev else 0.0
    out = {p: ms(p) for p in PHASES}
    out["optimizer"] = ms(opt_key)
    out["zero_grad"] = sum(e.cpu_time_total for k, e in ev.items() if k.startswith("Optimizer.zero_grad")) / 1e3
    out["step (wall)"] = wall * 1e3
    out["step (process CPU)"] = cpu * 1e3
    out["rest"] = wall * 1e3 - sum(out[p] for p in PHASES)
    top = sorted((e for e in ev.values() if e.key.startswith("aten::")), key=lambda e: -e.self_cpu_time_total)
    out["top_ops"] = [(e.key, e.self_cpu_time_total / 1e3) for e in top[:8]]
    return out


def profile_official(step) -> dict:
    utils = step.utils
    _wrap(step.teacher, "forward", "teacher forward")
    _wrap(step.student.module, "forward", "student forward")
    _wrap(step.loss, "forward", "loss")
    real = utils.clip_gradients, utils.cancel_gradients_last_layer
    _wrap(utils, "clip_gradients", "clip")
    _wrap(utils, "cancel_gradients_last_layer", "clip")
    try:
        for _ in range(2):
            step()
        with _labelled_backward(), profile(activities=[ProfilerActivity.CPU]) as prof:
            t0, c0 = time.perf_counter(), time.process_time()
            step()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        utils.clip_gradients, utils.cancel_gradients_last_layer = real
    return _phase_times(prof, wall, cpu, "Optimizer.step#AdamW.step")


class _Window(pl.Callback):
    """Profile from the end of step ``at - 1`` to the end of step ``at``."""

    def __init__(self, at: int):
        self.at, self.prof, self.t0 = at, None, None
        self.wall = self.cpu = 0.0

    def on_train_batch_end(self, trainer, m, outputs, batch, batch_idx):
        if trainer.global_step == self.at - 1:
            self.prof = profile(activities=[ProfilerActivity.CPU])
            self.prof.__enter__()
            self.t0 = time.perf_counter(), time.process_time()
        elif trainer.global_step == self.at:
            self.wall, self.cpu = time.perf_counter() - self.t0[0], time.process_time() - self.t0[1]
            self.prof.__exit__(None, None, None)


def profile_project(s: dict, variant: str, compile: bool) -> dict:
    import lightning_modules.dino_module as dm
    m = make_module(s, variant, compile)
    _wrap(m.teacher, "forward", "teacher forward")
    _wrap(m.student, "forward", "student forward")
    _wrap(m.dino_loss, "forward", "loss")
    _wrap(m, "ema_update", "EMA")
    for name in ("log", "log_dict", "_collapse_stats"):
        _wrap(m, name, "logging")
    real_clip = dm.clip_grad_norms_
    _wrap(dm, "clip_grad_norms_", "clip")
    window = _Window(3)
    trainer = pl.Trainer(max_epochs=m.hparams.epochs, max_steps=3, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[window], num_sanity_val_steps=0)
    try:
        with _labelled_backward():
            trainer.fit(m, datamodule=_Data(make_batch(s), 3))
    finally:
        dm.clip_grad_norms_ = real_clip
    return _phase_times(window.prof, window.wall, window.cpu, "aten::_fused_adamw_")


def profile_paths(paths: dict, s: dict) -> dict:
    res = {"official softmax": profile_official(paths["official softmax"])}
    for name in paths:
        if name.startswith("project"):
            res[name] = profile_project(s, name.split()[-1], "compiled" in name)
    cols = list(res)
    table = ["| phase | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for p in (*PHASES, "rest", "step (wall)", "step (process CPU)"):
        cells = []
        for c in cols:
            v, tot = res[c][p], res[c]["step (wall)"]
            cells.append(f"{v / 1e3:.3f} s ({100 * v / tot:.1f} %)" if "step" not in p else f"{v / 1e3:.3f} s")
        table.append(f"| {p} | " + " | ".join(cells) + " |")
    for c in cols:
        table.append(f"top ops {c}: " + ", ".join(f"{k} {v / 1e3:.2f} s" for k, v in res[c]["top_ops"]))
    return {"profile": res, "table": table}
