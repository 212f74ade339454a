"""How many keys' scores can one 64-row program of the Triton forward keep in registers? (issue 31: "scores kept
on chip for N <= 1025", so that q k^T is computed once; today only rows of <= 272 keys are.)

```
.venv/bin/python -m bench.onchip_probe                              # 4 and 8 warps, 2-7 tiles, fp32 and fp16
.venv/bin/python -m bench.onchip_probe --warps 4 --tiles 3 --store fp16
```

The probe compiles, for sm_90 with the triton wheel's ptxas (no GPU), the least a fused forward must do with the
scores on chip: ``tiles`` products q k^T of 128 keys each, kept as ``store`` tiles (the running max subtracted:
16-bit z loses nothing that matters near it), three threshold passes over all of them (each: |S|, sum d and
sum d^2 of d = (z - t)_+, and a step of t from them: a stand-in for the closed form, whose cost, not value,
matters here), then p v on the tensor cores. The real kernel does more (Og, the exact test, both sides of t),
so where the probe spills, so would it. It prints registers, stack bytes
(spills) and the layout Triton chose for the q k^T tile (``warpsPerCTA``: [8, 1] for a 64-row tile over 8 warps
means each warpgroup repeats the other's products).

The answer it gives (docs/performance.md, "Not done"): a 16-bit tile takes as many registers as an fp32 one
(Triton keeps each 16-bit element in its own 32-bit register), so 4 warps hold 256-272 keys and no more, and
8 warps do not give a 64-row tile more registers. 785 keys (100 KB as 16-bit per program) need explicit shared
memory: Gluon or CUDA, not Triton's tile language.
"""
from __future__ import annotations

import argparse
import re

import triton
import triton.language as tl
from triton.compiler import ASTSource

from bench import sass
from bench.kernel_compile import TARGETS

TILE_N = 128
STORES = {"fp32": tl.float32, "fp16": tl.float16, "bf16": tl.bfloat16}


@triton.jit
def _probe_kernel(Q, K, V, O, T, TILES: tl.constexpr, BLOCK_N: tl.constexpr, STORE: tl.constexpr):
    rm, rd, rn = tl.arange(0, 64), tl.arange(0, 64), tl.arange(0, BLOCK_N)
    q = tl.load(Q + rm[:, None] * 64 + rd[None, :])
    zs, maxes = (), ()
    mx = tl.full([64], float("-inf"), tl.float32)
    for i in tl.static_range(TILES):  # q k^T once, each tile kept relative to the running max
        s = tl.dot(q, tl.trans(tl.load(K + (i * BLOCK_N + rn)[:, None] * 64 + rd[None, :]))) * 0.0625
        mx = tl.maximum(mx, tl.max(s, 1))
        zs = zs + ((s - mx[:, None]).to(STORE),)
        maxes = maxes + (mx,)
    t = tl.load(T + rm)
    for _ in range(3):  # threshold passes over every stored tile
        k, s1, s2 = tl.zeros([64], tl.float32), tl.zeros([64], tl.float32), tl.zeros([64], tl.float32)
        for i in tl.static_range(TILES):
            d = tl.clamp(zs[i].to(tl.float32) - (t + mx - maxes[i])[:, None], 0.0, 1.0)
            k, s1, s2 = k + tl.sum((d > 0).to(tl.float32), 1), s1 + tl.sum(d, 1), s2 + tl.sum(d * d, 1)
        t = t + (s2 - 1.0) / (s1 + k)
    acc = tl.zeros([64, 64], tl.float32)
    for i in tl.static_range(TILES):
        d = tl.clamp(zs[i].to(tl.float32) - (t + mx - maxes[i])[:, None], 0.0, 1.0)
        acc += tl.dot((d * d).to(tl.bfloat16), tl.load(V + (i * BLOCK_N + rn)[:, None] * 64 + rd[None, :]))
    tl.store(O + rm[:, None] * 64 + rd[None, :], acc)


def probe(warps: int, tiles: int, store: str, target: str = "sm_90") -> dict:
    """Compile the probe; its registers, stack bytes (spills), wgmma count and the q k^T tile's warpsPerCTA."""
    sig = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*fp32", "T": "*fp32"}
    src = ASTSource(_probe_kernel, sig, {"TILES": tiles, "BLOCK_N": TILE_N, "STORE": STORES[store]},
                    {(i,): [["tt.divisibility", 16]] for i in range(len(sig))})
    compiled = triton.compile(src, target=TARGETS[target], options={"num_warps": warps})
    res = sass.resource_usage(compiled.asm["cubin"])
    return {"warps": warps, "tiles": tiles, "keys": tiles * TILE_N, "store": store, "registers": res["REG"],
            "stack": res["STACK"], "wgmma": compiled.asm["ptx"].count("wgmma.mma_async"),
            "qk_layout": _qk_layout(compiled.asm["ttgir"])}


def _qk_layout(ttgir: str) -> str:
    """warpsPerCTA of the q k^T products' accumulator (64 x TILE_N fp32) in the TTGIR."""
    layouts = dict(re.findall(r"^#(\w+) = #ttg\.nvidia_mma<\{.*warpsPerCTA = (\[\d+, \d+\])", ttgir, re.M))
    found = {layouts[name] for name in re.findall(rf"warp_group_dot .*-> tensor<64x{TILE_N}xf32, #(\w+)>", ttgir)}
    assert len(found) == 1, found
    return found.pop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--tiles", type=int, nargs="+", default=[2, 3, 4, 7])
    ap.add_argument("--store", choices=sorted(STORES), nargs="+", default=["fp32", "fp16"])
    args = ap.parse_args(argv)
    print(f"{'warps':>5} {'keys':>5} {'store':>5} {'regs':>5} {'stack B':>8} {'wgmma':>6}  q k^T layout")
    for warps in args.warps:
        for tiles in args.tiles:
            for store in args.store:
                r = probe(warps, tiles, store)
                print(f"{warps:>5} {r['keys']:>5} {store:>5} {r['registers']:>5} {r['stack']:>8} {r['wgmma']:>6}  "
                      f"{r['qk_layout']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
