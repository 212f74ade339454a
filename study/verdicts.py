"""How the study's reports word what ``tokenmix.stats`` computes: Δ [CI], p, verdicts, what a table can detect."""
from __future__ import annotations

from typing import Optional

from tokenmix.stats import (PAPER_EFFECTS as EFF, Difference, min_detectable, pooled_sd, probability_of_improvement,
                            seeds_needed)

NO_TEST = {"undecided": "undecided (< 2 seeds a side)", "tie": "identical on every seed: no test",
           "no spread": "no spread on either side: no test"}


def fmt_p(p: Optional[float]) -> str:
    return "—" if p is None else "< 0.001" if p < 0.001 else f"{p:.2g}"


def fmt_diff(d: Optional[Difference], digits: int) -> str:
    """'+2.03 [-0.90, +5.00], p = 0.09 (adj. 0.31), Welch': Δ, its 95 % CI, p, adjusted p and the row's test."""
    if d is None or d.p is None:
        return "—" if d is None else f"{d.delta:+.{digits}f}, {NO_TEST[d.test]}"
    lo, hi = d.ci
    return (f"{d.delta:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}], p = {fmt_p(d.p)} "
            f"(adj. {fmt_p(d.p_adj)}), {d.test}")


def verdict(variant: str, baseline: str, col, d: Difference) -> str:
    """'entmax vs softmax: Δ = +1.20 [...], p = 0.01 (adj. 0.03), paired: significant, entmax better; ...'."""
    head = f"{variant} vs {baseline}: Δ = {fmt_diff(d, col.digits)}"
    if d.p is None:
        return head
    better = (d.delta < 0) if col.lower_is_better else (d.delta > 0)
    word = f"significant: {variant} {'better' if better else 'worse'}" if d.significant else "not significant"
    return f"{head}: {word}; detectable at these seeds: |Δ| ≥ {d.mde:.{col.digits}f}"


def detectable(key: str, sd: Optional[float], n: int) -> tuple[Optional[float], Optional[float], str]:
    """A metric at seed sd ``sd`` with ``n`` seeds a side: the smallest detectable Δ, the papers' effect (None when
    the papers give none) and the seeds a side that effect needs ('—' without one)."""
    eff = EFF.get(key)
    return min_detectable(sd, n, n), eff, "—" if eff is None else str(seeds_needed(eff, sd) or "> 10000")


def power_lines(spec, t) -> list[str]:
    """Per metric: the pooled seed sd, the smallest Δ the study's seeds detect, the seeds the papers' effect needs;
    then the probability of improvement across the dense tasks."""
    n = len(spec.seeds)
    L = ["## What this table can detect", "", f"Two-sided t-test, α = 0.05, power 0.8 (noncentral t), {n} seeds a "
         "side, sd pooled over the variants. Papers' effects: docs/REFERENCE.md.", "",
         "| metric | seed sd | smallest detectable Δ | papers' effect | seeds a side for it |", "|---|---|---|---|---|"]
    for c in [c for c in t.columns if c.delta]:
        sd = pooled_sd([(s.n, s.std) for (v, k), s in t.summaries.items() if k == c.key and v in t.variants])
        mde, eff, needed = detectable(c.key, sd, n)
        L += [f"| {c.title} | {sd:.3g} | {mde:.{c.digits}f} | {'—' if eff is None else f'{eff:+g}'} | {needed} |"] \
            if mde else []
    dense = [c for c in t.columns if c.key.endswith(("_miou", "_rmse")) and c.delta]  # one metric per dense task
    signed = lambda v: [[-x if c.lower_is_better else x for _, x, _ in t.values.get((v, c.key), [])] for c in dense]
    poi = {v: probability_of_improvement(signed(v), signed(t.baseline)) for v in t.variants if v != t.baseline}
    rows = [f"- {v}: {r[0]:.2f} [{r[1]:.2f}, {r[2]:.2f}]" for v, r in poi.items() if r]
    return L + ["", f"Probability of improvement over {t.baseline} across the dense tasks ({', '.join(c.title for c in dense)}"
                "; rliable: P(X > Y) + ½ P(X = Y) over seed pairs, averaged over the tasks with 2 or more seeds a side; "
                "95 % CI: stratified percentile bootstrap, 2000 resamples):", ""] * bool(rows) + rows + [""]
