"""analysis.training_curves: the curves read back from a run's TensorBoard scalars, the peak and the peak → end
drop per measure, and the 'declined' verdict against a calibration noise band, all checked by hand."""
import json

import pytest
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
        "dense_mIoU": {"noise": {"half_width": 3.0}}, "diffusion_cls_patch_cosine": {"noise": {"half_width": 0.08}},
        "knn_top1": {"noise": {"half_width": 1.0}}}}}))
    assert main([str(run), "--labels", "x", "--band-json", str(band), "--out", str(tmp_path / "c.png")]) == 0
    md = capsys.readouterr().out
    assert "| x | ridge seg. mIoU (%) | 20 | 27 (200) | 23 | -4 | yes (band 3) |" in md  # 4 > 3
    assert "| x | cos(patch, [CLS]) ↓ | 0.2 | 0.1 (300) | 0.15 | -0.05 | no (band 0.08) |" in md  # 0.05 < 0.08
    assert "| x | k-NN top-1 (%) | 80 | 86 (600) | 86 | +0 | no (band 1) |" in md
    assert (tmp_path / "c.png").stat().st_size > 1000 and (tmp_path / "c.md").read_text() == md


def test_a_folder_without_events_is_a_clear_error(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "no TensorBoard event file" in capsys.readouterr().err
