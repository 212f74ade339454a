"""Read a compiled cubin: SASS instructions, their counts and source lines from one ``nvdisasm -gi`` listing
(Triton compiles with ``-lineinfo``; its branch labels resolved to addresses, as ``cuobjdump -sass`` prints them),
static resources (``cuobjdump -res-usage``) and the ptxas log. Both tools ship in the triton
wheel (``triton/backends/nvidia/bin``), so this works on a machine without CUDA or a GPU.

Counts are *static*: one per instruction in the listing, whatever its predicate. ``weighted_counts`` multiplies
each instruction by the trip counts of the loops around it (``kernel_model.loop_trips`` finds those).
"""
from __future__ import annotations

import re
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import triton

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"

# one SASS line: /*addr*/  [@[!]P|UP pred]  OPCODE[.MODS]  operands ;
_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)\s*([^;]*);")
_BRA_TARGET = re.compile(r"^(?:0x)?([0-9a-f]+)$")
_LINE = re.compile(r'//## File "([^"]+)", line (\d+)(?: inlined at "([^"]+)", line (\d+))?')
_ADDR = re.compile(r"/\*([0-9a-f]{4,})\*/")
_LABEL_DEF = re.compile(r"^\s*(\.L_x_\d+):")
_LABEL_USE = re.compile(r"`\((\.L_x_\d+)\)")
_MMA_SHAPE = re.compile(r"^(HGMMA)\.(\d+)x(\d+)x(\d+)\.|^(HMMA)\.(\d)(\d)(\d+)\.")

# SASS opcode (before the first '.') -> the counter it adds to
CATEGORIES = {
    "HGMMA": "HGMMA", "HMMA": "HMMA",
    "FFMA": "FFMA", "FMUL": "FMUL", "FADD": "FADD",
    "MUFU": "MUFU",
    "LDS": "LDS", "LDSM": "LDS", "STS": "STS", "STSM": "STS",
    "BAR": "BAR",
    "FMNMX": "ALU", "FSETP": "ALU", "FSEL": "ALU", "FSET": "ALU", "ISETP": "ALU", "SEL": "ALU", "LOP3": "ALU",
    "IADD3": "ALU", "VIADD": "ALU", "IMNMX": "ALU", "VIMNMX": "ALU", "SHF": "ALU", "LEA": "ALU", "PLOP3": "ALU",
    "FCHK": "ALU", "F2FP": "ALU", "PRMT": "ALU",
    "SHFL": "SHFL", "LDL": "LDL", "STL": "STL",
    "LDG": "LDG", "LDGSTS": "LDG", "STG": "STG", "ATOMG": "ATOM", "RED": "ATOM", "REDG": "ATOM",
}
COUNTERS = ("HGMMA", "HMMA", "FFMA", "FMUL", "FADD", "MUFU", "LDS", "STS", "BAR", "ALU", "SHFL",
            "LDL", "STL", "LDG", "STG", "ATOM")


@dataclass(frozen=True)
class Instr:
    addr: int
    op: str           # full opcode with modifiers, e.g. "HGMMA.64x64x16.F32.BF16", "MUFU.EX2"
    target: int = -1  # branch target address for BRA, else -1
    cond: bool = False  # predicated (@P0 ..., or a predicate operand of BRA): may fall through

    @property
    def base(self) -> str:
        return self.op.split(".", 1)[0]


def tool(name: str) -> Path:
    path = BIN / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the triton wheel ships cuobjdump and nvdisasm there "
                                "(reinstall triton, `make install`)")
    return path


def _run_on_cubin(cubin: bytes, args: list[str]) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([*args, f.name], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"{args[0]} failed ({out.returncode}): {out.stderr.strip()[:500]}")
    return out.stdout


def nvdisasm_lines(cubin: bytes) -> str:
    """The SASS listing with source lines. One disassembly serves both: each takes about half a second."""
    return _run_on_cubin(cubin, [str(tool("nvdisasm")), "-gi", "-c"])


def resolve_labels(text: str) -> str:
    """nvdisasm names branch targets by label (``BRA `(.L_x_3)``); each becomes the address of the instruction
    the label stands before (``BRA 0x1f70``), as cuobjdump prints them and ``parse_sass`` reads them."""
    addrs, pending = {}, []
    for raw in text.splitlines():
        label = _LABEL_DEF.match(raw)
        if label:
            pending.append(label.group(1))
            continue
        a = _ADDR.search(raw)
        if a and pending:
            addrs.update(dict.fromkeys(pending, a.group(1)))
            pending = []
    return _LABEL_USE.sub(lambda m: "0x" + addrs[m.group(1)] if m.group(1) in addrs else m.group(0), text)


def resource_usage(cubin: bytes) -> dict:
    """``cuobjdump -res-usage``: REG, STACK, SHARED (static), LOCAL of the kernel function."""
    text = _run_on_cubin(cubin, [str(tool("cuobjdump")), "-res-usage"])
    m = re.search(r"Function [^:]+:\s*\n\s*(.*)", text)
    return {k: int(v) for k, v in re.findall(r"(\w+):(\d+)", m.group(1))} if m else {}


def parse_sass(text: str) -> list[Instr]:
    out = []
    for m in _INSTR.finditer(text):
        op, operands = m.group(3), m.group(4).strip()
        target, cond = -1, bool(m.group(2)) and m.group(2).strip() not in ("@PT", "@UPT")
        if op.split(".")[0] == "BRA":
            parts = [x.strip() for x in operands.split(",")]
            t = _BRA_TARGET.match(parts[-1])
            target = int(t.group(1), 16) if t else -1
            cond = cond or len(parts) > 1  # BRA.U !UP0, 0x...: a uniform predicate operand
        out.append(Instr(int(m.group(1), 16), op, target, cond))
    return out


def parse_ptxas_log(text: str) -> dict:
    """Registers, spill stores/loads and stack frame from ``ptxas -v``'s log."""
    def grab(pattern):
        m = re.search(pattern, text)
        return int(m.group(1)) if m else 0
    return dict(registers=grab(r"Used (\d+) registers"), spill_stores=grab(r"(\d+) bytes spill stores"),
                spill_loads=grab(r"(\d+) bytes spill loads"), stack=grab(r"(\d+) bytes stack frame"))


def line_chains(text: str) -> dict[int, tuple]:
    """addr -> ((file, line), (file, call line), ...): innermost source line first, then the inlining call sites."""
    chains, current, group, in_group = {}, (), [], False
    for raw in text.splitlines():
        m = _LINE.search(raw)
        if m:
            if not in_group:
                group, in_group = [], True
            group.append((m.group(1), int(m.group(2))))
            continue
        if in_group:
            current, in_group = tuple(group), False
        a = _ADDR.search(raw)
        if a:
            chains[int(a.group(1), 16)] = current
    return chains


def category(op: str) -> str | None:
    base = op.split(".", 1)[0]
    if base == "BAR" or op.startswith("BAR."):
        return "BAR"
    return CATEGORIES.get(base)


def mma_macs(op: str) -> tuple[str, int]:
    """(kind, multiply-adds per instruction): HGMMA.MxNxK per warpgroup, HMMA.MNK per warp; kind is the operand
    type (BF16/F16/TF32/...) prefixed with the unit, e.g. ("HGMMA.BF16", 64*64*16)."""
    m = _MMA_SHAPE.match(op)
    if not m:
        return "", 0
    ty = op.rsplit(".", 1)[-1]
    ty = "F16" if ty in ("F32", "F16") else ty  # ".F32" alone: fp16 operands, fp32 accumulator
    if m.group(1):
        return f"HGMMA.{ty}", int(m.group(2)) * int(m.group(3)) * int(m.group(4))
    # HMMA.16816 = m16 n8 k16, HMMA.1688 = m16 n8 k8 (types: .F32.BF16 / .F32 (fp16) / .F32.TF32)
    mnk = m.group(6) + m.group(7) + m.group(8)
    mm, nn, kk = (16, 8, int(mnk[3:])) if mnk.startswith("168") else (0, 0, 0)
    return f"HMMA.{ty}", mm * nn * kk


def weighted_counts(instrs: list[Instr], weights: dict[int, float]) -> tuple[Counter, Counter]:
    """(counters, multiply-adds by kind), every instruction counted ``weights.get(addr, 1)`` times."""
    counts, macs = Counter(), Counter()
    for ins in instrs:
        w = weights.get(ins.addr, 1.0)
        cat = category(ins.op)
        if cat:
            counts[cat] += w
        kind, n = mma_macs(ins.op)
        if n:
            macs[kind] += w * n
    return counts, macs
