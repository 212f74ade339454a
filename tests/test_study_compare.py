"""study.compare: Δ = B − A per variant and metric with the study's Welch rule, checked by hand (the reading of
real study folders is exercised by test_study_e2e)."""
import math

import pytest

from study.compare import compare_row, main
from study.stats import summarize


def test_rows_by_hand():
    # A: 10, 12, 14 (mean 12, sd 2, se 2/√3); B: 4, 6, 8 (mean 6, same se); se_Δ = √2·2/√3 = 1.633; |Δ| = 6 > 3.27
    a, b = summarize([10.0, 12.0, 14.0]), summarize([4.0, 6.0, 8.0])
    assert math.sqrt(2) * 2 / math.sqrt(3) == pytest.approx(1.63299, abs=1e-5)
    assert compare_row("softmax", "PiB", a, b, 2) == \
        "| softmax | PiB | 12.00 ± 2.00 (n=3) | 6.00 ± 2.00 (n=3) | -6.00 ± 1.63 | outside |"
    # A: 0, 0, 3 (mean 1, sd √3, se 1); B: 1, 2, 3 (mean 2, se 1/√3); se_Δ = √(4/3) = 1.155; Δ = 1 < 2.31: inside
    row = compare_row("lastvit", "top-1", summarize([0.0, 0.0, 3.0]), summarize([1.0, 2.0, 3.0]), 3)
    assert row.endswith("| +1.000 ± 1.155 | inside |")
    # one seed on a side: no se, no verdict; a side missing: no Δ
    assert compare_row("v", "m", summarize([1.0]), b, 1).endswith("| +5.0 ± n/a | undecided |")
    assert compare_row("v", "m", None, b, 1).endswith("| — | — |")


def test_missing_study_folder_is_a_clear_error(tmp_path, capsys):
    assert main([str(tmp_path / "nope"), str(tmp_path)]) == 2
    assert "no plan.json" in capsys.readouterr().err
