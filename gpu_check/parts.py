"""``make gpu-check`` parts (a) kernel correctness, (b) the attention op against SDPA flash, (c) a ViT-S/16 step.

Each ``*_rows(ctx, budget) -> list[dict]`` (``ctx``: ``dev``, ``smoke``, ``out``; ``budget``: gpu_check.check.Budget)
records a "skipped: budget" row for every setting it had no time left for.
"""
from __future__ import annotations

import contextlib

import torch

from bench.harness import median_ms, peak_mib, peak_reset, time_fn

NS = (37, 197, 201, 257, 785, 1025)
PAPER_NS = (197, 37)  # the paper preset's global (224 px) and local (96 px) crops at patch 16, with [CLS]
KINDS = ("entmax15", "sparsemax")
TOL = {"float32": 1e-4, "float16": 3e-3, "bfloat16": 2.5e-2}  # fp32 absolute; 16-bit relative to the max
# (scale of q and k, queries): peaked rows (large scores: few keys kept), flat rows (near-equal scores: most
# kept), one query against every key (the [CLS]-only last block)
SHAPES = {"peaked": (2.0, None), "flat": (0.05, None), "one query": (1.5, 1)}


def _kernel():
    from backbones import triton_attention as ta
    return ta


# ------------------------------------------------------------------------------------- (a) correctness
def _check_one(ta, kind: str, n: int, dt: str, shape: str, bh: tuple, dev: torch.device) -> dict:
    import entmax
    ref_fn = {"entmax15": entmax.entmax15, "sparsemax": entmax.sparsemax}[kind]
    amp, nq = SHAPES[shape]
    g = torch.Generator(device="cpu").manual_seed(n)
    dtype = getattr(torch, dt)
    q = torch.randn(*bh, nq or n, 64, generator=g, dtype=torch.float64) * amp
    k = torch.randn(*bh, n, 64, generator=g, dtype=torch.float64) * amp
    v = torch.randn(*bh, n, 64, generator=g, dtype=torch.float64)
    do = torch.randn(*bh, nq or n, 64, generator=g, dtype=torch.float64).to(dev)
    xs = [x.to(dtype).to(dev).requires_grad_() for x in (q, k, v)]
    out = ta.sparse_attention(*xs, 0.125, kind=kind)
    out.backward(do.to(out.dtype))
    rs = [x.detach().double().requires_grad_() for x in xs]  # the reference sees the same rounded inputs
    p = ref_fn((rs[0] @ rs[1].transpose(-2, -1)) * 0.125, dim=-1)
    (p @ rs[2]).backward(do)
    ref = (p @ rs[2]).detach()
    errs = [(out.double() - ref).abs().max().item()] + \
        [(a.grad.double() - b.grad).abs().max().item() for a, b in zip(xs, rs)]
    mags = [ref.abs().max().item()] + [b.grad.abs().max().item() for b in rs]
    tol = [TOL[dt] * (1 if dt == "float32" else m) for m in mags]
    return {"kind": kind, "dtype": dt, "n": n, "rows": shape, "kept": round((p > 0).double().mean().item(), 3),
            "max_abs_err out/dq/dk/dv": errs, "ok": all(e <= t for e, t in zip(errs, tol))}


def kernel_plan(smoke: bool) -> list[tuple[str, str, int, str]]:
    """(kind, dtype, n, rows) in the order checked: the paper's combinations first (bf16 and fp16 at 197 tokens
    = ViT-S/16 at 224 px, 37 = its 96 px local crops, and one query; entmax-1.5, then sparsemax), then the other
    N in 16 bit, fp32 last. A budget cut then drops the least used rows, and any cut fails the check."""
    ns, paper = ((37,), (37,)) if smoke else (NS, PAPER_NS)
    half = ("bfloat16", "float16")
    first = [(k, dt, n, s) for k in KINDS for dt in half for n in paper for s in SHAPES]
    rest = [(k, dt, n, s) for k in KINDS for dt in half for n in ns if n not in paper for s in SHAPES]
    return first + rest + [(k, "float32", n, s) for k in KINDS for n in ns for s in SHAPES]


def kernel_rows(ctx: dict, budget) -> list[dict]:
    dev, smoke = ctx["dev"], ctx["smoke"]
    ta = _kernel()
    if not ta.available(torch.zeros(1, device=dev, dtype=torch.bfloat16)):
        return [{"part": "a", "skipped": "Triton kernel unavailable here (Triton missing, or no GPU / interpreter)"}]
    bh = (1, 1) if smoke else (2, 6)
    rows = []
    for kind, dt, n, shape in kernel_plan(smoke):
        what = {"kind": kind, "dtype": dt, "n": n, "rows": shape}
        if budget.over():
            rows.append({"part": "a", **what, "skipped": "budget"})
            continue
        try:
            rows.append({"part": "a", **_check_one(ta, kind, n, dt, shape, bh, dev)})
        except torch.OutOfMemoryError:
            rows.append({"part": "a", **what, "skipped": "out of GPU memory"})
    return rows


# ------------------------------------------------------------------------------ (b) the op against SDPA
def _sdpa_flash():
    """SDPA restricted to its flash backend (also on the CPU, which has a flash kernel); None if unavailable."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    except ImportError:
        return None


def op_rows(ctx: dict, budget) -> list[dict]:
    dev, smoke = ctx["dev"], ctx["smoke"]
    ta = _kernel()
    b, h, d = (1, 2, 16) if smoke else (64, 6, 64)
    # the N of the kernel report's 1.3x target (197, 785) first: a part out of budget skips its last rows
    ns, warm, reps = ((37,), 1, 2) if smoke else ((197, 785, 257, 201), 3, 20)
    flash = _sdpa_flash()
    rows = []
    for n in ns:
        g = torch.Generator(device="cpu").manual_seed(n)
        q, k, v = (torch.randn(b, h, n, d, generator=g).to(dev, torch.bfloat16).requires_grad_() for _ in range(3))
        do = torch.randn(b, h, n, d, generator=g).to(dev, torch.bfloat16)
        ops = {"SDPA flash": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)}
        if ta.available(q):
            ops["Triton entmax15"] = lambda: ta.sparse_attention(q, k, v, d ** -0.5, kind="entmax15")
        ref = {}
        for mode in ("forward", "forward+backward"):
            flops = 4 * b * h * n * n * d * (3.5 if mode != "forward" else 1.0)
            for name, op in ops.items():
                what = {"op": name, "n": n, "mode": mode, "B x H x d": f"{b} x {h} x {d}"}
                if budget.over():
                    rows.append({"part": "b", **what, "skipped": "budget"})
                    continue
                use_flash = name.startswith("SDPA") and flash is not None

                def call(op=op, use_flash=use_flash, mode=mode):
                    grad = torch.no_grad() if mode == "forward" else contextlib.nullcontext()
                    with grad, flash() if use_flash else contextlib.nullcontext():
                        out = op()
                    if mode != "forward":
                        out.backward(do)
                        for x in (q, k, v):
                            x.grad = None
                try:
                    ts = time_fn(call, dev, warm, reps, budget)
                except (RuntimeError, torch.OutOfMemoryError) as e:
                    rows.append({"part": "b", **what, "skipped": f"{type(e).__name__}: {str(e)[:120]}"})
                    continue
                ms = median_ms(ts)
                ref.setdefault(mode, ms)
                rows.append({"part": "b", **what, "ms": ms, "TFLOP/s": round(flops / (ms * 1e-3) / 1e12, 3),
                             "x SDPA flash (time)": round(ms / ref[mode], 3)})
    return rows


# ------------------------------------------------------------------------------------- (c) a ViT step
def vit_rows(ctx: dict, budget) -> list[dict]:
    """One ViT-S/16 training step (forward, backward, AdamW) under bf16 autocast, softmax vs entmax (the model's
    own dispatch: the Triton kernel on CUDA)."""
    from backbones import create_vit
    dev, smoke = ctx["dev"], ctx["smoke"]
    arch, img, batch, warm, reps = (("vit_test_patch8", 32, 2, 1, 2) if smoke else
                                    ("vit_small_patch16", 224, 64, 3, 10))
    rows, ref = [], None
    x = torch.randn(batch, 3, img, img, generator=torch.Generator().manual_seed(0)).to(dev)
    for variant in ("softmax", "entmax"):
        what = {"arch": arch, "batch": batch, "variant": variant}
        if budget.over():
            rows.append({"part": "c", **what, "skipped": "budget"})
            continue
        torch.manual_seed(0)
        model = create_vit(arch, variant, img_size=img).to(dev).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step():
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = model(x).float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        try:
            step()
            base = peak_reset(dev)
            step()
            mem = peak_mib(dev, base)
            ms = median_ms(time_fn(step, dev, warm - 1, reps, budget))
        except torch.OutOfMemoryError:
            rows.append({"part": "c", **what, "skipped": "out of GPU memory"})
            continue
        finally:
            del model, opt
        ref = ref or (ms, mem)
        rows.append({"part": "c", **what, "ms": ms, "images/s": round(batch / ms * 1e3, 1), "peak_mib": mem,
                     "x softmax (time)": round(ms / ref[0], 3),
                     "x softmax (memory)": round(mem / ref[1], 3) if mem and ref[1] else None})
    return rows
