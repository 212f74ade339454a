"""The study's plan: cells, their commands, and which of them are finished.

A cell is one subprocess of the project's own command lines: ``pretrain.<variant>.seed<s>`` runs
``python -m lightning_modules.pretrain``; ``<task>.<variant>.seed<s>`` runs ``python -m probes.run`` or
``python -m analysis.run`` on that pretraining's ``last.ckpt``. Every cell has a *key*: a hash of everything that
decides its result (variant, seed, preset file, data, extra flags, probe config file). A finished cell leaves a
marker ``runs/study/<name>/done/<cell>/<key>.json`` (written atomically) holding its key and the sha256 of the
checkpoint it made or used. A cell counts as done only when a marker for today's key exists and the checkpoint /
results.json it names still exist with that sha256; anything else is run (again).

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

from tokenmix import paths
from tokenmix.io import atomic_json_dump, sha256_file

from .points import FINAL, checkpoint_name, keep_args, max_epochs, resolve_at
from .results import read_result

PRETRAIN = "pretrain"


def probe_tasks() -> tuple[str, ...]:
    from probes.tasks import TASKS
    return tuple(TASKS)


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

    @classmethod
    def create(cls, *, name: str, variants, seeds, tasks, preset: str, data: str = "demo", data_root: str = "",
               probe_config: Optional[str] = None, pretrain_args=(), probe_args=(), analysis_args=(),
               root: Optional[Path] = None, task_data=(), at: str = "") -> "Spec":
        from backbones.variants import parse_variant  # the variant names' one home
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+", name or ""):
            raise ValueError(f"study name {name!r}: letters, digits and _ . + - only (it names a folder)")
        canon = []
        for v in variants:
            c = parse_variant(v).name  # ValueError listing every valid variant
            if c not in canon:
                canon.append(c)
        if not canon or not seeds or not tasks:
            raise ValueError("a study needs at least one variant, one seed and one task")
        for t in list(tasks) + [td[0] for td in task_data]:
            task_source(t)
        pfile = preset_file(preset)
        epochs = max_epochs(pfile, pretrain_args) if str(at or "").strip() else 0
        points = resolve_at(at, epochs) if epochs else (FINAL,)
        if probe_config is None:  # the probe protocol matching the data
            probe_config = "configs/probe/demo.yaml" if data == "demo" else "configs/probe/paper.yaml"
        if probe_config and not (paths.REPO / probe_config).is_file() and not Path(probe_config).is_file():
            raise ValueError(f"probe config {probe_config}: no such file (see configs/probe/)")
        root = Path(root) if root else paths.RUNS / "study" / name
        return cls(name, tuple(canon), tuple(int(s) for s in seeds), tuple(dict.fromkeys(tasks)), preset, data,
                   data_root, probe_config, tuple(pretrain_args), tuple(probe_args), tuple(analysis_args),
                   root.resolve(), tuple(tuple(td) for td in task_data), points, epochs)

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


@dataclass(frozen=True)
class Cell:
    id: str
    kind: str  # pretrain | probe | analysis
    variant: str
    seed: int
    task: str = ""
    key: str = ""
    depends: str = ""  # id of the pretraining cell an evaluation reads
    point: str = ""    # the training point an evaluation reads (study.points; "" = the end, last.ckpt)

    @property
    def stage(self) -> str:
        return "pretraining" if self.kind == PRETRAIN else "evaluations"


def pretrain_key(spec: Spec, variant: str, seed: int) -> str:
    files = [preset_file(spec.preset)] + [paths.REPO / "configs" / "variants" / f"{p}.yaml"
                                          for p in variant.split("+")]
    body = {"variant": variant, "seed": seed, "preset": spec.preset, "data": spec.data,
            "data_root": spec.data_root, "args": list(spec.pretrain_args),
            "files": {f.name: sha256_file(f) for f in files if f.is_file()}}
    keep = keep_args(spec.points)
    if keep:  # only with kept points: a study without AT keeps its keys (and its finished cells)
        body["keep"] = keep
    return _key(body)


def eval_key(spec: Spec, task: str, seed: int) -> str:
    cfg = spec.probe_config_path()
    source = task_source(task)
    data, root = spec.eval_data(task)
    return _key({"task": task, "seed": seed, "data": data, "data_root": root,
                 "args": list(spec.probe_args if source == "probe" else spec.analysis_args),
                 "config": sha256_file(cfg) if source == "probe" and cfg else None})


def plan(spec: Spec) -> list[Cell]:
    """Every pretraining cell first, then each task on every checkpoint (the order they run in)."""
    pre = [Cell(f"{PRETRAIN}.{v}.seed{s}", PRETRAIN, v, s, key=pretrain_key(spec, v, s))
           for v in spec.variants for s in spec.seeds]
    # task-major: a study stopped half-way already has whole columns (every variant and seed of the first tasks)
    evals = [Cell(f"{t}.{c.variant}.seed{c.seed}" + (f"@{p}" if p else ""), task_source(t), c.variant, c.seed, t,
                  eval_key(spec, t, c.seed), c.id, p) for t in spec.tasks for p in spec.points for c in pre]
    return pre + evals


def checkpoint_path(spec: Spec, cell: Cell) -> Path:
    """The pretraining's last.ckpt: the study fixes the logger version to ``study-<key>`` so the path is known
    before the run (job scripts name it) and a changed configuration never resumes an old run."""
    pre = cell if cell.kind == PRETRAIN else Cell(cell.depends, PRETRAIN, cell.variant, cell.seed,
                                                  key=pretrain_key(spec, cell.variant, cell.seed))
    stem = preset_file(spec.preset).stem
    folder = spec.seed_root(pre.seed) / pre.variant / "pretrain" / stem / f"study-{pre.key}" / "checkpoints"
    return folder / checkpoint_name(cell.point)


def command(spec: Spec, cell: Cell, python: str, resume: bool = False) -> list[str]:
    """The cell's command line (documented flags of the project's CLIs only). Run with ``env(spec, cell)``."""
    root = str(spec.seed_root(cell.seed))
    d, r = (spec.data, spec.data_root) if cell.kind == PRETRAIN else spec.eval_data(cell.task)
    data = ["--data", d] + (["--data-root", r] if r else [])
    if cell.kind == PRETRAIN:
        ckpt = checkpoint_path(spec, cell)
        cmd = [python, "-m", "lightning_modules.pretrain", "--variant", cell.variant, *data, "--preset", spec.preset,
               "--runs-dir", root, f"--seed_everything={cell.seed}", f"--data.seed={cell.seed}",
               f"--trainer.logger.version=study-{cell.key}", *spec.pretrain_args, *keep_args(spec.points)]
        return cmd + (["--resume", str(ckpt)] if resume else [])
    ckpt = str(checkpoint_path(spec, cell))
    if cell.kind == "probe":
        cfg = spec.probe_config_path()
        return [python, "-m", "probes.run", "--task", cell.task, "--variant", cell.variant, "--ckpt", ckpt, *data,
                "--runs-dir", root, *(["--config", str(cfg)] if cfg else []), "--seed", str(cell.seed),
                *spec.probe_args]
    return [python, "-m", "analysis.run", "--task", cell.task, "--variant", cell.variant, "--ckpt", ckpt, *data,
            *spec.analysis_args]


def env(spec: Spec, cell: Cell) -> dict[str, str]:
    """TOKENMIX_RUNS points every CLI (analysis.run has no --runs-dir flag) at the seed's runs folder."""
    return {"TOKENMIX_RUNS": str(spec.seed_root(cell.seed))}


# --------------------------------------------------------------------------- finished cells

def marker_path(spec: Spec, cell: Cell) -> Path:
    """One marker per cell and key: going back to an earlier configuration reuses its finished cells."""
    return spec.root / "done" / cell.id / f"{cell.key}.json"


def _read_json(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _checkpoint_sha(path: Path, marker: dict) -> Optional[str]:
    """sha256 of a checkpoint, trusting the marker's value while size and mtime are unchanged (hashing a ViT-S
    checkpoint per cell and per invocation would cost seconds each)."""
    if not path.is_file():
        return None
    st = path.stat()
    if marker.get("size") == st.st_size and marker.get("mtime_ns") == st.st_mtime_ns and marker.get("ckpt_sha256"):
        return marker["ckpt_sha256"]
    return sha256_file(path)


def done_record(spec: Spec, cell: Cell, pre_record: Optional[dict] = None) -> Optional[dict]:
    """The cell's marker if the cell is finished for today's key (and, for an evaluation, for today's checkpoint
    ``pre_record`` of its pretraining); None otherwise."""
    m = _read_json(marker_path(spec, cell))
    if not m or m.get("key") != cell.key:
        return None
    if cell.kind == PRETRAIN:
        kept = [(m.get("points") or {}).get(p) or {} for p in spec.points if p != FINAL]
        ok = all(_checkpoint_sha(Path(r.get("checkpoint", "")), r) == r.get("ckpt_sha256") for r in [m, *kept])
        return m if ok else None
    if not pre_record or m.get("ckpt_sha256") != point_record(pre_record, cell.point).get("ckpt_sha256"):
        return None
    res = read_result(Path(m.get("results", "")))
    return m if res and res.checkpoint_sha256 == m["ckpt_sha256"] and res.task == cell.task else None


def point_record(pre_record: dict, point: str) -> dict:
    """The checkpoint entry (path, sha256, size, mtime, global step) of one point of a pretraining marker."""
    return pre_record if point == FINAL else (pre_record.get("points") or {}).get(point) or {}


def _checkpoint_entry(path: Path) -> dict:
    st = path.stat()
    return {"checkpoint": str(path), "ckpt_sha256": sha256_file(path), "size": st.st_size,
            "mtime_ns": st.st_mtime_ns, "global_step": _global_step(path)}


def _global_step(path: Path) -> Optional[int]:
    """The optimizer step a Lightning checkpoint was saved at (the report's x axis for step points)."""
    try:
        import torch
        return int(torch.load(path, map_location="cpu", mmap=True, weights_only=False)["global_step"])
    except Exception:  # not a Lightning checkpoint (a test's stand-in): the step is unknown
        return None


def status(spec: Spec, cells: list[Cell]) -> dict[str, Optional[dict]]:
    """cell id -> marker of a finished cell, or None (to run)."""
    out: dict[str, Optional[dict]] = {}
    for c in cells:
        out[c.id] = done_record(spec, c, out.get(c.depends) if c.depends else None)
    return out


def find_results(spec: Spec, cell: Cell, sha: str, since: float = 0.0) -> Optional[Path]:
    """Newest results.json of ``cell.task`` under the seed's runs folder computed from checkpoint ``sha``."""
    root = spec.seed_root(cell.seed)
    best = None
    for p in root.glob(f"*/{cell.kind}/{cell.task}/version_*/results.json"):
        if p.stat().st_mtime < since:
            continue
        r = read_result(p)
        if r and r.checkpoint_sha256 == sha and r.task == cell.task and (best is None or p.stat().st_mtime >
                                                                           best.stat().st_mtime):
            best = p
    return best


def record(spec: Spec, cell: Cell, seconds: float = 0.0, since: float = 0.0,
           cpu_seconds: Optional[float] = None) -> dict:
    """Write the marker of a cell that just finished (local runner and job scripts). Raises when the cell left
    nothing to record (no checkpoint; no results.json for its checkpoint)."""
    ckpt = checkpoint_path(spec, cell)
    if not ckpt.is_file():
        raise FileNotFoundError(f"{cell.id}: no checkpoint at {ckpt}")
    rec = {"cell": cell.id, "key": cell.key, "kind": cell.kind, "variant": cell.variant, "seed": cell.seed,
           "task": cell.task, "point": cell.point, "seconds": round(seconds, 2),
           "cpu_seconds": None if cpu_seconds is None else round(cpu_seconds, 2),
           "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if cell.kind == PRETRAIN:
        rec.update(_checkpoint_entry(ckpt), run_dir=str(ckpt.parent.parent), points={})
        for p in spec.points:
            if p != FINAL:
                path = ckpt.parent / checkpoint_name(p)
                if not path.is_file():
                    raise FileNotFoundError(f"{cell.id}: the run kept no checkpoint {path} for AT point {p}")
                rec["points"][p] = _checkpoint_entry(path)
    else:
        sha = sha256_file(ckpt)
        rec.update(checkpoint=str(ckpt), ckpt_sha256=sha)
        res = find_results(spec, cell, sha, since)
        if res is None:
            raise FileNotFoundError(f"{cell.id}: no results.json for checkpoint {sha[:12]} under "
                                    f"{spec.seed_root(cell.seed)}/*/{cell.kind}/{cell.task}/")
        rec.update(results=str(res), run_dir=str(res.parent))
    atomic_json_dump(rec, marker_path(spec, cell))
    return rec


def write_plan(spec: Spec, cells: list[Cell], python: str) -> Path:
    """plan.json: the spec and every cell with its key and command (read by `python -m study.cell`)."""
    body = {"spec": {k: (str(v) if isinstance(v, Path) else v) for k, v in spec.__dict__.items()},
            "cells": [{**c.__dict__, "command": command(spec, c, python)} for c in cells],
            "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "pid": os.getpid()}
    path = spec.root / "plan.json"
    atomic_json_dump(body, path)
    return path


def load_plan(path: Path) -> tuple[Spec, list[Cell]]:
    body = json.loads(Path(path).read_text())
    s = dict(body["spec"])
    for k in ("variants", "seeds", "tasks", "pretrain_args", "probe_args", "analysis_args", "points"):
        s[k] = tuple(s.get(k, (FINAL,) if k == "points" else ()))
    s["task_data"] = tuple(tuple(td) for td in s.get("task_data", ()))
    s["root"] = Path(s["root"])
    cells = [Cell(**{k: v for k, v in c.items() if k != "command"}) for c in body["cells"]]
    return Spec(**s), cells
