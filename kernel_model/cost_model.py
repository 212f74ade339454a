"""A static throughput model of a kernel on one H200 (GH100, sm_90): time = max over three pipes, no memory term.

    cycles per program = max(tensor-core cycles, FMA-pipe cycles, MUFU cycles)
    time = cycles per program * programs / SMs / clock

Per program (CTA), from loop-weighted SASS counts (``kernel_model.sass``; one count = one warp instruction):

- tensor cores: multiply-adds / rate. HGMMA.MxNxK is one warpgroup's M*N*K multiply-adds (a CTA of W warps has
  W/4 warpgroups); HMMA.16816 is one warp's 16*8*16. Rates per SM per clock, dense:
  HGMMA bf16/fp16 2048, HGMMA tf32 1024 (NVIDIA H100 whitepaper: 989.4 / 494.7 dense TFLOP/s
  = 132 SMs x 2 x rate x 1.83 GHz). HMMA (``mma.sync``) on sm_90: 1024 bf16/fp16, 512 tf32 -- assumed A100's
  per-SM rate (an A100 SM issues 1024 bf16 FMA/clk: 312 TFLOP/s = 108 x 2 x 1024 x 1.41 GHz); microbenchmarks
  of Hopper report mma.sync well below wgmma's peak (Luo et al. 2024, "Benchmarking and dissecting the NVIDIA
  Hopper GPU architecture"), so this is optimistic for HMMA;
- FMA pipe: FFMA + FMUL + FADD, 32 lanes each, at 128 lanes per SM per clock (4 sub-partitions x 32 FP32 lanes);
- MUFU (exp2, rsqrt, sqrt, rcp, ...): 16 lanes per SM per clock (4 per sub-partition).

Reported beside the three, in the max only with ``alu=True`` (``--alu``): an ALU bound (compares, selects,
min/max, integer, 64 lanes per SM per clock) and the shared-memory / barrier counts, so a kernel bound
elsewhere shows. No memory bandwidth, latency, occupancy or tail-wave term: the model ranks instruction mixes;
the ratio to the yardstick, which gets the same model, is what is meant to carry over.
"""
from __future__ import annotations

SMS = 132
CLOCK_HZ = 1.83e9  # the clock at which 132 SMs x 2048 bf16 FMA/clk give NVIDIA's 989.4 dense TFLOP/s
TENSOR_RATE = {"HGMMA.BF16": 2048, "HGMMA.F16": 2048, "HGMMA.TF32": 1024,
               "HMMA.BF16": 1024, "HMMA.F16": 1024, "HMMA.TF32": 512}
FMA_LANES, MUFU_LANES, ALU_LANES = 128, 16, 64
WARP = 32


def program_cycles(counts: dict, macs: dict, num_warps: int, alu: bool = False) -> dict:
    """Cycles one program keeps each pipe of one SM busy. counts: loop-weighted per-warp SASS counters
    (kernel_model.sass.COUNTERS); macs: multiply-adds per issuing unit (warpgroup for HGMMA, warp for HMMA) by kind."""
    unknown = [k for k in macs if k not in TENSOR_RATE]
    if unknown:
        raise ValueError(f"no tensor-core rate for {unknown}: add it to kernel_model.cost_model.TENSOR_RATE")
    tensor = sum(n * (num_warps / 4 if k.startswith("HGMMA") else num_warps) / TENSOR_RATE[k]
                 for k, n in macs.items())
    lanes = num_warps * WARP
    fma = (counts.get("FFMA", 0) + counts.get("FMUL", 0) + counts.get("FADD", 0)) * lanes / FMA_LANES
    mufu = counts.get("MUFU", 0) * lanes / MUFU_LANES
    alu_cycles = counts.get("ALU", 0) * lanes / ALU_LANES
    pipes = dict(tensor=tensor, fma=fma, mufu=mufu, alu=alu_cycles) if alu else dict(tensor=tensor, fma=fma, mufu=mufu)
    bound = max(pipes, key=pipes.get)
    return dict(tensor=tensor, fma=fma, mufu=mufu, alu=alu_cycles, cycles=pipes[bound], bound=bound)


def kernel_time_us(cycles_per_program: float, programs: int) -> float:
    """Predicted microseconds for ``programs`` programs spread evenly over the SMs."""
    return cycles_per_program * programs / SMS / CLOCK_HZ * 1e6
