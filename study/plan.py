"""The study's plan: cells, their commands, and which of them are finished.

A cell is one subprocess of the project's own command lines: ``pretrain.<variant>.seed<s>`` runs
``python -m lightning_modules.pretrain``; ``<task>.<variant>.seed<s>`` runs ``python -m probes.run`` or
``python -m analysis.run`` on that pretraining's ``last.ckpt``; ``<task>.<name>`` runs them on a given checkpoint
file (``--checkpoint NAME=FILE[:TIMM_NAME]``: DINOv2, timm, DeiT, MAE, official DINO, another tokenmix run), once,
with no pretraining cell. Every cell has a *key*: a hash of everything that
decides its result (variant, seed, preset file, data, extra flags, probe config file). ``plan`` resolves each
cell once (``study.cells.Cell``: key, command, runs folder, checkpoint, marker); the runners read only those.

    >>> spec = Spec.create(name="t", variants=["softmax"], seeds=[0], tasks=["knn"], preset="tiny")
    >>> [c.id for c in plan(spec)]
    ['pretrain.softmax.seed0', 'knn.softmax.seed0']
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from datamodules.demo import is_demo
from tokenmix import paths
from tokenmix.io import atomic_json_dump, sha256_file

from .cells import PRETRAIN, Cell
from .points import FINAL, checkpoint_name, keep_args, max_epochs, resolve_at
from .columns import headless_tasks, probe_flags


def probe_tasks() -> tuple[str, ...]:
    """The probe CLI's tasks and the head-free kinds on its segmentation tasks (``study.columns``: voc_retrieval)."""
    from probes.core.task_table import TASKS
    return tuple(TASKS) + tuple(headless_tasks())


def analysis_tasks() -> tuple[str, ...]:
    from analysis.registry import TASKS
    return tuple(TASKS)


def task_source(task: str) -> str:
    """'probe' or 'analysis' (the CLI that runs ``task``); a clear error listing both CLIs' tasks otherwise."""
    if task in probe_tasks():
        return "probe"
    if task in analysis_tasks():
        return "analysis"
    raise ValueError(f"unknown task '{task}'. Probe tasks: {', '.join(probe_tasks())}; analysis tasks: "
                     f"{', '.join(analysis_tasks())}")


def _key(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:12]


def preset_file(preset: str) -> Path:
    """configs/pretrain/<preset>.yaml, or a YAML path (as `--preset` of the pretraining CLI accepts)."""
    named = paths.REPO / "configs" / "pretrain" / f"{preset}.yaml"
    if named.is_file():
        return named
    if Path(preset).is_file():
        return Path(preset).resolve()
    known = sorted(p.stem for p in (paths.REPO / "configs" / "pretrain").glob("*.yaml"))
    raise ValueError(f"unknown preset '{preset}': neither configs/pretrain/{preset}.yaml nor a YAML file; "
                     f"presets: {', '.join(known)}")


@dataclass(frozen=True)
class Spec:
    """What the study compares. ``create`` validates every name within seconds, before anything runs."""
    name: str
    variants: tuple[str, ...]
    seeds: tuple[int, ...]
    tasks: tuple[str, ...]
    preset: str
    data: str = "demo"
    data_root: str = ""
    probe_config: str = ""
    pretrain_args: tuple[str, ...] = ()
    probe_args: tuple[str, ...] = ()
    analysis_args: tuple[str, ...] = ()
    root: Path = field(default=Path("."))
    task_data: tuple[tuple[str, str, str], ...] = ()  # (task, data, data root) overriding data/data_root
    points: tuple[str, ...] = (FINAL,)  # training points evaluated (study.points; FINAL = last.ckpt)
    max_epochs: int = 0                 # the schedule the points refer to (0: not needed, no AT)
    checkpoints: tuple[tuple[str, str, str, str], ...] = ()  # (name, file, timm name or '', sha256): fixed rows

    @classmethod
    def create(cls, *, name: str, variants, seeds, tasks, preset: str, data: str = "demo", data_root: str = "",
               probe_config: Optional[str] = None, pretrain_args=(), probe_args=(), analysis_args=(),
               root: Optional[Path] = None, task_data=(), at: str = "", checkpoints=()) -> "Spec":
        from backbones.variants import parse_variant  # the variant names' one home
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+", name or ""):
            raise ValueError(f"study name {name!r}: letters, digits and _ . + - only (it names a folder)")
        canon = []
        for v in variants:
            c = parse_variant(v).name  # ValueError listing every valid variant
            if c not in canon:
                canon.append(c)
        if not tasks or not (canon or checkpoints) or (canon and not seeds):
            raise ValueError("a study needs at least one task, and one variant with one seed or one --checkpoint")
        for t in list(tasks) + [td[0] for td in task_data]:
            task_source(t)
        pfile = preset_file(preset)
        epochs = max_epochs(pfile, pretrain_args) if str(at or "").strip() else 0
        points = resolve_at(at, epochs) if epochs else (FINAL,)
        if probe_config is None:  # the probe protocol matching the data
            probe_config = "configs/probe/demo.yaml" if is_demo(data) else "configs/probe/paper.yaml"
        if probe_config and not (paths.REPO / probe_config).is_file() and not Path(probe_config).is_file():
            raise ValueError(f"probe config {probe_config}: no such file (see configs/probe/)")
        root = Path(root) if root else paths.RUNS / "study" / name
        fixed = read_checkpoints(checkpoints, canon)  # last: the other flags' errors come first, within seconds
        return cls(name, tuple(canon), tuple(int(s) for s in seeds), tuple(dict.fromkeys(tasks)), preset, data,
                   data_root, probe_config, tuple(pretrain_args), tuple(probe_args), tuple(analysis_args),
                   root.resolve(), tuple(tuple(td) for td in task_data), points, epochs, fixed)

    def seed_root(self, seed: int) -> Path:
        """The runs/ folder of one seed: <root>/seed<s>/<variant>/{pretrain,probe,analysis}/..."""
        return self.root / f"seed{seed}"

    def eval_data(self, task: str) -> tuple[str, str]:
        """(data, data root) a task is evaluated on: its --task-data entry, else the study's own."""
        return next(((d, r) for t, d, r in self.task_data if t == task), (self.data, self.data_root))

    def probe_config_path(self) -> Optional[Path]:
        if not self.probe_config:
            return None
        p = paths.REPO / self.probe_config
        return p if p.is_file() else Path(self.probe_config).resolve()


def read_checkpoints(checkpoints, variants) -> tuple[tuple[str, str, str, str], ...]:
    """(name, file, timm name) -> (name, absolute file, timm name, sha256), each file read and built once here in
    the launching process: a missing file, an unknown layout or weights that do not fit the named timm model fail
    before any cell runs, with ``backbones.read_checkpoint``'s message."""
    from backbones import read_checkpoint
    from tokenmix.io import CheckpointError
    out, seen = [], set(variants)
    for name, file, arch in checkpoints:
        if not re.fullmatch(r"[A-Za-z0-9_+-]+", name or ""):
            raise ValueError(f"--checkpoint {name}={file}: the name (the report's row, a folder) takes letters, "
                             "digits and _ + - only")
        if name in seen:
            raise ValueError(f"--checkpoint {name}: the name is already a variant or another checkpoint's row")
        seen.add(name)
        path = Path(file).expanduser()
        if not path.is_file():
            raise ValueError(f"--checkpoint {name}: no file {path} (expected NAME=FILE[:TIMM_NAME]: a DINOv2 hub "
                             ".pth, a timm model's .pth/.safetensors with its timm name, an official DINO .pth, a "
                             "tokenmix .ckpt; docs/backbones.md)")
        try:
            ck = read_checkpoint(path, arch=arch or None)
            ck.build()  # the weights fit the architecture (shapes, keys): not only found in the file
        except CheckpointError as e:
            raise ValueError(f"--checkpoint {name}: {e}") from None
        out.append((name, str(path.resolve()), arch or "", ck.sha256))
    return tuple(out)


def demo_identity(data: str, root: str) -> dict:
    """The demo data a cell reads when it is not the default folder (``TOKENMIX_DEMO_ROOT``, the lazy-aggregation
    knob ``TOKENMIX_DEMO_LAZY``, docs/demo-data.md): part of the keys, so a study re-run on other demo data never
    reuses cells of the first. Empty for the default data, so those keys (and finished cells) stay as they were."""
    if not is_demo(data) or root:
        return {}
    from datamodules.demo.cache import lazy_p_from_env
    folder = Path(os.environ.get("TOKENMIX_DEMO_ROOT") or paths.REPO / "data" / "demo").resolve()
    lazy = lazy_p_from_env()
    if folder == (paths.REPO / "data" / "demo").resolve() and lazy == 0:
        return {}
    return {"demo_root": str(folder), "demo_lazy": lazy}


def pretrain_key(spec: Spec, variant: str, seed: int) -> str:
    files = [preset_file(spec.preset)] + [paths.REPO / "configs" / "variants" / f"{p}.yaml"
                                          for p in variant.split("+")]
    body = {"variant": variant, "seed": seed, "preset": spec.preset, "data": spec.data,
            "data_root": spec.data_root, "args": list(spec.pretrain_args),
            "files": {f.name: sha256_file(f) for f in files if f.is_file()}, **demo_identity(spec.data, spec.data_root)}
    keep = keep_args(spec.points)
    if keep:  # only with kept points: a study without AT keeps its keys (and its finished cells)
        body["keep"] = keep
    return _key(body)


def eval_key(spec: Spec, task: str, seed: int, checkpoint: tuple = ()) -> str:
    """``checkpoint``: a fixed row's (name, file, timm name, sha256): its file's sha256 and timm name join the
    key, so a changed file is never taken for the one evaluated before."""
    cfg = spec.probe_config_path()
    source = task_source(task)
    data, root = spec.eval_data(task)
    body = {"task": task, "seed": seed, "data": data, "data_root": root,
            "args": list(spec.probe_args if source == "probe" else spec.analysis_args),
            "config": sha256_file(cfg) if source == "probe" and cfg else None, **demo_identity(data, root)}
    if checkpoint:  # only for those rows: the variants' keys (and finished cells) stay as they were
        body.update(checkpoint_sha256=checkpoint[3], arch=checkpoint[2])
    return _key(body)


def plan(spec: Spec) -> list[Cell]:
    """Every pretraining cell first, then each task on every checkpoint (the order they run in), resolved."""
    pre = [_pretrain_cell(spec, v, s) for v in spec.variants for s in spec.seeds]
    # task-major: a study stopped half-way already has whole columns (every variant and seed of the first tasks)
    return pre + [cell for t in spec.tasks for cell in [_eval_cell(spec, t, p, c) for p in spec.points for c in pre]
                  + [_checkpoint_cell(spec, t, ck) for ck in spec.checkpoints]]


def _run_folder(spec: Spec, variant: str, seed: int, key: str) -> Path:
    """The pretraining's checkpoints folder: the study fixes the logger version to ``study-<key>`` so the path is
    known before the run (job scripts name it) and a changed configuration never resumes an old run."""
    stem = preset_file(spec.preset).stem
    return spec.seed_root(seed) / variant / "pretrain" / stem / f"study-{key}" / "checkpoints"


def _data_args(data: str, root: str) -> list[str]:
    return ["--data", data] + (["--data-root", root] if root else [])


def _pretrain_cell(spec: Spec, variant: str, seed: int) -> Cell:
    cid, key, runs = f"{PRETRAIN}.{variant}.seed{seed}", pretrain_key(spec, variant, seed), spec.seed_root(seed)
    folder = _run_folder(spec, variant, seed, key)
    args = ["-m", "lightning_modules.pretrain", "--variant", variant, *_data_args(spec.data, spec.data_root),
            "--preset", spec.preset, "--runs-dir", str(runs), f"--seed_everything={seed}", f"--data.seed={seed}",
            f"--trainer.logger.version=study-{key}", *spec.pretrain_args, *keep_args(spec.points)]
    kept = tuple((p, folder / checkpoint_name(p)) for p in spec.points if p != FINAL)
    return Cell(cid, PRETRAIN, variant, seed, key=key, args=tuple(args), runs=runs,
                checkpoint=folder / checkpoint_name(FINAL), marker=_marker_path(spec, cid, key), kept=kept)


def _eval_cell(spec: Spec, task: str, point: str, pre: Cell) -> Cell:
    """``task`` on the checkpoint of ``point`` of the pretraining ``pre`` (documented flags of the CLIs only)."""
    cid = f"{task}.{pre.variant}.seed{pre.seed}" + (f"@{point}" if point else "")
    kind, key = task_source(task), eval_key(spec, task, pre.seed)
    ckpt = pre.checkpoint.parent / checkpoint_name(point)
    args = _eval_args(spec, task, ["--variant", pre.variant, "--ckpt", str(ckpt)], pre.runs, pre.seed)
    return Cell(cid, kind, pre.variant, pre.seed, task, key, pre.id, point, args, pre.runs, ckpt,
                _marker_path(spec, cid, key))


def _checkpoint_cell(spec: Spec, task: str, ck: tuple[str, str, str, str]) -> Cell:
    """``task`` on a fixed checkpoint file: one run (probe seed 0, ``make probe``'s default), no pretraining; its
    own runs folder <study>/checkpoints/<name>; the timm name goes to the CLI as ``--arch``."""
    name, file, arch, sha = ck
    cid, key, runs = f"{task}.{name}", eval_key(spec, task, 0, ck), spec.root / "checkpoints" / name
    args = _eval_args(spec, task, ["--ckpt", file, *(["--arch", arch] if arch else [])], runs, 0)
    return Cell(cid, task_source(task), name, 0, task, key, args=args, runs=runs, checkpoint=Path(file),
                marker=_marker_path(spec, cid, key), sha256=sha)


def _eval_args(spec: Spec, task: str, backbone: list[str], runs: Path, seed: int) -> tuple[str, ...]:
    """The command of an evaluation cell (documented flags of probes.run / analysis.run only)."""
    probe = task_source(task) == "probe"
    head = [*(probe_flags(task) if probe else ["--task", task]), *backbone, *_data_args(*spec.eval_data(task))]
    if probe:
        cfg = spec.probe_config_path()
        return ("-m", "probes.run", *head, "--runs-dir", str(runs), *(["--config", str(cfg)] if cfg else []),
                "--seed", str(seed), *spec.probe_args)
    return ("-m", "analysis.run", *head, *spec.analysis_args)


def _marker_path(spec: Spec, cell_id: str, key: str) -> Path:
    """One marker per cell and key: going back to an earlier configuration reuses its finished cells."""
    return spec.root / "done" / cell_id / f"{key}.json"


def write_plan(spec: Spec, cells: list[Cell], python: str) -> Path:
    """plan.json: the spec and every resolved cell with its command (read by `python -m study.record`)."""
    body = {"spec": {k: (str(v) if isinstance(v, Path) else v) for k, v in spec.__dict__.items()},
            "cells": [{**c.to_json(), "command": c.command(python)} for c in cells],
            "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "pid": os.getpid()}
    path = spec.root / "plan.json"
    atomic_json_dump(body, path)
    return path
