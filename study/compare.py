"""Two finished studies side by side: the same variants and tasks under two conditions (e.g. demo data with and
without the lazy-aggregation cue), Δ = B − A per variant and metric with the study's statistics (``tokenmix.stats``).

    python -m study.compare runs/study/sup_lazy0 runs/study/sup_lazy1 --labels "p = 0,p = 1" [--out FILE.md]

Each study is read from its own plan.json and finished cells (``study.report.collect``: the same columns, the same
picks of results.json), so the figures are those of each study's own report. Per variant and metric: A and B as
mean ± std (n) at the last training point, Δ [95 % CI], p (Benjamini–Hochberg adjusted over the table) and the test:
*paired* by seed where both studies hold the same seeds (the same variant and seed: the same initial weights, data
order and probe draws; only the condition differs), else Welch; then, where the studies evaluated several training
points, the mean of each at every point.

    >>> a, b = summarize([10.0, 12.0, 14.0]), summarize([4.0, 6.0, 8.0])
    >>> compare_row("softmax", "PiB", a, b, adjust({0: compare(b, a)})[0], 2)[-62:]
    '| -6.00 [-10.53, -1.47], p = 0.021 (adj. 0.021), Welch | yes |'
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

from tokenmix.io import atomic_write
from tokenmix.stats import Difference, Summary, adjust, compare, summarize

from .store import read_plan, status
from .plan import Spec
from .report import Table, collect, fmt_summary
from .verdicts import fmt_diff


def spec_from_plan(root: Path) -> Spec:
    """The Spec a study's plan.json recorded (``study.plan.write_plan``), paths and tuples restored."""
    plan = Path(root) / "plan.json"
    if not plan.is_file():
        raise FileNotFoundError(f"{plan}: no plan.json (not a study folder, or the study never ran: make study ...)")
    d = json.loads(plan.read_text())["spec"]
    nested = {"task_data", "checkpoints"}
    fields = {k: (tuple(tuple(x) for x in v) if k in nested else tuple(v) if isinstance(v, list) else v)
              for k, v in d.items()}
    fields["root"] = Path(fields["root"])
    return Spec(**fields)


def load_table(root: Path) -> tuple[Spec, Table]:
    spec = spec_from_plan(root)
    cells = read_plan(Path(root) / "plan.json")
    return spec, collect(spec, cells, status(cells), baseline="")


def compare_row(variant: str, title: str, a: Optional[Summary], b: Optional[Summary], d: Optional[Difference],
                digits: int) -> str:
    """One markdown row: A, B, Δ = B − A [CI], p (adj.), test; significant: adjusted p ≤ 0.05."""
    word = "—" if d is None or d.p is None else "yes" if d.significant else "no"
    return (f"| {variant} | {title} | {fmt_summary(a, digits)} | {fmt_summary(b, digits)} | {fmt_diff(d, digits)} "
            f"| {word} |")


def markdown(a: tuple[Spec, Table], b: tuple[Spec, Table], labels: tuple[str, str]) -> str:
    (sa, ta), (sb, tb) = a, b
    cols = [c for c in ta.columns if c.key in {k.key for k in tb.columns}]
    variants = [v for v in ta.variants if v in tb.variants]
    la, lb = labels
    L = [f"# {sa.name} ({la}) vs {sb.name} ({lb})", "",
         f"Δ = {lb} − {la} [95 % CI]; mean ± std (n) over seeds at the last training point; p of the row's test "
         "(paired by seed where both hold the same seeds, else Welch) and, in brackets, adjusted (Benjamini–Hochberg "
         "over this table); significant = adjusted p ≤ 0.05 (tokenmix.stats, docs/study.md).", "",
         f"| variant | metric | {la} | {lb} | Δ [95 % CI], p (adj.), test | significant |", "|---|" * 5 + "---|"]
    rows = [(v, c, ta.summaries.get((v, c.key)), tb.summaries.get((v, c.key))) for v in variants for c in cols]
    rows = [r for r in rows if r[2] or r[3]]
    diffs = adjust({i: compare(b_, a_, paired=True) for i, (_, _, a_, b_) in enumerate(rows) if a_ and b_})
    L += [compare_row(v, c.title, a_, b_, diffs.get(i), c.digits) for i, (v, c, a_, b_) in enumerate(rows)]
    points = [p for p in ta.points if p in tb.points]
    if len(points) > 1:
        L += ["", "Over training (mean over seeds at each point; A / B):", "",
              "| variant | metric | " + " | ".join(p or "end" for p in points) + " |",
              "|---|---|" + "---|" * len(points)]
        for v in variants:
            for c in cols:
                means = [[summarize([x for _, x in t.curves.get((v, c.key), {}).get(p, [])]) for t in (ta, tb)]
                         for p in points]
                cells = [" / ".join("—" if s is None else f"{s.mean:.{c.digits}f}" for s in xy) for xy in means]
                if any(s != "— / —" for s in cells):
                    L.append(f"| {v} | {c.title} | " + " | ".join(cells) + " |")
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m study.compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="study folder A (runs/study/<name>)")
    ap.add_argument("b", help="study folder B")
    ap.add_argument("--labels", default="A,B", help="names of the two conditions, comma-separated")
    ap.add_argument("--out", default="", help="also write the markdown here")
    args = ap.parse_args(argv)
    labels = tuple(x.strip() for x in args.labels.split(","))
    if len(labels) != 2 or not all(labels):
        ap.error(f"--labels {args.labels!r}: expected two names, e.g. 'p = 0,p = 1'")
    try:
        md = markdown(load_table(Path(args.a)), load_table(Path(args.b)), labels)
    except (FileNotFoundError, ValueError, KeyError) as e:
        print(f"study.compare error: {e}", file=sys.stderr)
        return 2
    if args.out:
        with atomic_write(Path(args.out), "w") as f:
            f.write(md)
    print(md, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
