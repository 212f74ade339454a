"""`python -m datamodules.check`: exit 0 on good data, non-zero plus the offending files on bad data."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers import procs
from helpers import miniature as mini
from datamodules.check import main

FIX = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "real"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")


@pytest.mark.skipif(not FIX.is_dir(), reason="../shared/fixtures/real not present")
@pytest.mark.parametrize("task,sub", [("voc", "voc"), ("ade20k", "ade20k"), ("cityscapes", "cityscapes"),
                                      ("nyuv2", "nyu"), ("sunrgbd", "sunrgbd"), ("kitti", "kitti"),
                                      ("imagenet", "imagenet")])
def test_fixtures_pass(task, sub, capsys):
    assert main(["--task", task, "--data-root", str(FIX / sub), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "OK: 0 problem(s)" in out


def test_miniature_good_then_bad(tmp_path, capsys):
    mini.write_voc(tmp_path)
    assert main(["--task", "voc_aug", "--data-root", str(tmp_path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "10582" in out and "1449" in out  # official counts printed next to the found ones
    voc = tmp_path / "VOCdevkit/VOC2012"
    (voc / "JPEGImages/2007_000002.jpg").write_bytes(b"\xff\xd8garbage")
    m = np.asarray(Image.open(voc / "SegmentationClassAug/aug_only.png")).copy()
    m[0, 0] = 99
    Image.fromarray(m).save(voc / "SegmentationClassAug/aug_only.png")
    (voc / "SegmentationClass/2007_000004.png").unlink()
    assert main(["--task", "voc_aug", "--data-root", str(tmp_path), "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "FAILED: 3 problem(s)" in out
    assert str(voc / "JPEGImages/2007_000002.jpg") in out  # corrupt
    assert "aug_only.png: label map holds class ids [99]" in out  # out of range
    assert "2007_000004.png: label map file is missing" in out  # missing


def test_depth_all_invalid_is_reported(tmp_path, capsys):
    mini.write_kitti(tmp_path)
    p = next((tmp_path / "depth/val").rglob("*.png"))
    Image.fromarray(np.zeros(mini.KITTI_HW, np.uint16)).save(p)
    assert main(["--task", "kitti", "--data-root", str(tmp_path), "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "(3 lines, 1 without ground truth)" in out and "no depth value inside (0.001, 80.0)" in out


@pytest.mark.slow
def test_cli_entry_point_missing_root():
    r = procs.run([sys.executable, "-m", "datamodules.check", "--task", "ade20k", "--data-root", "",
                   "--no-progress"], cwd=REPO, timeout=120, env={"COLUMNS": "250", "PATH": ""})
    assert r.returncode == 1
    assert "DATA_ROOT is not set for dataset 'ade20k'" in r.stdout
