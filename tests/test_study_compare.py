"""study.compare: Δ = B − A per variant and metric, its test (paired by seed, else Welch), p adjusted over the table,
checked against scipy called here (the reading of real study folders is exercised by test_study_e2e)."""
from types import SimpleNamespace

import pytest
from scipy import stats as st

from study.compare import compare_row, main, markdown
from study.report import Table
from tokenmix.stats import compare, summarize

pytestmark = pytest.mark.timeout(60)


def test_rows_against_scipy():
    a, b = summarize([10.0, 12.0, 14.0]), summarize([4.0, 6.0, 8.0])
    d = compare(b, a)
    r = st.ttest_ind([4.0, 6.0, 8.0], [10.0, 12.0, 14.0], equal_var=False)
    lo, hi = r.confidence_interval()
    assert d.p == pytest.approx(r.pvalue, rel=1e-12)
    assert compare_row("softmax", "PiB", a, b, d, 2) == (f"| softmax | PiB | 12.00 ± 2.00 (n=3) | 6.00 ± 2.00 (n=3) | "
                                                         f"-6.00 [{lo:+.2f}, {hi:+.2f}], p = {r.pvalue:.2g} (adj. —), "
                                                         "Welch | no |")
    # one seed on a side: undecided; a side missing: no Δ
    assert compare_row("v", "m", summarize([1.0]), b, compare(b, summarize([1.0])), 1).endswith(
        "| +5.0, undecided (< 2 seeds a side) | — |")
    assert compare_row("v", "m", None, b, None, 1).endswith("| — | — |")


def _table(values):
    cols = [SimpleNamespace(key=k, title=k, digits=2) for k in ("m1", "m2", "m3")]
    t = Table(["softmax"], None, columns=cols, points=[""])
    t.summaries = {("softmax", k): summarize(v, [0, 1, 2]) for k, v in values.items()}
    return SimpleNamespace(name="s"), t


def test_table_pairs_by_seed_and_adjusts_over_its_rows():
    a = {"m1": [10.0, 12.0, 14.0], "m2": [1.0, 2.0, 3.0], "m3": [5.0, 5.0, 5.0]}
    b = {"m1": [11.0, 13.5, 14.9], "m2": [0.0, 2.5, 2.0], "m3": [5.0, 5.0, 5.0]}
    md = markdown(_table(a), _table(b), ("A", "B"))
    p = [st.ttest_rel(b[k], a[k]).pvalue for k in ("m1", "m2")]
    q = st.false_discovery_control(p, method="bh")
    for k, pk, qk in zip(("m1", "m2"), p, q):
        assert f"p = {pk:.2g} (adj. {qk:.2g}), paired | {'yes' if qk <= 0.05 else 'no'} |" in md
    assert "| softmax | m3 | 5.00 ± 0.00 (n=3) | 5.00 ± 0.00 (n=3) | +0.00, identical on every seed: no test | — |" in md
    assert "inside" not in md and "outside" not in md


def test_missing_study_folder_is_a_clear_error(tmp_path, capsys):
    assert main([str(tmp_path / "nope"), str(tmp_path)]) == 2
    assert "no plan.json" in capsys.readouterr().err
