"""Sparse attention vs fused softmax: op level and whole ViT forward + backward, time and peak memory.

``run(quick=False) -> {"rows": [...], ...}``; ratios are against fused softmax (SDPA). Times: every
variant is timed in turn within each repeat (side by side, so load on a shared machine hits all alike),
median of ``repeats``. Peak memory: each variant in a fresh subprocess (``python -m bench.attention
--memory-child ...``); on CPU the high-water mark of resident memory above the state before the step
(VmHWM reset through /proc/self/clear_refs, glibc told to hand large blocks back at once so RSS follows
live tensors); on GPU ``torch.cuda.max_memory_allocated`` above the same baseline.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from bench.harness import machine_description, sync

REPO = Path(__file__).resolve().parents[1]
FULL = dict(arch="vit_small_patch16", img=224, batch=8, repeats=7)
QUICK = dict(arch="vit_test_patch8", img=32, batch=2, repeats=2, quick=True)
TARGETS = {"time": 1.10, "time_stretch": 1.03, "memory": 1.15}

# name -> (attention normaliser, entmax_fast backend); None = fused SDPA softmax
VIT_VARIANTS: dict[str, tuple[str | None, str]] = {
    "softmax (fused SDPA)": (None, "auto"),
    "softmax (manual)": ("softmax", "auto"),
    "entmax15 fast, C++ kernel": ("entmax15", "cpp"),
    "entmax15 fused attention, C++ kernel": ("entmax15_attention", "cpp"),
    "entmax15 fast, PyTorch path": ("entmax15", "torch"),
    "entmax15 reference (entmax lib)": ("entmax15_ref", "auto"),
    "sparsemax fast, C++ kernel": ("sparsemax", "cpp"),
}
MEMORY_VARIANTS = ("softmax (fused SDPA)", "softmax (manual)", "entmax15 fast, C++ kernel",
                   "entmax15 fused attention, C++ kernel", "entmax15 reference (entmax lib)")


def _normalizer(kind: str | None, backend: str = "auto") -> Callable[[torch.Tensor], torch.Tensor] | None:
    import entmax

    from backbones import entmax_fast

    def fp32(fn):  # as the model's normaliser registry does: fp32 compute under autocast
        return lambda s: fn(s.float()).to(s.dtype)

    return {None: None, "softmax": lambda s: s.softmax(-1),
            "entmax15": fp32(lambda s: entmax_fast.entmax15(s, dim=-1, backend=backend)),
            "sparsemax": fp32(lambda s: entmax_fast.sparsemax(s, dim=-1, backend=backend)),
            "entmax15_ref": fp32(lambda s: entmax.entmax15(s, dim=-1))}[kind]


def build_model(arch: str, img: int, device: torch.device) -> torch.nn.Module:
    """The project ViT (softmax variant: same weights for every normaliser, swapped per step)."""
    from backbones import create_vit
    return create_vit(arch, "softmax", img_size=img).to(device).train()


def _fused_attention_forward(self, x: torch.Tensor, attn_mask=None, is_causal: bool = False) -> torch.Tensor:
    """TokenMixAttention.forward with the three unfused lines replaced by entmax_fast.sparse_attention
    (used here until backbones/attention.py calls it itself)."""
    from backbones.entmax_fast import sparse_attention
    B, N, _ = x.shape
    qkv = self._qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    q, k = self.q_norm(q), self.k_norm(k)
    x = sparse_attention(q, k, v, self.scale, "entmax15", backend=self.entmax_backend).to(v.dtype)
    x = x.transpose(1, 2).reshape(B, N, self.attn_dim)
    return self.proj_drop(self.proj(self.norm(x)))


def _set_normalizer(model: torch.nn.Module, kind: str | None, backend: str = "auto") -> None:
    import types
    fused = kind == "entmax15_attention"
    norm = _normalizer("entmax15" if fused else kind, backend)
    for blk in model.blocks:
        blk.attn.normalizer, blk.attn.entmax_backend = norm, backend
        if fused:
            blk.attn.forward = types.MethodType(_fused_attention_forward, blk.attn)
        else:
            blk.attn.__dict__.pop("forward", None)


def _step(model: torch.nn.Module, x: torch.Tensor) -> None:
    model(x).float().pow(2).mean().backward()  # any scalar of the [CLS] output: the DINO head's input
    model.zero_grad(set_to_none=False)


def _time_side_by_side(fns: dict[str, Callable[[], None]], repeats: int,
                       device: torch.device) -> dict[str, dict[str, list[float]]]:
    """name -> {"wall": [s, ...], "cpu": [s, ...]}; cpu = this process's CPU time (all threads), which
    other processes' load disturbs much less than wall time on a shared machine."""
    for fn in fns.values():  # warm-up: allocator, kernel build, lazy init
        fn()
    times = {k: {"wall": [], "cpu": []} for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            sync(device)
            times[name]["wall"].append(time.perf_counter() - t0)
            times[name]["cpu"].append(time.process_time() - c0)
    return times


def vit_times(cfg: dict, device: torch.device) -> dict[str, dict[str, list[float]]]:
    torch.manual_seed(0)
    model = build_model(cfg["arch"], cfg["img"], device)
    x = torch.randn(cfg["batch"], 3, cfg["img"], cfg["img"], device=device)

    def make(kind, backend):
        def fn():
            _set_normalizer(model, kind, backend)
            _step(model, x)
        return fn

    variants = {k: v for k, v in VIT_VARIANTS.items() if _cpp_ok(device) or v[1] != "cpp"}
    return _time_side_by_side({k: make(*v) for k, v in variants.items()}, cfg["repeats"], device)


def op_times(cfg: dict, device: torch.device) -> dict[str, dict[str, list[float]]]:
    """The normaliser alone, forward + backward, on attention logits of the ViT's shape."""
    import entmax

    from backbones import entmax_fast
    from backbones import ARCHS
    a = ARCHS[cfg["arch"]]
    t = (cfg["img"] // a["patch_size"]) ** 2 + 1
    torch.manual_seed(0)
    logits = torch.randn(cfg["batch"], a["num_heads"], t, t, device=device) * 0.15  # ~ViT-S logits at init
    grad = torch.randn_like(logits)

    def make(fn, **backend):
        def run():
            x = logits.clone().requires_grad_()
            fn(x, **backend).backward(grad)
        return run

    fns = {"softmax": make(lambda s: s.softmax(-1)),
           "entmax15 fast, C++ kernel": make(entmax_fast.entmax15, backend="cpp"),
           "entmax15 fast, PyTorch path": make(entmax_fast.entmax15, backend="torch"),
           "entmax15 reference (entmax lib)": make(lambda s: entmax.entmax15(s, dim=-1)),
           "sparsemax fast, C++ kernel": make(entmax_fast.sparsemax, backend="cpp"),
           "sparsemax reference (entmax lib)": make(lambda s: entmax.sparsemax(s, dim=-1))}
    if not _cpp_ok(device):
        fns = {k: v for k, v in fns.items() if "C++" not in k}
    return _time_side_by_side(fns, max(cfg["repeats"], 5), device)


def op_micro(repeats: int = 9) -> dict[str, dict[str, float]]:
    """Each kernel called directly, one thread, CPU time per call (ms, median), on (8*6*197, 197) logits of
    two scales (``python -m bench.attention --ops``): the cost split behind the op-only rows."""
    import entmax

    from backbones import entmax_fast as ef
    if not ef.cpp_available():
        raise RuntimeError(f"C++ entmax kernel did not build:\n{ef.cpp_build_error()}")
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    out = {}
    try:
        for std in (0.15, 1.0):
            torch.manual_seed(0)
            x = torch.randn(8 * 6 * 197, 197) * std
            y, dx, dy = torch.empty_like(x), torch.empty_like(x), torch.randn_like(x)
            mt = torch.empty(x.shape[0], 2)
            sm = torch.softmax(x, -1)
            ef._cpp_call("entmax15_fwd", x, y, mt)
            fns = {"softmax forward": lambda: torch.softmax(x, -1),
                   "softmax backward": lambda: torch._softmax_backward_data(dy, sm, -1, torch.float32),
                   "entmax15 forward (C++)": lambda: ef._cpp_call("entmax15_fwd", x, y, mt),
                   "entmax15 backward (C++)": lambda: ef._cpp_call("entmax15_bwd", y, dy, dx),
                   "entmax15 recompute from (m, tau) (C++)": lambda: ef._cpp_call("entmax15_apply", x, mt, y),
                   "sparsemax forward (C++)": lambda: ef._cpp_call("sparsemax_fwd", x, y, None),
                   "entmax15 forward (PyTorch path)": lambda: ef._forward_torch(x, True),
                   "entmax.entmax15 forward (sort)": lambda: entmax.entmax15(x, dim=-1)}
            t = {k: [] for k in fns}
            for _ in range(repeats):
                for k, f in fns.items():
                    c0 = time.process_time()
                    f()
                    t[k].append(time.process_time() - c0)
            out[f"logit std {std}"] = {k: round(statistics.median(v) * 1e3, 2) for k, v in t.items()}
    finally:
        torch.set_num_threads(old)
    return out


# ---------------------------------------------------------------------------------------------- memory
def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def memory_child(variant: str, cfg: dict, device: torch.device) -> dict:
    """Peak memory of one forward + backward above the state right before it (fresh process)."""
    kind, backend = VIT_VARIANTS[variant]
    torch.manual_seed(0)
    model = build_model(cfg["arch"], cfg["img"], device)
    _set_normalizer(model, kind, backend)
    x = torch.randn(cfg["batch"], 3, cfg["img"], cfg["img"], device=device)
    _step(model, x)  # warm-up; grads now exist, as in training
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        _step(model, x)
        torch.cuda.synchronize(device)
        return {"peak_mib": (torch.cuda.max_memory_allocated(device) - base) / 2**20, "method": "cuda allocator"}
    if not Path("/proc/self/clear_refs").exists():
        return {"peak_mib": None, "method": "unavailable: needs Linux /proc/self/clear_refs"}
    base = _rss_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    _step(model, x)
    return {"peak_mib": (_rss_kib("VmHWM") - base) / 1024, "method": "VmHWM - VmRSS before step"}


def memory_peaks(cfg: dict, device: torch.device) -> dict[str, float | str]:
    out: dict[str, float | str] = {}
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="0")
    for variant in MEMORY_VARIANTS:
        if cfg.get("quick") and variant not in ("softmax (fused SDPA)", "entmax15 fused attention, C++ kernel"):
            continue  # smoke test: one child per path is enough
        if not _cpp_ok(device) and VIT_VARIANTS[variant][1] == "cpp":
            continue
        if cfg.get("quick"):  # smoke test: in this process (numbers meaningless, the code path exercised)
            res = memory_child(variant, cfg, device)
            out[variant] = res["peak_mib"] if res["peak_mib"] is not None else res["method"]
            continue
        cmd = [sys.executable, "-m", "bench.attention", "--memory-child", variant, "--cfg", json.dumps(cfg),
               "--device", str(device)]
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            out[variant] = f"failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}"
            continue
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        out[variant] = res["peak_mib"] if res["peak_mib"] is not None else res["method"]
    return out


# ------------------------------------------------------------------------------------------------ report
def _rows(prefix: str, times: dict[str, dict[str, list[float]]], base: str, target: float | None,
          cpu_rows: bool) -> list[dict]:
    rows = []
    for clock in ("wall", "cpu") if cpu_rows else ("wall",):
        med = {k: statistics.median(v[clock]) * 1e3 for k, v in times.items()}
        for k, v in med.items():
            row = {"name": f"{prefix}{' [CPU time]' if clock == 'cpu' else ''}: {k}", "value": round(v, 2),
                   "unit": "ms", "ratio": round(v / med[base], 3), "baseline": base, "clock": clock,
                   "samples_ms": [round(t * 1e3, 2) for t in times[k][clock]]}
            if target is not None and "entmax15" in k and "C++" in k:
                row["target"] = target
            rows.append(row)
    return rows


def _cpp_ok(device: torch.device) -> bool:
    from backbones import entmax_fast
    return device.type == "cpu" and entmax_fast.cpp_available()


def _log(msg: str) -> None:
    print(f"[bench.attention] {msg}", file=sys.stderr, flush=True)


def run(quick: bool = False, device: str | None = None) -> dict:
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cfg = dict(QUICK if quick else FULL)
    from backbones import entmax_fast
    note = None
    if dev.type == "cpu" and not _cpp_ok(dev):
        note = f"C++ kernel variants skipped: the kernel did not build ({entmax_fast.cpp_build_error()})"
        _log(note)
    label = f"{cfg['arch']} {cfg['img']}px b{cfg['batch']} fwd+bwd"
    _log(f"timing {label}, {len(VIT_VARIANTS)} variants x {cfg['repeats']} repeats on {dev}")
    rows = _rows(f"ViT {label}", vit_times(cfg, dev), "softmax (fused SDPA)", TARGETS["time"],
                 cpu_rows=dev.type == "cpu")
    _log("timing the normaliser op alone")
    rows += _rows("op only, fwd+bwd", op_times(cfg, dev), "softmax", None, cpu_rows=dev.type == "cpu")
    _log("peak memory, one fresh process per variant")
    peaks = memory_peaks(cfg, dev)
    base = peaks.get("softmax (fused SDPA)")
    for k, v in peaks.items():
        row = {"name": f"peak memory, ViT {label}: {k}", "unit": "MiB"}
        if isinstance(v, float):
            row.update(value=round(v, 3), ratio=round(v / base, 3) if isinstance(base, float) and base > 0 else None)
            if "entmax15" in k and "C++" in k:
                row["target"] = TARGETS["memory"]
        else:
            row.update(value=None, ratio=None, note=v)
        rows.append(row)
    return {"comparison": "attention", "config": cfg, "device": str(dev), "machine": machine_description(dev),
            "threads": torch.get_num_threads(), "rows": rows, **({"note": note} if note else {})}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--memory-child", help="internal: measure one variant's peak memory and print JSON")
    p.add_argument("--cfg", default=json.dumps(FULL))
    p.add_argument("--device", default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--ops", action="store_true", help="only the per-kernel CPU-time table (one thread)")
    a = p.parse_args(argv)
    if a.ops:
        for scale, row in op_micro().items():
            print(scale)
            for k, v in row.items():
                print(f"  {k:42s} {v:8.2f} ms")
        return
    if a.memory_child:
        dev = torch.device(a.device or "cpu")
        print(json.dumps(memory_child(a.memory_child, json.loads(a.cfg), dev)))
        return
    print(json.dumps(run(quick=a.quick, device=a.device), indent=1))


if __name__ == "__main__":
    main()
