"""The study report: reports/study.md + study.csv + one plot per metric.

Metrics are the columns of ``analysis.report`` (``COLUMNS`` + ``EXTRA_COLUMNS``: same titles, same pick of the
number out of results.json; ``study.columns`` adds the head-free probes' columns, titled after them) and the papers'
rows are its ``paper_table()``; nothing is copied here. Each cell is mean ± std over seeds with n; Δ to the
baseline carries its 95 % CI, p and adjusted p (``tokenmix.stats``). A given checkpoint (``--checkpoint``) is a row
of its own: one run, no std and no Δ verdict.

    >>> table = collect(spec, cells, status(cells))  # doctest: +SKIP
    >>> write_report(spec, table, Path("reports"))          # doctest: +SKIP
"""
from __future__ import annotations

import csv
import datetime as _dt
import io
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from scipy import stats as st

from analysis.report import COLUMNS, EXTRA_COLUMNS, NOT_REPORTED, NOT_RUN, PAPER_NOTES, paper_table
from analysis.report_plots import save_png
from datamodules.demo import is_demo
from tokenmix import paths
from tokenmix.io import atomic_write
from tokenmix.stats import ALPHA, PAPER_EFFECTS as EFF, Summary, adjust, compare, summarize

from .curves import degradation, plot_task, point_label
from .cells import Cell
from .plan import Spec
from .points import FINAL, progress
from .store import read_result
from .columns import headless_columns, training_columns, training_values
from .verdicts import fmt_diff, fmt_p, power_lines, verdict



def columns_for(task: str, source: str, data: str) -> list:
    """The report columns one task feeds (analysis columns are tied to the data sets they apply to)."""
    out = []
    for c in COLUMNS + EXTRA_COLUMNS + headless_columns():
        if c.source != source or c.task != task:
            continue
        if c.datasets and data not in c.datasets and not (is_demo(data) and "demo" in c.datasets):
            continue
        out.append(c)
    return out


@dataclass
class Table:
    variants: list[str]
    baseline: Optional[str]
    columns: list = field(default_factory=list)
    values: dict = field(default_factory=dict)  # (variant, column key) -> [(seed, value, results path)]
    summaries: dict = field(default_factory=dict)  # (variant, column key) -> Summary
    diffs: dict = field(default_factory=dict)  # (variant, column key) -> Difference
    cells: list = field(default_factory=list)  # (cell id, run folder, checkpoint sha) of finished cells
    cost: dict = field(default_factory=dict)  # "pretrain" | task -> [(wall seconds, CPU seconds)] per finished cell
    points: list = field(default_factory=lambda: [FINAL])  # training points (AT); the tables above use the last
    progress: dict = field(default_factory=dict)  # point -> % of the schedule (None: unknown)
    curves: dict = field(default_factory=dict)  # (variant, column key) -> {point: [(seed, value)]}
    degradation: dict = field(default_factory=dict)  # (variant, column key) -> curves.Degradation
    checkpoints: list = field(default_factory=list)  # rows of given files (--checkpoint): one run each, in values


def collect(spec: Spec, cells: list[Cell], done: dict, baseline: str = "softmax") -> Table:
    base = baseline if baseline in spec.variants else None
    t = Table(list(spec.variants), base, points=list(spec.points), checkpoints=[n for n, *_ in spec.checkpoints])
    last_point = t.points[-1]
    finished, final_steps = set(), []
    for c in cells:
        rec = done.get(c.id)
        if rec:
            t.cells.append((c.id, rec.get("run_dir", ""), rec.get("ckpt_sha256", "")))
            t.cost.setdefault(c.task or "pretrain", []).append((rec.get("seconds"), rec.get("cpu_seconds")))
        if c.kind == "pretrain":
            final_steps += [rec["global_step"]] if rec and rec.get("global_step") else []
            for col, v, src in training_values(rec):  # the run's own summary.json
                t.columns += [] if col.key in {x.key for x in t.columns} else [col]
                t.values.setdefault((c.variant, col.key), []).append((c.seed, v, src))
            continue
        data = spec.eval_data(c.task)[0]
        for col in columns_for(c.task, c.kind, data):
            if col not in t.columns:
                t.columns.append(col)
        res = read_result(Path(rec["results"])) if rec else None
        if res is None:
            continue
        at_end = c.point == last_point or bool(c.sha256)  # a given file has no training points
        if at_end:
            finished.add(c.task)
        for col in columns_for(c.task, c.kind, data):
            v = col.pick(res.metrics, res.payload)
            if v is None:
                continue
            if not c.sha256:
                t.curves.setdefault((c.variant, col.key), {}).setdefault(c.point, []).append((c.seed, v))
            if at_end:
                t.values.setdefault((c.variant, col.key), []).append((c.seed, v, str(res.path)))
    final_step = sorted(final_steps)[len(final_steps) // 2] if final_steps else None
    t.progress = {p: progress(p, spec.max_epochs or 1, final_step) for p in t.points}
    order = {c.key: i for i, c in enumerate(training_columns() + COLUMNS + headless_columns() + EXTRA_COLUMNS)}
    # a column whose task finished without giving its metric (e.g. an older results.json schema) is dropped;
    # one whose task has not finished yet stays, as 'not run'
    keep = [c for c in t.columns if any(k == c.key for _, k in t.values) or c.task not in finished]
    t.columns = sorted(keep, key=lambda c: order[c.key])
    for (v, k), vals in t.values.items():
        t.summaries[(v, k)] = summarize([x for _, x, _ in vals], [sd for sd, _, _ in vals])
    for col in t.columns:
        b = t.summaries.get((base, col.key))
        for v in t.variants:
            a = t.summaries.get((v, col.key))
            if a and b and v != base and col.delta:
                t.diffs[(v, col.key)] = compare(a, b, paired=True)  # a seed fixes data order and probe draws
            d = degradation(t.curves.get((v, col.key), {}), t.points, col.lower_is_better)
            if d is not None:
                t.degradation[(v, col.key)] = d
    t.diffs = adjust(t.diffs)  # Benjamini–Hochberg over the whole table
    return t


# --------------------------------------------------------------------------- formatting

def fmt_summary(s: Optional[Summary], digits: int) -> str:
    if s is None:
        return NOT_RUN
    spread = "n/a" if s.std is None else f"{s.std:.{digits}f}"
    return f"{s.mean:.{digits}f} ± {spread} (n={s.n})"


def fmt_single(s: Optional[Summary], digits: int) -> str:
    """A given checkpoint's value: one run, so no spread to show."""
    return NOT_RUN if s is None else f"{s.mean:.{digits}f} (single run)"


def _paper_cell(row: dict, col, delta: bool) -> str:
    v = row.get(f"{col.key}_delta" if delta else col.key)
    if v is None:
        return "—" if delta else NOT_REPORTED
    return f"{v:+.{col.digits}f}" if delta else f"{v:.{col.digits}f}"


def _shown(p) -> str:
    """``p`` as a report writes it: relative to the repository, else to the runs folder (``<runs>/...``), so a
    report names no machine's absolute paths; a path outside both as given."""
    for base, label in ((paths.REPO, ""), (paths.RUNS, "<runs>/")):
        try:
            return label + str(Path(p).resolve().relative_to(Path(base).resolve()))
        except ValueError:
            continue
    return str(p)


def shown_command(args) -> str:
    """The study's command line as a report writes it: absolute paths through :func:`_shown`, and one outside
    the repository and the runs folder as ``<…>/<name>`` (its folder is this machine's, not the reader's)."""
    def arg(a: str) -> str:
        head, eq, value = a.rpartition("=")  # NAME=/path of --checkpoint as well
        return head + eq + _shown_file(value) if os.path.isabs(value) else a
    return " ".join(shlex.quote(arg(a)) for a in args)


def _shown_file(p) -> str:
    """:func:`_shown`, and a path outside the repository and the runs folder as ``<…>/<name>``."""
    s = _shown(p)
    return f"<…>/{Path(p).name}" if os.path.isabs(s) else s


def markdown(spec: Spec, t: Table, plots: list[str], command: str) -> str:
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    heads = [c.title + (" ↓" if c.lower_is_better else "") for c in t.columns]
    sep = "|---|" + "---|" * len(t.columns)
    # the papers' rows that report at least one of these columns
    papers = [p for p in paper_table() if any(p.get(c.key) is not None for c in t.columns)]
    L = [f"# tokenmix study `{spec.name}`", "",
         f"Generated {now} by `{command}`: variants {', '.join(spec.variants)}; seeds "
         f"{', '.join(map(str, spec.seeds))}; {_checkpoints_phrase(spec)}preset `{spec.preset}`; data "
         f"`{spec.data}`; tasks "
         f"{', '.join(spec.tasks)}. State and runs: `{_shown(spec.root)}`.", "",
         "Each cell: mean ± sample standard deviation over seeds (n = seeds measured). Δ = mean − mean of "
         f"`{t.baseline or 'no baseline'}` [95 % CI], two-sided p and (adj.) its Benjamini–Hochberg value over every "
         "row of the table; *paired* t-test where both sides hold the same seeds (a study seed fixes the data order "
         "and the probe's draws), else *Welch* (docs/study.md). Significant = adj. p ≤ 0.05. ↓ = lower is better. "
         f"'{NOT_RUN}' = no finished cell; '{NOT_REPORTED}' = the paper gives no number."]
    if is_demo(spec.data):
        L += ["", "Measured on the generated demo data (columns are the demo analogues: demo ImageFolder for "
              "ImageNet, demo VOC scenes for VOC/PiB/CorLoc, demo NYU rooms for NYUv2): never compare them with "
              "the paper rows, which are there for reference only."]
    L += ["", "## Mean ± std over seeds", "", "| variant | " + " | ".join(heads) + " |", sep]
    L += [f"| {v} | " + " | ".join(fmt_summary(t.summaries.get((v, c.key)), c.digits) for c in t.columns) + " |"
          for v in t.variants] + checkpoint_rows(t)
    for p in papers:
        L.append(f"| *{p['row']}* | " + " | ".join(_paper_cell(p, c, False) for c in t.columns) + " |")
    L += checkpoint_lines(spec)
    L += ["", f"## Difference to {t.baseline} (Δ [95 % CI], p (adjusted), test)", "",
          "| variant | " + " | ".join(heads) + " |", sep]
    for v in t.variants:
        if v != t.baseline:
            L.append(f"| {v} | " + " | ".join(fmt_diff(t.diffs.get((v, c.key)), c.digits) for c in t.columns) + " |")
    for p in papers:
        L.append(f"| *{p['row']}* (vs its own baseline) | " + " | ".join(_paper_cell(p, c, True)
                                                                          for c in t.columns) + " |")
    if not papers:
        L += ["", "The papers report none of these columns (reference rows: `make report`)."]
    L += [""] + [f"- {n}" for n in PAPER_NOTES] + [""] + power_lines(spec, t) + ["## Verdicts", ""]
    for c in t.columns:
        lines = [verdict(v, t.baseline, c, t.diffs[(v, c.key)]) for v in t.variants if (v, c.key) in t.diffs]
        if lines:
            L.append(f"**{c.title}**{' (lower is better)' if c.lower_is_better else ''}")
            L += [f"- {x}" for x in lines] + [""]
    L += ["## Per-seed values", "", "| variant | seed | " + " | ".join(heads) + " |", "|---|---|" +
          "---|" * len(t.columns)]
    for v in t.variants:
        for s in spec.seeds:
            vals = [next((f"{x:.{c.digits}f}" for sd, x, _ in t.values.get((v, c.key), []) if sd == s), NOT_RUN)
                    for c in t.columns]
            L.append(f"| {v} | {s} | " + " | ".join(vals) + " |")
    if len(t.points) > 1:
        L += over_training_lines(t, spec, [p for p in plots if p.startswith("study_curve_")])
        plots = [p for p in plots if not p.startswith("study_curve_")]
    L += cost_lines(t)
    if plots:
        L += ["", "## Plots", "", "Per-variant points: one per seed; bar = mean ± std.", ""]
        L += [f"![{p}]({p})" for p in plots]
    L += ["", "## Cells", "", "Finished cells, their run folders (TensorBoard logs) and the checkpoint sha256 "
          "(first 12 hex digits).", ""]
    L += [f"- `{cid}`: `{_shown(rd) if rd else rd}` (checkpoint {sha[:12]})" for cid, rd, sha in t.cells]
    return "\n".join(L) + "\n"


def _checkpoints_phrase(spec: Spec) -> str:
    return f"checkpoints {', '.join(n for n, *_ in spec.checkpoints)}; " if spec.checkpoints else ""


def checkpoint_rows(t: Table) -> list[str]:
    """The mean table's rows of the given checkpoints (``--checkpoint``)."""
    return [f"| {n} (checkpoint) | " + " | ".join(fmt_single(t.summaries.get((n, c.key)), c.digits)
                                                 for c in t.columns) + " |" for n in t.checkpoints]


def checkpoint_lines(spec: Spec) -> list[str]:
    """What the (checkpoint) rows are: the files, their sha256, and why they have no std and no Δ."""
    if not spec.checkpoints:
        return []
    L = ["", "(checkpoint) rows: a given checkpoint file (`--checkpoint`), every task run once on it (probe seed 0), "
         "with no pretraining: a single run, so no std over seeds and no Δ or verdict against the baseline."]
    return L + [f"- `{n}`: `{_shown_file(f)}`{f' (timm `{a}`)' if a else ''}, sha256 {sha[:12]}"
                for n, f, a, sha in spec.checkpoints]


def over_training_lines(t: Table, spec: Spec, plots: list[str]) -> list[str]:
    """The report's "Over training" section: points, degradation table, curve plots."""
    L = ["", "## Over training (AT)", "",
         "Points evaluated: " + ", ".join(f"{point_label(p)} ({t.progress[p]:.0f} %)" if t.progress.get(p)
                                          is not None else point_label(p) for p in t.points)
         + f" of {spec.max_epochs} epochs. The tables above use the last point.", "",
         "**Degradation**: the drop from each variant's best point (best mean over seeds) to its last, per seed "
         "(value at best − value at last; sign flipped for ↓ metrics, so positive = worse at the end), mean ± std "
         "(n), p of the one-sided one-sample t-test of drop > 0 (adjusted: Benjamini–Hochberg over this table); "
         "‼ = adjusted p ≤ 0.05. The best point is chosen on the same seeds, so the drop is biased upwards: a small "
         "positive drop is what noise alone gives.", "",
         "| metric | variant | best point | mean at best | mean at last | drop (per seed) | p (adj.) | seeds |",
         "|---|---|---|---|---|---|---|---|"]
    rows = [(c, v, t.degradation[(v, c.key)]) for c in t.columns for v in t.variants if (v, c.key) in t.degradation]
    tested = [d.p for _, _, d in rows if d.p is not None]
    adj = iter(st.false_discovery_control(tested, method="bh") if tested else [])
    for col, v, d in rows:
        q = None if d.p is None else float(next(adj))
        mark = " ‼" if q is not None and q <= ALPHA else ""
        seeds = " ".join(f"{x:+.{col.digits}f}" for x in d.drop.values)
        L.append(f"| {col.title} | {v} | {point_label(d.best)} | {d.best_mean:.{col.digits}f} | "
                 f"{d.last_mean:.{col.digits}f} | {fmt_summary(d.drop, col.digits)}{mark} | {fmt_p(d.p)} "
                 f"({fmt_p(q)}) | {seeds} |")
    if plots:
        L += ["", "Curves: mean over seeds (line) ± std (band); the baseline black and dashed.", ""]
        L += [f"![{p}]({p})" for p in plots]
    L += ["", "| metric | variant | " + " | ".join(point_label(p) for p in t.points) + " |",
          "|---|---|" + "---|" * len(t.points)]
    for col in t.columns:
        for v in t.variants:
            curve = t.curves.get((v, col.key), {})
            if curve:
                cells = [fmt_summary(summarize([x for _, x in curve.get(p, [])]), col.digits) for p in t.points]
                L.append(f"| {col.title} | {v} | " + " | ".join(cells) + " |")
    return L


def cost_lines(t: Table) -> list[str]:
    """Mean wall and CPU (user + system, the cell's own processes) seconds per cell kind, from the markers."""
    if not t.cost:
        return []
    L = ["", "## Cost per cell", "", "Wall time depends on what else runs on the machine; CPU time much less.", "",
         "| cell | finished | mean wall (s) | mean CPU (s) |", "|---|---|---|---|"]
    for kind, xs in t.cost.items():
        wall = [w for w, _ in xs if w]
        cpu = [c for _, c in xs if c is not None]
        L.append(f"| {kind} | {len(xs)} | {sum(wall) / len(wall):.0f} |" if wall else f"| {kind} | {len(xs)} | — |")
        L[-1] += f" {sum(cpu) / len(cpu):.0f} |" if cpu else " — |"
    return L


def write_csv(spec: Spec, t: Table, path: Path) -> None:
    buf = io.StringIO()
    w = csv.writer(buf)
    head = ["kind", "variant", "column", "title", "n", "mean", "std", "se", "delta_vs_baseline", "test", "df", "p",
            "p_adj", "significant", "ci_low", "ci_high", "mde", "paper_effect", "values_by_seed"]
    w.writerow(head)
    g = lambda x, f=".6g": "" if x is None else format(x, f)  # noqa: E731  (p and CI in full: checkable)
    row = lambda *a: w.writerow(list(a) + [""] * (len(head) - len(a)))  # noqa: E731
    for c in t.columns:
        for v in t.variants:
            s, d = t.summaries.get((v, c.key)), t.diffs.get((v, c.key))
            if s is None:
                row("measured", v, c.key, c.title, 0, NOT_RUN)
                continue
            lo, hi = d.ci if d and d.ci else (None, None)
            tested = [d.test, g(d.df), g(d.p, ".17g"), g(d.p_adj, ".17g"), str(d.significant).lower(),
                      g(lo, ".17g"), g(hi, ".17g"), g(d.mde), g(EFF.get(c.key))] if d else [""] * 9
            w.writerow(["measured", v, c.key, c.title, s.n, g(s.mean), g(s.std), g(s.se), g(d.delta if d else None),
                        *tested, " ".join(f"{sd}:{float(x)!r}" for sd, x, _ in sorted(t.values[(v, c.key)]))])
        for n in t.checkpoints:  # one run: no std, no seed, no Δ
            s = t.summaries.get((n, c.key))
            row("checkpoint", n, c.key, c.title, s.n if s else 0, f"{s.mean:.6g}" if s else NOT_RUN)
        for p in paper_table():
            if p.get(c.key) is not None:
                row("paper", p["row"], c.key, c.title, "", f"{p[c.key]:.6g}", "", "", g(p.get(f"{c.key}_delta")))
    with atomic_write(path, "w") as f:
        f.write(buf.getvalue())


def plot_column(t: Table, col, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = t.variants + t.checkpoints  # a checkpoint's one run: a single dot
    fig, ax = plt.subplots(figsize=(1.2 + 1.1 * len(rows), 3.2))
    for i, v in enumerate(rows):
        pts = t.values.get((v, col.key), [])
        n = max(len(pts), 1)
        for j, (seed, x, _) in enumerate(sorted(pts)):
            ax.plot(i + 0.12 * (j - (n - 1) / 2), x, "o", color=f"C{i}", alpha=0.8, ms=5)
        s = t.summaries.get((v, col.key))
        if s is not None:
            ax.errorbar(i + 0.3, s.mean, yerr=s.std or 0, fmt="_", color="k", ms=12, capsize=4)
    ax.set_xticks(range(len(rows)), rows, rotation=20, fontsize=8)
    ax.set_ylabel(col.title + (" ↓" if col.lower_is_better else ""), fontsize=8)
    ax.set_title(col.title, fontsize=9)
    ax.set_xlabel("dots: one per seed; bar: mean ± std", fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    save_png(fig, path)


def write_report(spec: Spec, t: Table, out: Path, command: str = "python -m study") -> Path:
    out.mkdir(parents=True, exist_ok=True)
    plots = []
    for c in t.columns:
        if any((v, c.key) in t.values for v in t.variants + t.checkpoints):
            plot_column(t, c, out / f"study_{c.key}.png")
            plots.append(f"study_{c.key}.png")
    if len(t.points) > 1:
        for task in dict.fromkeys(c.task for c in t.columns):
            cols = [c for c in t.columns if c.task == task]
            if plot_task(task, cols, t.variants, t.baseline, t.curves, t.points, t.progress,
                         out / f"study_curve_{task}.png"):
                plots.append(f"study_curve_{task}.png")
    write_csv(spec, t, out / "study.csv")
    with atomic_write(out / "study.md", "w") as f:
        f.write(markdown(spec, t, plots, command))
    return out / "study.md"
