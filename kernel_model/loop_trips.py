"""How many times each SASS loop of a Triton kernel runs per program, from the Python loop it was compiled from.

A SASS loop (``kernel_model.sass_loops.find_loops``) is matched to a source loop through the line info of its back-edge
branch: the innermost ``for``/``while`` of the kernel's source that contains that line, looking through the
inlining chain (helpers are inlined; the chain lists their call sites). Its trip count is then

- ``for x in range(a, b, c)`` (also ``tl.range``): evaluated with the kernel's constexprs and scalar arguments
  (N, M, ...), carried into inlined helpers by binding the call site's argument expressions, plus the
  straight-line assignments of each function above the loop;
- ``while``: data-dependent (the threshold passes); the caller supplies the count (``passes``), less the
  function's ``PASSES_BEFORE`` argument where it has one (passes made before the loop, e.g. fused with the max).

A bound that cannot be evaluated (e.g. it depends on ``tl.program_id``) is reported as unresolved, trip 1.
"""
from __future__ import annotations

import ast
import functools
import math
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SourceLoop:
    file: str
    lineno: int
    end: int
    kind: str        # "for" | "while"
    node: ast.AST
    func: ast.FunctionDef


class _TL:
    """The few triton.language calls a loop bound may use, on Python ints."""
    cdiv = staticmethod(lambda a, b: -(-a // b))
    minimum = staticmethod(min)
    maximum = staticmethod(max)

    @staticmethod
    def constexpr(x):
        return x


_ENV = {"range": range, "min": min, "max": max, "int": int, "float": float, "abs": abs, "len": len,
        "tl": _TL, "triton": _TL, "math": math}


@functools.lru_cache(maxsize=64)
def _parse(file: str, mtime: float):
    tree = ast.parse(Path(file).read_text())
    funcs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    loops = []
    for f in funcs:
        for node in ast.walk(f):
            if isinstance(node, (ast.For, ast.While)):
                loops.append(SourceLoop(file, node.lineno, node.end_lineno, "for" if isinstance(node, ast.For)
                                        else "while", node, f))
    return funcs, loops


def _source(file: str):
    p = Path(file)
    return _parse(file, p.stat().st_mtime) if p.exists() else ([], [])


def _func_at(file: str, line: int) -> ast.FunctionDef | None:
    funcs = [f for f in _source(file)[0] if f.lineno <= line <= f.end_lineno]
    return max(funcs, key=lambda f: f.lineno, default=None)  # innermost


def match(chain: tuple) -> tuple[SourceLoop, int] | None:
    """The innermost source loop containing a line of ``chain`` (innermost inlining level first) and that level."""
    for depth, (file, line) in enumerate(chain):
        found = [lp for lp in _source(file)[1] if lp.lineno <= line <= lp.end and lp.func is _func_at(file, line)]
        if found:
            return max(found, key=lambda lp: lp.lineno), depth
    return None


def _eval(expr: ast.AST, ns: dict):
    return eval(compile(ast.Expression(expr), "<bound>", "eval"), dict(_ENV), dict(ns))  # noqa: S307 (own AST)


def _straight_line(func: ast.FunctionDef, ns: dict, before: int) -> dict:
    """ns plus the top-level single-name assignments of func above line ``before`` that evaluate."""
    ns = dict(ns)
    for stmt in func.body:
        if stmt.lineno >= before:
            break
        targets = stmt.targets if isinstance(stmt, ast.Assign) else []
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        if isinstance(stmt, (ast.AugAssign, ast.AnnAssign)) and isinstance(stmt.target, ast.Name):
            ns.pop(stmt.target.id, None)
        if len(names) != 1:
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        ns.pop(n.id, None)
            continue
        try:
            ns[names[0]] = _eval(stmt.value, ns)
        except Exception:  # not a plain number (a tensor expression): unknown from here on
            ns.pop(names[0], None)
    return ns


def namespace(chain: tuple, kernel_ns: dict) -> dict:
    """Values known at chain[0]'s line: the kernel's arguments, bound through every inlined call site."""
    file, line = chain[0]
    func = _func_at(file, line)
    if func is None:
        return {}
    if len(chain) == 1:
        return _straight_line(func, kernel_ns, line)
    caller_ns = namespace(chain[1:], kernel_ns)
    cfile, cline = chain[1]
    caller = _func_at(cfile, cline)
    calls = [c for c in ast.walk(caller) if isinstance(c, ast.Call) and c.lineno <= cline <= c.end_lineno
             and getattr(c.func, "id", getattr(c.func, "attr", None)) == func.name] if caller else []
    ns = {}
    if calls:
        params = [a.arg for a in func.args.args]
        bound = list(zip(params, calls[0].args)) + [(k.arg, k.value) for k in calls[0].keywords if k.arg]
        for name, expr in bound:
            try:
                ns[name] = _eval(expr, caller_ns)
            except Exception:
                pass
    return _straight_line(func, ns, line)


def trip_count(loop: SourceLoop, chain: tuple, depth: int, kernel_ns: dict, passes: float) -> tuple[float, str]:
    """(trips per execution of the enclosing code, how it was found)."""
    if loop.kind == "while":  # minus the passes made before it, where the function says (PASSES_BEFORE)
        try:
            before = int(namespace(chain[depth:], kernel_ns).get("PASSES_BEFORE", 0))
        except Exception:  # noqa: BLE001 -- an unresolvable argument: no passes before
            before = 0
        how = "while: data-dependent, the assumed pass count" + (f" minus {before} made before it" if before else "")
        return float(max(passes - before, 0)), how
    it = loop.node.iter
    if not (isinstance(it, ast.Call) and getattr(it.func, "id", getattr(it.func, "attr", "")) in ("range",)):
        return 1.0, f"unresolved: not a range loop ({ast.unparse(it)})"
    ns = namespace(chain[depth:], kernel_ns)
    try:
        args = [_eval(a, ns) for a in it.args]
    except Exception as e:
        return 1.0, f"unresolved: {ast.unparse(it)} ({type(e).__name__}: {e})"
    start, stop, step = (0, args[0], 1) if len(args) == 1 else (args[0], args[1], args[2] if len(args) > 2 else 1)
    return float(max(0, -(-(stop - start) // step))), f"{ast.unparse(it)} = {max(0, -(-(stop - start) // step))}"
