"""The layout rules, read statically from the sources with ``ast`` (nothing is imported):

- no import cycle between product modules (module-level and function-level imports, relative ones resolved);
- layers, lowest first: tokenmix < backbones < datamodules < probes < {lightning_modules, analysis} < study; a
  package imports only lower layers (lightning_modules and analysis are siblings: neither imports the other);
  the tools (bench, gpu_check, kernel_model, official) may import product code, product code never imports them;
- product files <= 400 lines, product functions <= 60 lines (``def`` line to last line, decorators excluded);
- docs/layout.md names every product, tool and test-helper file in a table's file column, and no file that does
  not exist (an ``__init__.py`` that only gathers its package's names needs no row).

Each test lists every violation of its rule at once.
"""
from __future__ import annotations

import ast
import re
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LAYERS = {"tokenmix": 1, "backbones": 2, "datamodules": 3, "probes": 4, "lightning_modules": 5, "analysis": 5,
          "study": 6}
PRODUCT = tuple(LAYERS)
TOOLS = ("bench", "gpu_check", "kernel_model", "official")
DOCUMENTED = PRODUCT + TOOLS + ("tests/helpers",)  # the folders whose every file has a row in docs/layout.md
MAX_FILE_LINES, MAX_FUNCTION_LINES = 400, 60

pytestmark = pytest.mark.timeout(120)


@dataclass(frozen=True)
class Import:
    source: str   # importing module
    target: str   # imported module (the most specific one that exists) or, outside the scanned tree, the name
    line: int


def module_files(root: Path, packages) -> dict[str, Path]:
    """dotted module name -> file, for every .py under the packages (a package is its __init__)."""
    out = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, known) -> list[Import]:
    """Every import statement of the file, at any depth (functions included). ``from a import b`` is an import of
    module ``a.b`` when that module exists, else of ``a``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, path.name == "__init__.py", node)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t not in known and "." in t:  # `import a.b.c` of a name inside a module: the module
                t = t.rsplit(".", 1)[0]
            out.append(Import(module, t, node.lineno))
    return out


def import_graph(root: Path, packages) -> dict[str, list[Import]]:
    files = module_files(root, packages)
    return {m: imports_of(m, p, files) for m, p in files.items()}


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One shortest cycle (a -> ... -> a) per strongly connected component that has one (Tarjan, iterative)."""
    index, low, on, stack, comps, counter = {}, {}, set(), [], [], [0]
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in edges.get(v, ()):
                    comps.append(comp)
    return [_shortest_cycle(min(c), edges, c) for c in comps]


def _shortest_cycle(start: str, edges: dict[str, set[str]], comp: set[str]) -> list[str]:
    prev, todo = {}, deque([start])
    while todo:
        v = todo.popleft()
        for w in sorted(edges.get(v, ())):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return [start] + path[::-1][1:] + [start] if len(path) > 1 else [start, start]
            if w in comp and w not in prev:
                prev[w] = v
                todo.append(w)
    raise AssertionError(f"no cycle through {start}")


@lru_cache(maxsize=1)
def _graph() -> dict[str, list[Import]]:
    return import_graph(REPO, PRODUCT + TOOLS)


def _product(module: str) -> bool:
    return module.split(".")[0] in PRODUCT


def _line(a: str, b: str) -> int:
    """The first line of module ``a`` that imports module ``b``."""
    return min(i.line for i in _graph()[a] if i.target == b)


# --------------------------------------------------------------------------- the self-check


def test_cycle_finder_and_import_reader_catch_a_synthetic_cycle(tmp_path):
    """A three-module circle through a relative import, a function-level import and ``from . import``, plus a
    self-import; a module that only imports a name of another is no cycle."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub.b import f\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import g\n    return g\n")
    (pkg / "c.py").write_text("from . import a\nimport pkg.d\n")
    (pkg / "d.py").write_text("import pkg.d\n")
    (pkg / "e.py").write_text("from pkg.a import f\n")
    graph = import_graph(tmp_path, ["pkg"])
    assert sorted(i.target for i in graph["pkg.c"]) == ["pkg.a", "pkg.d"]
    assert [(i.target, i.line) for i in graph["pkg.sub.b"]] == [("pkg.c", 2)]
    cycles = find_cycles({m: {i.target for i in imps} for m, imps in graph.items()})
    assert sorted(cycles) == [["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"], ["pkg.d", "pkg.d"]]
    assert find_cycles({"x": {"y"}, "y": {"z"}, "z": set()}) == []


# --------------------------------------------------------------------------- the rules


def test_no_import_cycles_between_product_modules():
    g = _graph()
    edges = {m: {i.target for i in imps if _product(i.target) and i.target in g} for m, imps in g.items()
             if _product(m)}
    cycles = find_cycles(edges)
    lines = [" -> ".join(f"{a}:{_line(a, b)}" for a, b in zip(c, c[1:])) + f" -> {c[-1]}" for c in cycles]
    assert not cycles, f"{len(cycles)} import cycle(s):\n" + "\n".join(lines)


def test_lower_layers_never_import_upper_ones_nor_the_tools():
    bad = []
    for m, imps in _graph().items():
        if not _product(m):
            continue
        mine = m.split(".")[0]
        for i in imps:
            theirs = i.target.split(".")[0]
            if theirs in TOOLS:
                bad.append(f"{m}:{i.line} imports the tool {i.target}")
            elif theirs in LAYERS and theirs != mine and LAYERS[theirs] >= LAYERS[mine]:
                bad.append(f"{m}:{i.line} ({mine}, layer {LAYERS[mine]}) imports {i.target} (layer {LAYERS[theirs]})")
    assert not bad, f"{len(bad)} layer violation(s):\n" + "\n".join(bad)


def test_product_files_are_at_most_400_lines():
    files = module_files(REPO, PRODUCT)
    long = [f"{p.relative_to(REPO)}: {n} lines" for p in files.values()
            if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES]
    assert not long, f"{len(long)} product file(s) over {MAX_FILE_LINES} lines:\n" + "\n".join(long)


def test_product_functions_are_at_most_60_lines():
    long = []
    for path in module_files(REPO, PRODUCT).values():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1  # the def line on: decorators excluded
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {n} lines")
    assert not long, f"{len(long)} product function(s) over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


# --------------------------------------------------------------------------- docs/layout.md


def layout_doc_files(text: str) -> set[str]:
    """The files a layout doc names in its tables' last column, in the three forms it uses: a path
    (`backbones/vit.py`), a bare name after a path in the same cell (`backbones/triton_attention.py`,
    `triton_kernels.py`: the path's folder), a bare name after a folder (`datamodules/datasets/`: `voc.py`).
    A folder alone names none of its files."""
    named = set()
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        cell = re.split(r"(?<!\\)\|", line.strip().strip("|"))[-1]
        folder = None
        for token in re.findall(r"`([^`]+)`", cell):
            if token.endswith("/"):
                folder = token
            elif "/" in token:
                folder = token.rsplit("/", 1)[0] + "/"
                if re.fullmatch(r"[\w./-]+\.py", token):
                    named.add(token)
            elif folder and re.fullmatch(r"[\w.-]+\.py", token):
                named.add(folder + token)
    return named


def gathers_names_only(path: Path) -> bool:
    """An ``__init__.py`` that only imports, lists ``__all__`` and re-exports lazily (``__getattr__``, ``__dir__``):
    its package's rows cover it. One that defines anything else is a module of its own and needs a row."""
    if path.name != "__init__.py":
        return False
    defs = [n for n in ast.parse(path.read_text()).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    return all(n.name in ("__getattr__", "__dir__") for n in defs)


def undocumented(root: Path, folders, text: str) -> tuple[list[str], list[str]]:
    """(files under ``folders`` the doc does not name, files the doc names that do not exist)."""
    files = {p.relative_to(root).as_posix() for f in folders for p in (root / f).rglob("*.py")
             if "__pycache__" not in p.parts and not gathers_names_only(p)}
    named = layout_doc_files(text)
    missing = sorted(files - named)
    stale = sorted(n for n in named if not (root / n).is_file())
    return missing, stale


def test_layout_doc_reader_on_a_synthetic_tree(tmp_path):
    """The three forms name their files; a folder row, a name in the first column, a re-exporting __init__ and a
    glob name none; an __init__ with a function of its own, a file outside every row and a stale row are found."""
    for f, body in {"pkg/a.py": "", "pkg/b.py": "", "pkg/sub/c.py": "", "pkg/sub/d.py": "", "pkg/e.py": "",
                    "pkg/__init__.py": "from .a import x\n__all__ = ['x']\ndef __getattr__(n):\n    return n\n",
                    "pkg/sub/__init__.py": "def helper():\n    return 1\n", "pkg/f.py": ""}.items():
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text(body)
    doc = ("| you look for | file |\n|---|---|\n"
           "| two (`x\\|y`) | `pkg/a.py`, `b.py` (the same folder) |\n"
           "| a folder's files | `pkg/sub/`: `c.py`, `d.py` |\n"
           "| the folder alone; `pkg/e.py` in the first column | `pkg/sub/`, `configs/*.py` |\n"
           "| gone | `pkg/gone.py` |\n"
           "text `pkg/f.py` outside a table\n")
    assert layout_doc_files(doc) == {"pkg/a.py", "pkg/b.py", "pkg/sub/c.py", "pkg/sub/d.py", "pkg/gone.py"}
    missing, stale = undocumented(tmp_path, ["pkg"], doc)
    assert missing == ["pkg/e.py", "pkg/f.py", "pkg/sub/__init__.py"] and stale == ["pkg/gone.py"]


def test_layout_doc_names_every_file():
    missing, stale = undocumented(REPO, DOCUMENTED, (REPO / "docs" / "layout.md").read_text())
    assert not missing and not stale, (
        f"docs/layout.md: {len(missing)} file(s) without a row (add one: `folder/file.py` in a table's file "
        f"column):\n" + "\n".join(missing) + f"\n{len(stale)} row(s) naming a file that does not exist:\n"
        + "\n".join(stale))
