"""`make probe` reads its flags once: one typed config (probes/run.py), each kind its own options, no argparse
Namespace below the CLI files, and a console with Lightning's device banner once per run."""
import argparse
import ast
import inspect
import logging
import sys
import warnings
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[1]
CLI_FILES = {"probes/run.py", "probes/core/flags.py", "analysis/run.py", "study/__main__.py"}


def _write_imagefolder(root: Path) -> Path:
    """train/ and val/ class folders (DATA=imagefolder), two classes of 24 x 24 images, red or blue."""
    rng = np.random.default_rng(0)
    for split, n in (("train", 3), ("val", 2)):
        for c, colour in enumerate(((200, 40, 40), (40, 40, 200))):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(n):
                img = rng.integers(0, 60, (24, 24, 3), dtype=np.uint8) + np.array(colour, np.uint8) // 2
                Image.fromarray(img).save(folder / f"{i}.png")
    return root


class _Counter:
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *a, **k):
        self.calls += 1
        return self.fn(*a, **k)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """One in-process k-NN run over two blocks (--layer 0,1: a Trainer per block) on a checkpoint file, watched:
    calls of the lookups, Lightning's console lines, warnings, and every call into the product packages."""
    from test_analysis_run import write_ckpt

    import backbones.load
    import probes.core.flags
    import probes.core.task_table
    import probes.run
    from probes.core.task_table import Kind
    tmp = tmp_path_factory.mktemp("probe_config")
    data, ckpt = _write_imagefolder(tmp / "data"), write_ckpt(tmp / "tiny.ckpt", "softmax")
    with pytest.MonkeyPatch.context() as mp:
        flags = probes.core.flags
        counts = {name: _Counter(getattr(flags, name)) for name in ("get_task", "resolve_kind", "make_config")}
        for name, c in counts.items():
            mp.setattr(flags, name, c)
        mp.setattr(probes.core.task_table, "get_task", counts["get_task"])
        counts["checkpoint_path"] = _Counter(backbones.load.checkpoint_path)  # resolve_backbone's own call too
        mp.setattr(flags, "checkpoint_path", counts["checkpoint_path"])
        mp.setattr(backbones.load, "checkpoint_path", counts["checkpoint_path"])
        counts["knn_options"] = _Counter(flags.OPTIONS[Kind.KNN])
        mp.setitem(flags.OPTIONS, Kind.KNN, counts["knn_options"])
        lines: list[str] = []
        handler = logging.Handler()
        handler.emit = lambda record: lines.append(record.getMessage())
        logging.getLogger("lightning.pytorch").addHandler(handler)
        namespaces: list[str] = []

        def watch(frame, event, arg):  # an argparse Namespace arriving in a product function below the CLI file
            if event != "call":
                return
            path = frame.f_code.co_filename
            rel = path[len(str(REPO)) + 1:] if path.startswith(str(REPO)) else ""
            if rel.split("/")[0] in ("probes", "analysis", "study", "tokenmix") and rel not in CLI_FILES \
                    and rel != "tokenmix/cli.py":
                code = frame.f_code
                for name in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]:
                    if isinstance(frame.f_locals.get(name), argparse.Namespace):
                        namespaces.append(f"{rel}:{code.co_name}({name})")

        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("default")  # Python's own: each warning once per place it is raised
                sys.setprofile(watch)
                path = probes.run.main(["--runs-dir", str(tmp / "runs"), "--task", "knn", "--ckpt", str(ckpt),
                                        "--data", "imagefolder", "--data-root", str(data), "--img-size", "16",
                                        "--layer", "0,1", "--knn-k", "1,3", "--accelerator", "cpu"])
        finally:
            sys.setprofile(None)
            logging.getLogger("lightning.pytorch").removeHandler(handler)
    return {"path": path, "counts": {k: c.calls for k, c in counts.items()}, "lines": lines,
            "warnings": [str(w.message) for w in caught], "namespaces": namespaces}


def test_config_built_once(sweep):
    """The task, the kind and the checkpoint file are looked up once, the config and the kind's options built
    once, for a run of two probes on a checkpoint file (resolve_backbone reuses the file found before the data)."""
    import json
    assert sweep["counts"] == {"get_task": 1, "resolve_kind": 1, "make_config": 1, "checkpoint_path": 1,
                               "knn_options": 1}
    res = json.loads(Path(sweep["path"]).read_text())
    assert set(res["metrics"]["layers"]) == {"block_0", "block_1"}
    assert res["config"]["knn_k"] == "1,3" and res["config"]["variant"] == "softmax"


def test_no_namespace_below_the_cli_files(sweep):
    """At run time no product function below probes/run.py receives a Namespace; statically, no module below
    the CLI files imports argparse, and every kind's callables take typed options."""
    assert sweep["namespaces"] == []
    from probes.core.kinds import KINDS, KindOptions, train_head
    from probes.core.trainer import make_trainer
    from probes.dense.ridge import run_ridge_kind
    from probes.linear.knn import embed_splits, run_knn
    for kind in KINDS.values():
        for fn in (kind.features, kind.build, kind.runner):
            if fn is None:
                continue
            fn = fn.func if isinstance(fn, partial) else fn
            params = inspect.signature(fn).parameters
            assert "args" not in params and "Namespace" not in str(params), (kind.kind, fn.__name__, params)
        assert kind.options in KindOptions.__args__
    for fn in (embed_splits, run_knn, run_ridge_kind, train_head, make_trainer):
        assert "args" not in inspect.signature(fn).parameters and "Namespace" not in str(inspect.signature(fn))
    for pkg in ("probes", "analysis", "study"):
        for path in (REPO / pkg).rglob("*.py"):
            rel = str(path.relative_to(REPO))
            src = path.read_text()
            if rel in CLI_FILES or '__name__ == "__main__"' in src:  # a command line's own file
                continue
            imported = {a.name for n in ast.walk(ast.parse(src)) if isinstance(n, (ast.Import, ast.ImportFrom))
                        for a in n.names} | {n.module for n in ast.walk(ast.parse(src))
                                             if isinstance(n, ast.ImportFrom)}
            assert "argparse" not in imported, rel


def test_one_banner_per_run_no_advertisement_no_repeated_warning(sweep):
    """Two blocks build two Trainers: Lightning's device banner appears once, its litlogger tip never, and no
    warning twice (a catch_warnings per Trainer would reset Python's once-per-place memory)."""
    lines = sweep["lines"]
    assert sum(line.startswith("GPU available:") for line in lines) == 1, lines
    assert sum(line.startswith("TPU available:") for line in lines) == 1, lines
    assert not [line for line in lines if "litlogger" in line or "Tip:" in line], lines
    repeated = {w for w in sweep["warnings"] if sweep["warnings"].count(w) > 1}
    assert not repeated, repeated
    assert not [w for w in sweep["warnings"] if "predict returned None" in w]
