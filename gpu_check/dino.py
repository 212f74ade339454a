"""``make gpu-check`` parts (d) the DINO paper preset at 64 images per GPU and (e) the demo end to end.

(d) compute ceiling: the batch already on the GPU, every path one step per round in turn (``bench.dino_step``):
the transcribed main_dino.py step (``official.main_dino``: the official ViT, loss, AdamW, clipping, EMA; no
project code) and ``DINOPretrainModule`` under ``Trainer.fit``, softmax and entmax; images/s, the ratio to the
official step, and each path's step peak memory above what is resident (all paths' models stay on the GPU).
Data ceiling: ``DINOPretrainDataModule`` (``data=imagenet``, official multi-crop, 14 workers) on real-size JPEGs
written at the start, iterated alone, each batch moved to the GPU (and, for ``augment_on=gpu``, augmented there).
(e) the demo commands in subprocesses (own process group, killed at the budget), runs under ``--out``.
"""
from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.harness import peak_mib, peak_reset, sync

PRECISIONS = ("16-mixed", "bf16-mixed")  # the paper preset's first: a budget cut drops bf16-mixed
OFFICIAL = "main_dino.py step (transcribed) softmax"
OFFICIAL_ENTMAX = "main_dino.py step (transcribed) entmax"
LOSS_TOL_16 = 1e-2  # relative, step-1 loss of the module vs the official step under 16-bit autocast
# the module's path -> the official step it must match at step 1 (entmax: the Triton kernel on CUDA against
# the entmax library inside the official Attention)
MATCHES = {"DINOPretrainModule softmax": OFFICIAL, "DINOPretrainModule entmax": OFFICIAL_ENTMAX}


class _Until:
    """A budget ending ``reserve`` seconds before ``budget``'s (what is left for a later step of the part)."""

    def __init__(self, budget, reserve: float):
        self.budget, self.reserve = budget, reserve

    def left(self) -> float:
        return self.budget.left() - self.reserve

    def over(self) -> bool:
        return self.left() <= 0


def _preset(smoke: bool) -> dict:
    from bench import dino_step
    if smoke:
        return dict(dino_step.QUICK, warmup=1, rounds=1)
    import yaml
    paper = yaml.safe_load((Path(dino_step.__file__).parents[1] / "configs/pretrain/paper.yaml").read_text())
    return dict(dino_step.FULL, batch=paper["data"]["batch_size"], n_local=paper["data"]["n_local_crops"],
                out_dim=paper["model"]["out_dim"], warmup=2, rounds=8, compile=False)


def _timed_rounds(paths: dict, s: dict, dev, budget) -> tuple[dict, dict]:
    """({name: (wall seconds of the timed steps, max step peak MiB)}, {name: step-1 loss}); stops after a round
    once the budget is out. Step 1 (untimed) runs with drop-path off: the official and the project code draw
    their masks differently, and their step-1 losses must then agree."""
    from bench.dino_step import no_drop_path
    wall = {k: [] for k in paths}
    mem = {k: None for k in paths}
    first = {}
    for r in range(s["warmup"] + s["rounds"]):
        for name, step in paths.items():
            base = peak_reset(dev)
            sync(dev)
            t0 = time.perf_counter()
            if r == 0:
                with no_drop_path(step.student):
                    first[name] = step()
            else:
                step()
            sync(dev)
            if r >= s["warmup"]:
                wall[name].append(time.perf_counter() - t0)
                m = peak_mib(dev, base)
                mem[name] = m if mem[name] is None else max(mem[name], m)
        if r >= s["warmup"] and budget.over():
            break
    return {k: (wall[k], mem[k]) for k in paths}, first


def _amp_of(step) -> str:
    """What a path really ran: autocast dtype, and the GradScaler if any (Lightning's plugin or main_dino's)."""
    if hasattr(step, "scaler"):
        dtype, scaler = step.amp, step.scaler
    else:
        plugin = step.module.trainer.precision_plugin
        amp = getattr(plugin, "autocast_context_manager", None)
        dtype, scaler = amp().fast_dtype if amp else None, getattr(plugin, "scaler", None)
    return f"{str(dtype).replace('torch.', '')}{' + GradScaler' if scaler is not None else ''}"


def compute_rows(ctx: dict, budget) -> list[dict]:
    from bench.dino_step import LightningStep, PlainStep, make_batch
    dev, s = ctx["dev"], _preset(ctx["smoke"])
    names = [OFFICIAL, OFFICIAL_ENTMAX, *MATCHES]
    rows = []
    for precision in PRECISIONS:
        what = {"precision": precision, "batch": s["batch"], "crops": f"2 x {s['global_size']} + {s['n_local']} x "
                f"{s['local_size']}"}
        if budget.over():
            rows += [{"part": "d", **what, "path": n, "skipped": "budget"} for n in names]
            continue
        steps = s["warmup"] + s["rounds"]
        crops, labels = make_batch(s, dev)
        paths = {}
        try:
            paths[OFFICIAL] = PlainStep(s, "softmax", dev, precision, images=crops)
            paths[OFFICIAL_ENTMAX] = PlainStep(s, "entmax", dev, precision, images=crops)
            for v in ("softmax", "entmax"):
                paths[f"DINOPretrainModule {v}"] = LightningStep(s, v, False, steps, dev, precision, (crops, labels))
            res, first = _timed_rounds(paths, s, dev, budget)
            amp = {name: _amp_of(step) for name, step in paths.items()}
        except torch.OutOfMemoryError:
            rows += [{"part": "d", **what, "path": n, "skipped": "out of GPU memory"} for n in names]
            continue
        finally:
            for p in paths.values():
                if hasattr(p, "close"):
                    p.close()
            del paths
        ref = statistics.median(res[OFFICIAL][0])
        for name, (ts, m) in res.items():
            med = statistics.median(ts)
            row = {"part": "d", **what, "path": name, "steps timed": len(ts), "ms": round(1e3 * med, 1),
                   "images/s (compute ceiling)": round(s["batch"] / med, 1), "step peak MiB": m,
                   "x official (speed)": round(ref / med, 3), "step-1 loss": round(first[name], 5),
                   "autocast": amp[name]}
            if name in MATCHES:  # the same maths in 16-bit: agree to rounding
                rel = abs(first[name] - first[MATCHES[name]]) / abs(first[MATCHES[name]])
                row.update({"vs official (rel)": float(f"{rel:.2g}"), "ok": rel <= LOSS_TOL_16})
            rows.append(row)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def write_jpegs(root: Path, n: int, size: tuple[int, int], classes: int = 4) -> Path:
    """``n`` JPEGs of ``size`` (W, H) in ImageFolder layout (train/ and a small val/): smooth random scenes, so
    they decode like photographs of that size (quality 90)."""
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(0)
    w, h = size
    for split, count in (("train", n), ("val", classes)):
        for i in range(count):
            d = root / split / f"n{i % classes:08d}"
            d.mkdir(parents=True, exist_ok=True)
            low = rng.integers(0, 256, (h // 16 + 1, w // 16 + 1, 3), dtype=np.uint8)
            img = Image.fromarray(low).resize((w, h), Image.BICUBIC)
            img.save(d / f"img_{i:05d}.JPEG", quality=90)
    return root


def data_rows(ctx: dict, budget, augment_on=("cpu",)) -> list[dict]:
    """The data ceiling: images/s out of the real DataModule, per ``augment_on`` value (gpu: decoded crops moved
    to the device and augmented there in ``on_after_batch_transfer``, as in training)."""
    from lightning.fabric.utilities.apply_func import move_data_to_device

    from datamodules.pretraining import DINOPretrainDataModule
    dev, smoke = ctx["dev"], ctx["smoke"]
    workers, n, size, batch, warm, max_batches = ((2, 8, (80, 60), 4, 1, 2) if smoke else
                                                  (14, 1536, (500, 375), 64, 2, 22))
    root = write_jpegs(Path(ctx["out"]) / "d_jpegs", n, size)
    rows = []
    for where in augment_on:
        what = {"data": f"{n} JPEGs {size[0]} x {size[1]}", "workers": workers, "batch": batch, "augment_on": where}
        if budget.over():
            rows.append({"part": "d", **what, "skipped": "budget"})
            continue
        dm = DINOPretrainDataModule(data="imagenet", data_root=str(root), batch_size=batch, num_workers=workers,
                                    n_local_crops=2 if smoke else 8, multicrop_preset="official", augment_on=where,
                                    multicrop={"global_size": 32, "local_size": 16} if smoke else None)
        loader = dm.train_dataloader()
        it, times, count = iter(loader), [], 0
        try:
            for i in range(max_batches):
                t0 = time.perf_counter()
                b = dm.on_after_batch_transfer(move_data_to_device(next(it), dev), 0)
                sync(dev)
                if i >= warm:  # past the workers' start
                    times.append(time.perf_counter() - t0)
                    count += b[1].shape[0]
                if budget.over() and times:
                    break
        except StopIteration:
            pass
        finally:
            del it, loader
        rows.append({"part": "d", **what, "batches timed": len(times),
                     "images/s (data ceiling)": round(count / sum(times), 1) if times else None})
    return rows


def dino_rows(ctx: dict, budget) -> list[dict]:
    import inspect

    from datamodules.pretraining import DINOPretrainDataModule
    reserve = 20 if ctx["smoke"] else 45  # the data ceiling's share of the part
    rows = compute_rows(ctx, _Until(budget, reserve))
    where = ("cpu", "gpu") if "augment_on" in inspect.signature(DINOPretrainDataModule).parameters else ("cpu",)
    return rows + data_rows(ctx, budget, augment_on=where)


# ------------------------------------------------------------------------------------------ (e) the demo
def _run(cmd: list[str], log: Path, env: dict, timeout: float) -> tuple[int | str, float, str]:
    """(exit code or "killed: budget", wall seconds, output) of ``cmd`` in its own process group, killed whole
    at ``timeout`` (a DDP or DataLoader child must not outlive the check)."""
    t0 = time.perf_counter()
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=Path(__file__).parents[1],
                             start_new_session=True)
        try:
            rc = p.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            rc = "killed: budget"
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    return rc, round(time.perf_counter() - t0, 1), log.read_text(errors="replace")


def _last(pattern: str, root: Path) -> dict | None:
    found = sorted(root.glob(pattern), key=lambda p: p.stat().st_mtime)
    return json.loads(found[-1].read_text()) if found else None


def _demo_commands(ctx: dict) -> list[tuple[str, list[str]]]:
    py = [sys.executable, "-m"]
    pre = py + ["lightning_modules.pretrain", "--variant", "softmax", "--data", "demo"]
    probe = py + ["probes.run", "--task", "voc", "--variant", "softmax", "--data", "demo"]
    if ctx["smoke"]:  # the demo data as the tests use it; the tiny preset plus a k-NN check on 64 train images
        knn = json.dumps({"class_path": "lightning_modules.callbacks.knn.KNNCheck",
                          "init_args": {"k": 5, "max_train": 64}})
        pre += ["--preset", "tiny", f"--trainer.callbacks+={knn}", "--trainer.enable_progress_bar=false"]
        probe += ["--quick"]
    return [("make pretrain", pre), ("make probe TASK=voc", probe)]


def demo_prepare(ctx: dict) -> None:
    """Before (e)'s budget starts: the demo data both commands read (data/demo, or TOKENMIX_DEMO_ROOT; a
    complete folder is reused), so the timed part is the commands alone."""
    from datamodules.demo.cache import ensure_demo_data
    t0 = time.perf_counter()
    root = ensure_demo_data()
    ctx["e_data"] = {"demo data": str(root), "demo data s (untimed)": round(time.perf_counter() - t0, 1)}


def demo_rows(ctx: dict, budget) -> list[dict]:
    """``make pretrain`` (demo preset: GPU + bf16-mixed when CUDA is present) then ``make probe TASK=voc`` on its
    checkpoint; runs land under ``--out``/e_runs, the logs beside them."""
    out = Path(ctx["out"])
    env = {**os.environ, "TOKENMIX_RUNS": str(out / "e_runs"), "PYTHONUNBUFFERED": "1"}
    rows = []
    for i, (name, cmd) in enumerate(_demo_commands(ctx)):
        what = {"step": name, "command": " ".join(cmd[2:])}
        if budget.over() or (rows and rows[-1].get("exit") != 0):
            rows.append({"part": "e", **what, "skipped": "budget" if budget.over() else "the step before failed"})
            continue
        rc, wall, text = _run(cmd, out / f"e_{i}_{name.split()[-1].lower().replace('=', '_')}.log", env,
                              budget.left())
        row = {"part": "e", **what, "exit": rc, "wall_s": wall, **(ctx.get("e_data", {}) if not rows else {})}
        device = [ln for ln in text.splitlines() if ln.startswith("scale:") or "device:" in ln]
        if device:  # pretrain's scale line: where it ran and the precision; probe: its device line
            ln = device[-1]
            row["device line"] = ln[:ln.find(")") + 1] + " ... " + ln[ln.rfind("precision"):] if "precision" in ln \
                else ln[:160]
        if name == "make pretrain":
            m = (_last("softmax/pretrain/**/summary.json", out / "e_runs") or {}).get("metrics") or {}
            # KNNCheck's final line, for a run whose summary was written before the check ended (callback order)
            pairs = re.findall(r"knn/(top1|top1_random_init|gain)=(-?[\d.]+)", text)
            logged = {f"knn_{k}": float(v) for k, v in pairs}
            m = {**logged, **m}
            row.update({"k-NN start": m.get("knn_top1_random_init"), "k-NN end": m.get("knn_top1"),
                        "k-NN gain": m.get("knn_gain"), "loss start -> end": [m.get("loss_start"), m.get("loss_end")]})
        else:
            res = _last("**/probe/voc/**/results.json", out / "e_runs") or {}
            row["mIoU"] = (res.get("metrics") or {}).get("mIoU")
        if rc == "killed: budget":  # out of time, not wrong: reported, and the check does not fail on it
            row["skipped"] = f"budget (stopped after {wall} s)"
        elif rc != 0:
            row["error"] = (text.strip().splitlines() or ["(no output)"])[-1][:200]
        rows.append(row)
    return rows
