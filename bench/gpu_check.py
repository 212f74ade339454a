"""One-shot check for a machine with a CUDA GPU: ``make gpu-check`` (= ``python -m bench.gpu_check``).

(a) the Triton sparse-attention kernel against the ``entmax`` library on the GPU (values, q/k/v gradients);
(b) ViT-S/16 and ViT-S/8 at 224 px, batch 64, forward + backward under fp16 and bf16 autocast: time and peak
    memory for softmax (SDPA), entmax-1.5 with the Triton kernel, with the PyTorch fallback (matmuls under
    autocast, normaliser in fp32) and with ``entmax.entmax15``;
(c) 30 training steps of the DINO paper preset (configs/pretrain/paper.yaml: ViT-S/16, 2 x 224 + 8 x 96 px
    crops, fp16 mixed precision) at batch 64 on one GPU, softmax vs entmax: images/s and peak memory;
(d) issue 18's DINO step rows (``bench.dino_step`` on the GPU: fp32, batch 8, the main_dino.py step vs
    DINOPretrainModule eager and compiled, softmax and entmax): images/s and the ratio to the plain step.
Prints one table and writes bench/gpu_results.json. Without a CUDA GPU: prints "no CUDA GPU: skipped", exit 0.
Targets (issue 16): entmax step <= 1.15 x softmax step, memory <= 1.10 x. ``--smoke`` runs every part on
CPU with tiny shapes (checks the script itself; with TRITON_INTERPRET=1 the kernel rows run in Triton's
interpreter: that is how the interpreter error figures in docs/performance.md were produced).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "gpu_results.json"
TARGET = {"time": 1.15, "memory": 1.10}
FULL = dict(archs=("vit_small_patch16", "vit_small_patch8"), img=224, batch=64, repeats=10, steps=30,
            step_rounds=10, check_n=(37, 197, 785), check_bh=(2, 6), dtypes=("float16", "bfloat16"))
SMOKE = dict(archs=("vit_test_patch8",), img=32, batch=2, repeats=2, steps=3, step_rounds=2, check_n=(37, 197),
             check_bh=(1, 2),
             dtypes=("bfloat16",))
TOL = {"float32": 1e-4, "float16": 3e-3, "bfloat16": 2.5e-2}  # fp32 absolute; 16-bit relative to the max


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _peak_reset(dev: torch.device) -> int:
    if dev.type != "cuda":
        return 0
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    return torch.cuda.memory_allocated(dev)


def _peak_mib(dev: torch.device, base: int) -> float | None:
    return round((torch.cuda.max_memory_allocated(dev) - base) / 2 ** 20, 1) if dev.type == "cuda" else None


# ------------------------------------------------------------------------------------- (a) correctness
def kernel_check(dev: torch.device, ns, bh=(2, 6)) -> list[dict]:
    import entmax

    from backbones import triton_attention as ta
    if not ta.available(torch.zeros(1, device=dev)):
        return [{"part": "a", "skipped": "Triton kernel unavailable here"}]
    rows = []
    for kind, ref_fn in (("entmax15", entmax.entmax15), ("sparsemax", entmax.sparsemax)):
        for n in ns:
            for dt in ("float32", "float16", "bfloat16"):
                g = torch.Generator(device="cpu").manual_seed(n)
                q, k, v = ((torch.randn(*bh, n, 64, generator=g, dtype=torch.float64) * 1.5)
                           .to(getattr(torch, dt)).to(dev) for _ in range(3))
                do = torch.randn(*bh, n, 64, generator=g, dtype=torch.float64).to(dev)
                xs = [x.clone().requires_grad_() for x in (q, k, v)]
                out = ta.sparse_attention(*xs, 0.125, kind=kind)
                out.backward(do.to(out.dtype))
                rs = [x.double().requires_grad_() for x in (q, k, v)]
                ref = ref_fn((rs[0] @ rs[1].transpose(-2, -1)) * 0.125, dim=-1) @ rs[2]
                ref.backward(do)
                errs = [(out.double() - ref).abs().max().item()] + \
                       [(a.grad.double() - b.grad).abs().max().item() for a, b in zip(xs, rs)]
                mags = [ref.abs().max().item()] + [b.grad.abs().max().item() for b in rs]
                tol = [TOL[dt] * (1 if dt == "float32" else m) for m in mags]
                rows.append({"part": "a", "kind": kind, "n": n, "dtype": dt, "max_abs_err": errs,
                             "ok": all(e <= t for e, t in zip(errs, tol))})
    return rows


# ------------------------------------------------------------------------------- (b) ViT forward+backward
def _variants() -> dict[str, Callable[[], tuple]]:
    """name -> () -> (normaliser, use the Triton kernel)."""
    import entmax

    from backbones.normalizers import _fp32, build_normalizer
    return {"softmax (SDPA)": lambda: (None, False),
            "entmax15 Triton": lambda: (build_normalizer("entmax15"), True),
            "entmax15 PyTorch fallback": lambda: (build_normalizer("entmax15"), False),
            "entmax.entmax15": lambda: (_fp32(lambda s: entmax.entmax15(s, dim=-1)), False)}


def _kernel_lookup():
    from backbones import attention
    return attention._triton_kernel


_KERNEL_LOOKUP = _kernel_lookup()


def _configure(model, variant: str):
    """Swap every block's normaliser; returns the patch for backbones.attention's kernel lookup."""
    from backbones import attention
    norm, triton_ok = _variants()[variant]()
    for blk in model.blocks:
        blk.attn.normalizer = norm
    attention._triton_kernel = _KERNEL_LOOKUP if triton_ok else (lambda q: None)


def vit_rows(dev: torch.device, cfg: dict) -> list[dict]:
    from backbones import create_vit
    from backbones import triton_attention as ta
    rows = []
    for arch in cfg["archs"]:
        torch.manual_seed(0)
        model = create_vit(arch, "softmax", img_size=cfg["img"]).to(dev).train()
        x = torch.randn(cfg["batch"], 3, cfg["img"], cfg["img"], device=dev)
        for dt in cfg["dtypes"]:
            for variant in _variants():
                row = {"part": "b", "arch": arch, "dtype": dt, "variant": variant}
                if variant == "entmax15 Triton" and not ta.available(x):
                    rows.append({**row, "skipped": "Triton kernel unavailable here"})
                    continue
                _configure(model, variant)

                def step():
                    with torch.autocast(dev.type, dtype=getattr(torch, dt)):
                        loss = model(x).float().pow(2).mean()
                    loss.backward()
                    model.zero_grad(set_to_none=True)
                try:
                    step()  # warm-up: kernel compilation, allocator
                    base = _peak_reset(dev)
                    step()
                    mem = _peak_mib(dev, base)
                    times = []
                    for _ in range(cfg["repeats"]):
                        _sync(dev)
                        t0 = time.perf_counter()
                        step()
                        _sync(dev)
                        times.append(time.perf_counter() - t0)
                    rows.append({**row, "ms": round(1e3 * statistics.median(times), 2), "peak_mib": mem})
                except torch.OutOfMemoryError:
                    model.zero_grad(set_to_none=True)
                    rows.append({**row, "skipped": "out of GPU memory"})
        del model
    from backbones import attention
    attention._triton_kernel = _KERNEL_LOOKUP  # (c) trains with the model's own dispatch
    return rows


# ------------------------------------------------------------------------------------ (c) DINO steps
class _StepTimer:
    def __init__(self, dev):
        self.dev, self.times, self.t0, self.base = dev, [], None, 0

    def on_train_batch_start(self, *_):
        if len(self.times) == 2:  # past the warm-up (cuDNN benchmark, kernel builds)
            self.base = _peak_reset(self.dev)
        _sync(self.dev)
        self.t0 = time.perf_counter()

    def on_train_batch_end(self, *_):
        _sync(self.dev)
        self.times.append(time.perf_counter() - self.t0)


def dino_rows(dev: torch.device, cfg: dict, smoke: bool) -> list[dict]:
    import lightning.pytorch as pl
    import yaml

    from lightning_modules.dino_module import DINOPretrainModule
    preset = yaml.safe_load((REPO / "configs" / "pretrain" / "paper.yaml").read_text())
    model_args = dict(preset["model"], epochs=preset["trainer"]["max_epochs"])
    batch, n_local = cfg["batch"], preset["data"]["n_local_crops"]
    big, small = (cfg["img"], 96) if not smoke else (32, 16)
    if smoke:
        model_args.update(arch="vit_test_patch8", out_dim=256, head_hidden_dim=64, head_bottleneck_dim=32)
    from backbones import triton_attention as ta
    kernel = "Triton kernel" if ta.available(torch.zeros(1, device=dev, dtype=torch.float16)) else "PyTorch fallback"
    rows = []
    for variant in ("softmax", "entmax"):
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(0)
        crops = [torch.randn(batch, 3, s, s, generator=g).to(dev) for s in [big] * 2 + [small] * n_local]
        labels = torch.zeros(batch, dtype=torch.long, device=dev)

        class Data(pl.LightningDataModule):  # the same multi-crop batch each step (no loader cost)
            batch_size = batch

            def train_dataloader(self):
                return torch.utils.data.DataLoader([(crops, labels)] * cfg["steps"], batch_size=None)

        timer = _StepTimer(dev)
        cb = type("Timer", (pl.Callback,), {"on_train_batch_start": lambda s, *a: timer.on_train_batch_start(),
                                            "on_train_batch_end": lambda s, *a: timer.on_train_batch_end()})()
        module = DINOPretrainModule(variant=variant, **model_args)
        trainer = pl.Trainer(accelerator=dev.type, devices=1, precision="16-mixed" if dev.type == "cuda" else
                             "32-true", max_epochs=model_args["epochs"], max_steps=cfg["steps"], logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             benchmark=dev.type == "cuda", callbacks=[cb], gradient_clip_val=None)
        trainer.fit(module, datamodule=Data())
        step_s = statistics.median(timer.times[2:] or timer.times)
        rows.append({"part": "c", "variant": variant, "attention": "SDPA" if variant == "softmax" else kernel,
                     "steps": len(timer.times), "ms": round(1e3 * step_s, 1),
                     "images_per_s": round(batch / step_s, 1), "peak_mib": _peak_mib(dev, timer.base)})
    return rows


# ------------------------------------------------------------------------ (d) the DINO step, issue 18
def dino_step_rows(dev: torch.device, cfg: dict, smoke: bool) -> list[dict]:
    """``bench.dino_step`` on this device (the issue's configuration; ``--smoke``: its quick one). Wall time only:
    the process CPU time of a GPU step says little."""
    from bench import dino_step
    r = dino_step.run(quick=smoke, rounds=cfg["step_rounds"], device=str(dev))
    return [{"part": "d", "variant": row["name"], "images_per_s": row["value"] and round(row["value"], 2),
             "x_plain": round(row["ratio"], 3)} for row in r["rows"] if "[CPU time]" not in row["name"]]


# ------------------------------------------------------------------------------------------ report
def add_ratios(rows: list[dict]) -> None:
    """Time and memory of each (b)/(c) row relative to softmax in the same setting, and the targets."""
    for r in rows:
        if r["part"] not in "bc" or "ms" not in r:
            continue
        ref = next((x for x in rows if x["part"] == r["part"] and "ms" in x and x.get("arch") == r.get("arch")
                    and x.get("dtype") == r.get("dtype") and x["variant"].startswith("softmax")), None)
        if ref is None:
            continue
        r["time_x"] = round(r["ms"] / ref["ms"], 3)
        if r.get("peak_mib") and ref.get("peak_mib"):
            r["memory_x"] = round(r["peak_mib"] / ref["peak_mib"], 3)
        if r["variant"] in ("entmax15 Triton", "entmax"):
            r["meets_target"] = r["time_x"] <= TARGET["time"] and r.get("memory_x", 0) <= TARGET["memory"]


def format_table(rows: list[dict]) -> str:
    lines = ["| part | setting | variant | result | x softmax (time / memory) |", "|---|---|---|---|---|"]
    for r in rows:
        if r["part"] == "a":
            setting = f"{r.get('kind', '')} N={r.get('n', '')} {r.get('dtype', '')}"
            result = r.get("skipped") or ("ok" if r["ok"] else "FAIL") + \
                " (max abs err out/dq/dk/dv " + " / ".join(f"{e:.1e}" for e in r["max_abs_err"]) + ")"
            lines.append(f"| a | {setting} | Triton kernel | {result} | |")
            continue
        if r["part"] == "d":
            result = f"{r['images_per_s']} img/s" if r["images_per_s"] else ""
            lines.append(f"| d | DINO step, fp32 | {r['variant']} | {result} | {r['x_plain']} x plain (speed) |")
            continue
        setting = (f"{r['arch']} {r['dtype']}" if r["part"] == "b" else
                   f"DINO paper preset, {r.get('attention', '')}")
        if "skipped" in r:
            lines.append(f"| {r['part']} | {setting} | {r['variant']} | {r['skipped']} | |")
            continue
        result = f"{r['ms']} ms, {r['peak_mib']} MiB" + (f", {r['images_per_s']} img/s" if r["part"] == "c" else "")
        ratio = f"{r.get('time_x', '')} / {r.get('memory_x', '')}"
        if "meets_target" in r:
            ratio += " (target met)" if r["meets_target"] else " (target missed)"
        lines.append(f"| {r['part']} | {setting} | {r['variant']} | {result} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU: checks this script, measures nothing")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        print("no CUDA GPU: skipped")
        return 0
    from bench.run import machine_description
    dev = torch.device("cpu" if args.smoke else "cuda")
    cfg = SMOKE if args.smoke else FULL
    t0 = time.perf_counter()
    rows = (kernel_check(dev, cfg["check_n"], cfg["check_bh"]) + vit_rows(dev, cfg) + dino_rows(dev, cfg, args.smoke)
            + dino_step_rows(dev, cfg, args.smoke))
    add_ratios(rows)
    result = {"machine": machine_description(dev), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "smoke": args.smoke, "targets": TARGET, "rows": rows, "wall_s": round(time.perf_counter() - t0, 1)}
    print(format_table(rows))
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    failed = [r for r in rows if r["part"] == "a" and r.get("ok") is False]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
