"""Loops of a SASS listing: natural loops of its control-flow graph, and how many times ptxas unrolled each.

A backward branch alone is not a loop (ptxas lays blocks out out of order), so: basic blocks from the branches,
dominators, back edges (an edge to a block that dominates its source), and each back edge's natural loop (the
blocks that reach it without passing through the header). Back edges to one header make one loop.

ptxas unrolls small loops of unknown trip count (the copy runs trips/u times, and the remainder is straight code);
its loops keep LLVM's order, so the i-th SASS loop is compared with the i-th PTX loop on instructions that have a
one-for-one twin (wgmma -> HGMMA, ex2 -> MUFU, ...): u = SASS count / PTX count.
"""
from __future__ import annotations

import re
from collections import Counter

from kernel_model.sass import Instr, category

_ENDS = ("EXIT", "RET", "BRX", "JMX", "KILL")


def _blocks(instrs: list[Instr]) -> tuple[list[tuple[int, int]], dict[int, list[int]]]:
    """Basic blocks as (first index, last index) into instrs, and successors by block number."""
    index = {ins.addr: i for i, ins in enumerate(instrs)}
    leaders = {0}
    for i, ins in enumerate(instrs):
        if ins.base == "BRA" or ins.base in _ENDS:
            leaders.add(i + 1)
            if ins.target in index:
                leaders.add(index[ins.target])
    starts = sorted(x for x in leaders if x < len(instrs))
    blocks = [(s, (starts[j + 1] if j + 1 < len(starts) else len(instrs)) - 1) for j, s in enumerate(starts)]
    block_of = {s: j for j, (s, _) in enumerate(blocks)}
    succ = {}
    for j, (_, last) in enumerate(blocks):
        ins, nxt = instrs[last], ([j + 1] if j + 1 < len(blocks) else [])
        if ins.op.startswith("BRA.DIV"):  # to a fallback for a diverged warp: never taken in Triton's code,
            succ[j] = nxt  # whose control flow is uniform across each program
        elif ins.base == "BRA":
            tgt = [block_of[index[ins.target]]] if ins.target in index else []
            succ[j] = tgt + (nxt if ins.cond else [])
        elif ins.base in _ENDS:
            succ[j] = nxt if ins.cond else []
        else:
            succ[j] = nxt
    return blocks, succ


def _dominators(n: int, succ: dict[int, list[int]]) -> tuple[list[set], set, dict[int, list[int]]]:
    """Dominator sets of the blocks reachable from block 0, that reachable set, and predecessors by block."""
    pred = {j: [] for j in range(n)}
    for a, bs in succ.items():
        for b in bs:
            pred[b].append(a)
    reach, stack = {0}, [0]
    while stack:
        for b in succ[stack.pop()]:
            if b not in reach:
                reach.add(b)
                stack.append(b)
    dom = [set(reach) if j in reach else {j} for j in range(n)]
    dom[0] = {0}
    changed = True
    while changed:
        changed = False
        for j in sorted(reach - {0}):
            new = {j} | set.intersection(*(dom[p] for p in pred[j] if p in reach))
            if new != dom[j]:
                dom[j], changed = new, True
    return dom, reach, pred


def find_loops(instrs: list[Instr]) -> list[dict]:
    """Natural loops in header order: {start, end (the last back-edge branch), ranges: member blocks' address
    ranges [first, last]}."""
    if not instrs:
        return []
    blocks, succ = _blocks(instrs)
    dom, reach, pred = _dominators(len(blocks), succ)
    loops: dict[int, tuple[set, int]] = {}
    for a, bs in succ.items():
        for h in bs:
            if a in reach and h in dom[a]:  # back edge a -> h (the BRA-to-itself after EXIT is unreachable)
                body, stack = {h, a}, ([a] if a != h else [])  # a one-block loop is just that block
                while stack:
                    x = stack.pop()
                    for p in pred[x]:
                        if p not in body and p in reach:
                            body.add(p)
                            stack.append(p)
                old_body, old_end = loops.get(h, (set(), -1))
                loops[h] = (old_body | body, max(old_end, instrs[blocks[a][1]].addr))
    out = []
    for h, (body, end) in sorted(loops.items()):
        ranges = [[instrs[blocks[j][0]].addr, instrs[blocks[j][1]].addr] for j in sorted(body)]
        out.append(dict(start=instrs[blocks[h][0]].addr, end=end, ranges=ranges))
    return out


def unreachable(instrs: list[Instr]) -> set[int]:
    """Addresses of the instructions no path from the entry reaches (``BRA.DIV`` fallbacks, the branch-to-self
    after the last EXIT): they never run, so they count zero times."""
    if not instrs:
        return set()
    blocks, succ = _blocks(instrs)
    _, reach, _ = _dominators(len(blocks), succ)
    return {instrs[i].addr for j, (a, b) in enumerate(blocks) if j not in reach for i in range(a, b + 1)}


def in_loop(addr: int, loop: dict) -> bool:
    return any(a <= addr <= b for a, b in loop["ranges"])


# PTX instruction prefix -> the SASS category it becomes one-for-one
_PTX_TWINS = (("wgmma.mma_async", "HGMMA"), ("mma.sync", "HMMA"), ("ex2.approx", "MUFU"), ("ld.global", "LDG"),
              ("cp.async", "LDG"))
_PTX_HEADER = re.compile(r"^(\$L__BB\d+_\d+):.*Loop Header")
_PTX_BRA = re.compile(r"\bbra(?:\.uni)?\s+(\$L__BB\d+_\d+);")


def ptx_loops(ptx: str) -> list[dict]:
    """LLVM's loops in the PTX, in code order (its "Loop Header" comments): per loop, the counts of the
    instructions with a one-for-one SASS twin. The body is taken as the lines from the header to the last branch
    back to it (LLVM lays loops out contiguously)."""
    lines = ptx.splitlines()
    headers = {m.group(1): i for i, ln in enumerate(lines) if (m := _PTX_HEADER.match(ln))}
    ends: dict[str, int] = {}
    for i, ln in enumerate(lines):
        m = _PTX_BRA.search(ln)
        if m and m.group(1) in headers and headers[m.group(1)] < i:
            ends[m.group(1)] = i
    out = []
    for label, start in sorted(headers.items(), key=lambda kv: kv[1]):
        if label in ends:
            body = [ln.strip() for ln in lines[start:ends[label] + 1]]
            out.append(dict(Counter(cat for ln in body for pre, cat in _PTX_TWINS if ln.startswith(pre))))
    return out


def unroll_factors(instrs: list[Instr], loops: list[dict], plain: list[dict]) -> list[int]:
    """Per SASS loop, the copies of its PTX loop (``ptx_loops``) body it holds (1 where the loops cannot be paired
    or compared)."""
    if len(plain) != len(loops):
        return [1] * len(loops)
    out = []
    for lp, twin in zip(loops, plain):
        have = Counter(category(i.op) for i in instrs if in_loop(i.addr, lp))
        u = 1
        for _, cat in _PTX_TWINS:
            a, b = have.get(cat, 0), twin.get(cat, 0)
            if a and b:
                u = a // b if a % b == 0 and a >= b else 1
                break
        out.append(u)
    return out
