"""LAUNCHER=slurm: job scripts instead of local runs, in ``<study>/slurm/``: ``pretrain.sbatch`` (one array task
per missing pretraining run, ``srun`` over the allocation's nodes and GPUs; a requeued task resumes from its
last.ckpt), ``eval.sbatch`` (one task per missing evaluation, one GPU each), ``report.sbatch``, and ``submit.sh``,
which chains them (``afterok`` on the pretraining array, ``afterany`` on the evaluations). Each cell's script
records its marker (``python -m study.record --record``), so ``make study`` afterwards sees what the cluster did.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from tokenmix import paths
from tokenmix.io import atomic_write

from .cells import PRETRAIN, Cell
from .plan import Spec

PY = "$PY"


@dataclass(frozen=True)
class SlurmOptions:
    nodes: int = 1
    gpus_per_node: int = 1
    ntasks_per_node: int = 0  # 0: one task per GPU (what Lightning's DDP under SLURM expects)
    cpus_per_task: int = 8
    time: str = "24:00:00"
    eval_time: str = "04:00:00"
    partition: str = ""
    account: str = ""
    max_parallel: int = 0  # array throttle (%N); 0 = no limit

    @property
    def tasks_per_node(self) -> int:
        return self.ntasks_per_node or max(self.gpus_per_node, 1)


def _q(args: list[str]) -> str:
    """Shell words; the python executable stays the variable $PY (set in the script, overridable)."""
    return " ".join(f'"{a}"' if a == PY else shlex.quote(a) for a in args)


def _header(name: str, n: int, opts: SlurmOptions, out: Path, *, nodes: int, tasks: int, gpus: int,
            time: str) -> list[str]:
    arr = f"0-{n - 1}" + (f"%{opts.max_parallel}" if opts.max_parallel else "")
    h = ["#!/bin/bash", f"#SBATCH --job-name={name}", f"#SBATCH --array={arr}", f"#SBATCH --nodes={nodes}",
         f"#SBATCH --ntasks-per-node={tasks}", f"#SBATCH --cpus-per-task={opts.cpus_per_task}",
         f"#SBATCH --time={time}", f"#SBATCH --output={out}/%x_%A_%a.out"]
    if gpus:
        h.append(f"#SBATCH --gpus-per-node={gpus}")
    h += [f"#SBATCH --partition={opts.partition}"] if opts.partition else []
    h += [f"#SBATCH --account={opts.account}"] if opts.account else []
    return h + ["set -euo pipefail", f"cd {shlex.quote(str(paths.REPO))}", 'PY="${PY:-.venv/bin/python}"', ""]


def array_script(spec: Spec, cells: list[Cell], opts: SlurmOptions, plan_file: Path, logs: Path) -> str:
    """One array task per cell, all pretraining or all evaluation: ``srun`` of the pretraining on the allocation
    (resuming from its own last.ckpt), an evaluation on one GPU; then the cell's marker (``study.record``)."""
    pre = cells[0].kind == PRETRAIN
    extra = [f"--trainer.num_nodes={opts.nodes}", f"--trainer.devices={opts.tasks_per_node}",
             f"--trainer.accelerator={'gpu' if opts.gpus_per_node else 'cpu'}"] if pre else []
    L = _header(f"study-{spec.name}-{'pretrain' if pre else 'eval'}", len(cells), opts, logs,
                nodes=opts.nodes if pre else 1, tasks=opts.tasks_per_node if pre else 1,
                gpus=opts.gpus_per_node if pre else 1 if opts.gpus_per_node else 0,
                time=opts.time if pre else opts.eval_time)
    L.append('case "$SLURM_ARRAY_TASK_ID" in')
    for i, c in enumerate(cells):
        ck = shlex.quote(str(c.checkpoint))
        run = [f"    RESUME=(); if [ -f {ck} ]; then RESUME=(--resume {ck}); fi",
               f'    srun {_q(c.command(PY) + extra)} ${{RESUME[@]+"${{RESUME[@]}}"}}'] if pre else \
            [f"    {_q(c.command(PY))}"]
        L += [f"  {i})  # {c.id}", f"    export TOKENMIX_RUNS={shlex.quote(c.env['TOKENMIX_RUNS'])}", *run,
              f'    "$PY" -m study.record --plan {shlex.quote(str(plan_file))} --cell {shlex.quote(c.id)} --record',
              "    ;;"]
    L += ['  *) echo "no cell for array index $SLURM_ARRAY_TASK_ID" >&2; exit 2;;', "esac"]
    return "\n".join(L) + "\n"


def report_script(spec: Spec, opts: SlurmOptions, report_args: list[str], logs: Path) -> str:
    L = ["#!/bin/bash", f"#SBATCH --job-name=study-{spec.name}-report", "#SBATCH --nodes=1",
         "#SBATCH --ntasks-per-node=1", "#SBATCH --time=00:30:00", f"#SBATCH --output={logs}/%x_%j.out"]
    L += [f"#SBATCH --partition={opts.partition}"] if opts.partition else []
    L += [f"#SBATCH --account={opts.account}"] if opts.account else []
    L += ["set -euo pipefail", f"cd {shlex.quote(str(paths.REPO))}", 'PY="${PY:-.venv/bin/python}"',
          f'"$PY" -m study {_q(report_args)} --report-only']
    return "\n".join(L) + "\n"


def submit_script(n_pre: int, n_eval: int) -> str:
    L = ["#!/bin/bash", "# Submit the study: pretraining array -> evaluation array (afterok) -> report (afterany).",
         "# sbatch --parsable prints '<job id>[;<cluster>]'.", "set -euo pipefail", 'cd "$(dirname "$0")"',
         'DEP=""']
    if n_pre:
        L += ["PRE=$(sbatch --parsable pretrain.sbatch); PRE=${PRE%%;*}",
              f'echo "pretraining: job array $PRE ({n_pre} tasks)"', 'DEP="--dependency=afterok:$PRE"']
    if n_eval:
        L += ["EVAL=$(sbatch --parsable $DEP eval.sbatch); EVAL=${EVAL%%;*}",
              f'echo "evaluations: job array $EVAL ({n_eval} tasks) $DEP"', 'DEP="--dependency=afterany:$EVAL"']
    L += ["REPORT=$(sbatch --parsable $DEP report.sbatch); REPORT=${REPORT%%;*}",
          'echo "report: job $REPORT $DEP"']
    return "\n".join(L) + "\n"


def write_scripts(spec: Spec, cells: list[Cell], done: dict, opts: SlurmOptions, plan_file: Path,
                  report_args: list[str]) -> dict[str, Path]:
    """Scripts for the cells without a marker; returns {name: path}."""
    folder = spec.root / "slurm"
    logs = folder / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    pre = [c for c in cells if c.kind == PRETRAIN and not done.get(c.id)]
    evals = [c for c in cells if c.kind != PRETRAIN and not done.get(c.id)]
    texts = {"report.sbatch": report_script(spec, opts, report_args, logs),
             "submit.sh": submit_script(len(pre), len(evals))}
    for name, some in (("pretrain.sbatch", pre), ("eval.sbatch", evals)):
        if some:
            texts[name] = array_script(spec, some, opts, plan_file, logs)
    for stale in ("pretrain.sbatch", "eval.sbatch"):  # a script of an earlier plan must not be submitted
        if stale not in texts and (folder / stale).exists():
            (folder / stale).unlink()
    out = {}
    for name, text in texts.items():
        with atomic_write(folder / name, "w") as f:
            f.write(text)
        (folder / name).chmod(0o755)
        out[name] = folder / name
    return out
