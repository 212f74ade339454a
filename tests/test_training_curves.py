"""analysis.training_curves: the curves read back from a run's TensorBoard scalars, the peak and the peak → end
drop per measure, and the 'declined' verdict against a calibration noise band, all checked by hand."""
import json
import math

import pytest
from scipy import stats as st
from torch.utils.tensorboard import SummaryWriter

from analysis.training_curves import main, read_curves


def _run(folder, scalars):
    w = SummaryWriter(str(folder))
    for tag, pts in scalars.items():
        for step, v in pts:
            w.add_scalar(tag, v, step)
    w.close()
    return folder


def test_peak_drop_and_verdict_by_hand(tmp_path, capsys):
    run = _run(tmp_path / "r", {"knn/top1_random_init": [(0, 80.0), (600, 80.0)],
                                "knn/top1": [(300, 84.0), (600, 86.0)],
                                "dense_mIoU": [(0, 20.0), (200, 27.0), (400, 26.0), (600, 23.0)],
                                "diffusion_cls_patch_cosine": [(0, 0.2), (300, 0.1), (600, 0.15)]})
    c = read_curves(run)
    assert c["knn/top1"].steps == (0, 300, 600) and c["knn/top1"].values == (80.0, 84.0, 86.0)  # start = random init
    assert c["dense_mIoU"].peak(False) == (200, 27.0) and c["dense_mIoU"].drop(False) == pytest.approx(4.0)
    assert c["diffusion_cls_patch_cosine"].peak(True) == (300, pytest.approx(0.1))  # ↓ measure: its best is its lowest
    assert c["diffusion_cls_patch_cosine"].drop(True) == pytest.approx(0.05)
    band = tmp_path / "cal.json"
    band.write_text(json.dumps({"metrics": {"measures": {
        "dense_mIoU": {"noise": {"sd": 0.5, "replicates": 10}},
        "diffusion_cls_patch_cosine": {"noise": {"sd": 0.04, "replicates": 5}},
        "knn_top1": {"noise": {"sd": 0.5, "replicates": 5}}, "diffusion_pib_cls": {"noise": {"sd": None, "replicates": 1}}}}}))
    assert main([str(run), "--labels", "x", "--band-json", str(band), "--out", str(tmp_path / "c.png")]) == 0
    md = capsys.readouterr().out
    # a drop is the difference of two evaluations, each with noise sd: t = drop / (sd·√2), one-sided, replicates - 1 df
    p = [st.t.sf(4.0 / (0.5 * math.sqrt(2)), 9), st.t.sf(0.05 / (0.04 * math.sqrt(2)), 4), 0.5]  # ridge, cos, k-NN
    q = st.false_discovery_control(p, method="bh")  # adjusted over the table's three tested rows
    assert p[0] < 0.001 and q[1] > 0.05
    assert f"| x | ridge seg. mIoU (%) | 20 | 27 (200) | 23 | -4 | yes (p = {p[0]:.2g}, adj. {q[0]:.2g}; sd 0.5) |" in md
    assert f"| x | cos(patch, [CLS]) ↓ | 0.2 | 0.1 (300) | 0.15 | -0.05 | no (p = {p[1]:.2g}, adj. {q[1]:.2g}; " in md
    assert "| x | k-NN top-1 (%) | 80 | 86 (600) | 86 | +0 | no (p = 0.5, adj. 0.5; sd 0.5) |" in md
    assert (tmp_path / "c.png").stat().st_size > 1000 and (tmp_path / "c.md").read_text() == md


def test_a_folder_without_events_is_a_clear_error(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "no TensorBoard event file" in capsys.readouterr().err
