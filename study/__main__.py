"""``make study``: variants x seeds pretraining runs, then every task on every checkpoint, then one report.

    python -m study --variants "softmax entmax" --seeds 2 --tasks "knn voc pib" --preset tiny [--dry-run]
    python -m study ... --launcher slurm --nodes 2 --gpus-per-node 8   # job scripts instead of local runs
    python -m study ... --checkpoint dinov2_reg=dinov2_vits14_reg4_pretrain.pth   # + a given checkpoint's row

Finished cells are reused (matched by configuration key and checkpoint sha256), missing ones run in dependency
order, an interrupted study resumes. State: runs/study/<name>/; report: reports/study.md + study.csv + plots.
"""
from __future__ import annotations

import argparse
import csv
import os
import shlex
import signal
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from datamodules.demo import is_demo
from tokenmix import paths

from .cells import PRETRAIN
from .plan import Spec, plan, write_plan
from .slurm import SlurmOptions
from .store import status

DEFAULT_VARIANTS = "softmax entmax registers specialization lastvit"
DEFAULT_TASKS = "knn voc nyuv2 pib corloc"


def _words(s: str) -> list[str]:
    return [w for w in s.replace(",", " ").split() if w]


def parse_seeds(s: str) -> list[int]:
    """'3' -> [0, 1, 2] (a count); '0,4,7' or '0 4 7' -> those seeds."""
    words = _words(str(s))
    try:
        if len(words) == 1 and "," not in str(s):
            n = int(words[0])
            if n < 1:
                raise ValueError
            return list(range(n))
        return [int(w) for w in words]
    except ValueError:
        raise ValueError(f"--seeds {s!r}: a count (e.g. 3 = seeds 0,1,2) or a list of seeds ('0,4,7')") from None


def parse_checkpoint(s: str) -> tuple[str, str, str]:
    """'NAME=FILE[:TIMM_NAME]' -> (name, file, timm name or ''); a ':' ends the file only before a name without
    '/' (a model name, not a folder) and when FILE:... itself is no file."""
    name, eq, rest = s.partition("=")
    if not eq or not name.strip() or not rest.strip():
        raise ValueError(f"--checkpoint {s!r}: expected NAME=FILE[:TIMM_NAME], e.g. "
                         "dinov2_reg=dinov2_vits14_reg4_pretrain.pth or vits14=model.safetensors:"
                         "vit_small_patch14_reg4_dinov2")
    file, colon, arch = rest.rpartition(":")
    if not colon or not file or "/" in arch or Path(rest).expanduser().is_file():
        file, arch = rest, ""
    return name.strip(), file.strip(), arch.strip()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m study", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--name", default="", help="study name: state in runs/study/<name> (default: the preset, +data if not demo)")
    a("--variants", default=DEFAULT_VARIANTS)
    a("--seeds", default="3", help="count (3 = seeds 0,1,2) or list ('0,4,7')")
    a("--tasks", default=DEFAULT_TASKS, help="probe tasks (probes.run) and analysis tasks (analysis.run)")
    a("--preset", default="", help="pretraining preset (configs/pretrain/<preset>.yaml or a YAML path; "
      "default demo for DATA=demo, paper otherwise)")
    a("--data", default="demo")
    a("--data-root", default="")
    a("--at", default="", help="training points to evaluate, e.g. '25%% 50%% 100%%', 'e2 e4 e6' or 's100 s200' "
      "(study.points; default: the end of training only)")
    a("--task-data", action="append", default=[], metavar="TASK=DATA[:ROOT]",
      help="evaluate TASK on another data set, e.g. voc=voc:/data/VOCdevkit (repeatable)")
    a("--checkpoint", action="append", default=[], metavar="NAME=FILE[:TIMM_NAME]",
      help="also evaluate every task once on this checkpoint file, as the report's row NAME (no pretraining, no "
      "seeds): a DINOv2 hub .pth, a timm .pth/.safetensors with its timm model name, an official DINO .pth, a "
      "tokenmix .ckpt (repeatable; docs/study.md)")
    a("--probe-config", default=None, help="--config of every probe (default configs/probe/demo.yaml for demo "
      "data, configs/probe/paper.yaml otherwise; '' for none)")
    a("--pretrain-args", default="", help="extra flags of every pretraining run (LightningCLI overrides); "
      "write --pretrain-args='--trainer.max_epochs=3' (with '=': the value starts with '-')")
    a("--probe-args", default="", help="extra flags of every probe run")
    a("--analysis-args", default="", help="extra flags of every analysis run")
    a("--launcher", default="local", choices=[v.value for v in Launcher])
    a("--dry-run", action="store_true", help="print the plan and what is already done; run nothing")
    a("--report-only", action="store_true", help="write the report from the finished cells; run nothing")
    a("--out", default="", help="report folder (default: <repo>/reports)")
    a("--baseline", default="softmax")
    a("--root", default="", help="study folder (default: runs/study/<name>)")
    a("--no-tensorboard", action="store_true")
    s = p.add_argument_group("slurm (LAUNCHER=slurm)")
    s.add_argument("--nodes", type=int, default=1)
    s.add_argument("--gpus-per-node", type=int, default=1)
    s.add_argument("--ntasks-per-node", type=int, default=0, help="default: one task per GPU")
    s.add_argument("--cpus-per-task", type=int, default=8)
    s.add_argument("--time", default="24:00:00", help="time limit of a pretraining task")
    s.add_argument("--eval-time", default="04:00:00", help="time limit of an evaluation task")
    s.add_argument("--partition", default="")
    s.add_argument("--account", default="")
    s.add_argument("--max-parallel", type=int, default=0, help="array throttle (%%N); 0 = none")
    return p


class Launcher(str, Enum):
    """--launcher: run the cells here, or write SLURM job scripts."""
    LOCAL = "local"
    SLURM = "slurm"


@dataclass(frozen=True)
class StudyConfig:
    """Everything one ``make study`` reads, typed and resolved once from the flags (``make_config``)."""
    spec: Spec
    launcher: Launcher
    dry_run: bool
    report_only: bool
    out: Path               # report folder
    baseline: str
    tensorboard: bool
    slurm: SlurmOptions
    rerun_flags: tuple[str, ...]  # the flags that re-create this spec (the slurm report job's command)


def make_config(args: argparse.Namespace) -> StudyConfig:
    """The study's config from the parsed flags (a ValueError names a flag and its expected form)."""
    spec = make_spec(args)
    slurm = SlurmOptions(args.nodes, args.gpus_per_node, args.ntasks_per_node, args.cpus_per_task, args.time,
                         args.eval_time, args.partition, args.account, args.max_parallel)
    return StudyConfig(spec, Launcher(args.launcher), args.dry_run, args.report_only,
                       Path(args.out) if args.out else paths.REPO / "reports", args.baseline, not args.no_tensorboard,
                       slurm, tuple(cli_args(args, spec)))


def make_spec(args: argparse.Namespace) -> Spec:
    preset = args.preset or ("demo" if is_demo(args.data) else "paper")
    name = args.name or (preset if args.data == "demo" else f"{preset}-{args.data}")
    task_data = []
    for td in args.task_data:
        task, _, rest = td.partition("=")
        data, _, root = rest.partition(":")
        if not task or not data:
            raise ValueError(f"--task-data {td!r}: expected TASK=DATA[:ROOT], e.g. voc=voc:/data/VOCdevkit")
        task_data.append((task, data, root))
    return Spec.create(name=name, variants=_words(args.variants), seeds=parse_seeds(args.seeds),
                       tasks=_words(args.tasks), preset=preset, data=args.data, data_root=args.data_root,
                       probe_config=args.probe_config, pretrain_args=shlex.split(args.pretrain_args),
                       probe_args=shlex.split(args.probe_args), analysis_args=shlex.split(args.analysis_args),
                       root=Path(args.root) if args.root else None, task_data=task_data, at=args.at,
                       checkpoints=[parse_checkpoint(c) for c in args.checkpoint])


def describe(spec: Spec, cells, done, python: str, verbose: bool) -> str:
    n_pre = sum(c.kind == PRETRAIN for c in cells)
    fixed = f" + {len(spec.checkpoints)} checkpoints" if spec.checkpoints else ""
    L = [f"[study] {spec.name}: {len(spec.variants)} variants x {len(spec.seeds)} seeds = {n_pre} pretraining "
         f"runs{fixed}, {len(spec.tasks)} tasks -> {len(cells) - n_pre} evaluations; state in {spec.root}"]
    for name, file, arch, sha in spec.checkpoints:
        L.append(f"[study] checkpoint {name}: {file}{' as ' + arch if arch else ''} (sha256 {sha[:12]}): every task "
                 "once, no pretraining")
    if spec.max_epochs:
        from .points import describe_point
        L.append("[study] training points evaluated: " + ", ".join(describe_point(p, spec.max_epochs)
                                                                 for p in spec.points))
    for c in cells:
        rec = done.get(c.id)
        if rec:
            state, what = "done (reused)", rec.get("results") or rec.get("checkpoint")
        else:
            resume = c.kind == PRETRAIN and c.checkpoint.is_file()
            state = "to resume" if resume else "to run"
            what = " ".join(shlex.quote(x) for x in c.command(python, resume=resume))
        L.append(f"  {state:<14} {c.id:<32} {what if verbose or rec else ''}".rstrip())
    todo = [c for c in cells if not done.get(c.id)]
    L.append(f"[study] done {len(cells) - len(todo)}/{len(cells)} cells; to run: "
             f"{sum(c.kind == PRETRAIN for c in todo)} pretraining, {sum(c.kind != PRETRAIN for c in todo)} "
             "evaluations")
    return "\n".join(L)


def cli_args(args: argparse.Namespace, spec: Spec) -> list[str]:
    """The flags that re-create this spec (for the slurm report job), as --flag=value: values may start with '-'."""
    pairs = [("name", spec.name), ("variants", " ".join(spec.variants)), ("seeds", ",".join(map(str, spec.seeds))),
             ("tasks", " ".join(spec.tasks)), ("at", args.at), ("preset", spec.preset), ("data", spec.data),
             ("data-root", spec.data_root), ("probe-config", spec.probe_config),
             ("pretrain-args", args.pretrain_args), ("probe-args", args.probe_args),
             ("analysis-args", args.analysis_args), ("root", str(spec.root)), ("baseline", args.baseline)]
    pairs += [("task-data", td) for td in args.task_data] + ([("out", args.out)] if args.out else [])
    pairs += [("checkpoint", f"{n}={f}" + (f":{a}" if a else "")) for n, f, a, _ in spec.checkpoints]
    return [f"--{k}={v}" for k, v in pairs]


def power_line(seeds: int, report: Path) -> str:
    """Before launching: the smallest Δ these seeds detect, in seed sd and at the last study's seed sd (its
    study.csv) per paper metric, with the seeds the paper's effect needs (``tokenmix.stats``)."""
    from tokenmix.stats import PAPER_EFFECTS as EFF, min_detectable, pooled_sd

    from .verdicts import detectable
    mde, cells = min_detectable(1.0, seeds, seeds), {}
    with open(report if report.is_file() else os.devnull, newline="") as f:
        for r in csv.DictReader(f):
            if r.get("kind") == "measured" and r.get("std") and r["column"] in EFF:
                cells.setdefault((r["column"], r["title"]), []).append((int(r["n"]), float(r["std"])))
    parts = [f"{t}: sd {sd:.3g}, |Δ| ≥ {d[0]:.3g}; the paper's {d[1]:+g} needs {d[2]} seeds a side"
             for (k, t), c in cells.items() for sd in [pooled_sd(c)] if sd and mde for d in [detectable(k, sd, seeds)]]
    head = (f"[study] {seeds} seeds a side detect |Δ| ≥ {mde:.2f} seed sd (two-sided t-test, α = 0.05, power 0.8)"
            if mde else "[study] 1 seed a side: no test (2 or more needed)")
    return f"{head}. At the seed sd of {report}: " + "; ".join(parts) if parts else \
        f"{head}; no earlier {report} gives the seed sd of the papers' metrics"


@contextmanager
def _terminate_as_interrupt():
    """SIGTERM (a job scheduler, ``kill``) as Ctrl-C: the running cell is stopped with it (``local.run_cell``)
    instead of going on alone after the study is gone, and the study says how to resume."""
    def stop(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        old = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def main(argv=None) -> int:
    try:
        cfg = make_config(build_parser().parse_args(argv))
    except ValueError as e:
        print(f"study error: {e}", file=sys.stderr)
        return 2
    spec, python = cfg.spec, sys.executable
    cells = plan(spec)
    done = status(cells)
    print(describe(spec, cells, done, python, verbose=cfg.dry_run), flush=True)
    print(power_line(len(spec.seeds), cfg.out / "study.csv"), flush=True)
    if cfg.dry_run:
        return 0
    spec.root.mkdir(parents=True, exist_ok=True)
    plan_file = write_plan(spec, cells, python)
    if cfg.launcher == Launcher.SLURM and not cfg.report_only:
        from .slurm import write_scripts
        scripts = write_scripts(spec, cells, done, cfg.slurm, plan_file, list(cfg.rerun_flags))
        print(f"[study] job scripts: {', '.join(str(p) for p in scripts.values())}\n"
              f"[study] submit with: bash {scripts['submit.sh']}")
        return 0
    return run(cfg, cells, done, python, shown=argv if argv is not None else sys.argv[1:])


def run(cfg: StudyConfig, cells, done, python: str, shown: list[str]) -> int:
    """The missing cells here, then the report (``--report-only``: the report alone)."""
    from .progress import Progress, StudyBoard
    from .report import collect, shown_command, write_report
    spec = cfg.spec
    board = StudyBoard(spec.root / "tensorboard") if cfg.tensorboard else None
    failures = []
    if not cfg.report_only:
        from .local import run_missing
        totals = {s: sum(c.stage == s for c in cells) for s in Progress.STAGES}
        already = {s: sum(c.stage == s and bool(done.get(c.id)) for c in cells) for s in Progress.STAGES}
        progress = Progress(totals, already)
        progress.show()
        if board is not None:
            board.progress(progress.done)
        try:
            with _terminate_as_interrupt():
                failures = run_missing(cells, done, python, progress, spec.root / "logs", board)
        except KeyboardInterrupt:
            progress.show(final=True)
            print(f"[study] interrupted: the finished cells are kept; run the same command again to resume "
                  f"(state in {spec.root})", file=sys.stderr)
            return 130
        progress.show(final=True)
    table = collect(spec, cells, status(cells), cfg.baseline)
    report = write_report(spec, table, cfg.out, command="python -m study " + shown_command(shown))
    if board is not None:
        board.results(table, spec.root)
        board.close()
    print(f"[study] report: {report} (+ {cfg.out / 'study.csv'}, plots); TensorBoard: {spec.root / 'tensorboard'}")
    for cid, why in failures:
        print(f"[study] not finished: {cid}: {why.splitlines()[0]}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
