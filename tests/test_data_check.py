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


# --------------------------------------------------------------------------- refusals
# Every way `make probe` refuses a split (the DatasetError raises of custom_seg / custom_depth / folder /
# imagefolder and the real layouts) is, through check-data, a problem: listed, counted, exit 1. Only a split
# whose folders do not exist at all stays a note ("absent"), and not with --require-all.

def _seg(fix, tmp):
    from test_own_data import make_custom_seg
    return make_custom_seg(fix, tmp / "seg")


def _depth(fix, tmp):
    from test_own_data import make_nyu_pair
    return make_nyu_pair(fix, tmp / "nyu", tmp / "custom")[1]


def _copy(fix, tmp, sub):
    import shutil
    return Path(shutil.copytree(fix / sub, tmp / sub))


def _rm(p: Path):
    import shutil
    shutil.rmtree(p) if p.is_dir() else p.unlink()


def _imagefolder(fix, tmp):
    root = tmp / "if"
    for split in ("train", "val"):
        for k, p in enumerate(sorted((fix / "imagenet_samples").glob("*.JPEG"))[:4]):
            (root / split / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
            Image.open(p).save(root / split / f"c{k % 2}" / p.name)
    return root


def _folder(fix, tmp):
    root = tmp / "fold"
    root.mkdir()
    for p in sorted((fix / "imagenet_samples").glob("*.JPEG"))[:3]:
        Image.open(p).save(root / p.name)
    return root


def _unpair(root, tgt):  # move one target away: its image has no target
    p = next(iter(sorted((root / tgt / "train").iterdir())))
    p.rename(root / p.name)


REFUSALS = {  # id: (task, build(fixtures, tmp) -> root, break(root), extra args, text of the refusal)
    "seg_image_without_label": ("custom_seg", _seg, lambda r: _unpair(r, "ann_dir"), [], "without their label map"),
    "seg_label_without_image": ("custom_seg", _seg, lambda r: sorted((r / "img_dir" / "train").iterdir())[-1].unlink(), [],
                                "without their image"),
    "seg_no_images": ("custom_seg", _seg, lambda r: [p.unlink() for p in (r / "img_dir" / "train").iterdir()], [],
                      "no images found"),
    "seg_no_class_list": ("custom_seg", _seg, lambda r: (r / "classes.txt").unlink(), [], "no class list"),
    "seg_half_a_split": ("custom_seg", _seg, lambda r: _rm(r / "ann_dir" / "val"), [], "ann_dir/val is missing"),
    "depth_image_without_depth": ("custom_depth", _depth, lambda r: _unpair(r, "depth_dir"), [],
                                  "without their depth map"),
    "depth_bad_metainfo": ("custom_depth", _depth, lambda r: (r / "metainfo.yaml").write_text("depth_scale: -1\n"),
                           [], "need depth_scale > 0"),
    "depth_bad_crop": ("custom_depth", _depth, lambda r: (r / "metainfo.yaml").write_text("eval_crop: nope\n"), [],
                       "eval_crop 'nope'"),
    "imagefolder_unknown_class": ("imagefolder", _imagefolder, lambda r: (r / "val" / "c1").rename(r / "val" / "c9"),
                                  [], "has no counterpart"),
    "imagefolder_flat_split": ("imagefolder", _imagefolder, lambda r: [p.rename(r / "val" / p.name) for p in
                                                                      (r / "val" / "c1").iterdir()] and _rm(r / "val" / "c0"),
                               [], "holds images directly"),
    "folder_empty": ("folder", _folder, lambda r: [p.unlink() for p in r.iterdir()], [], "no images found"),
    "voc_empty_split_list": ("voc", lambda f, t: _copy(f, t, "voc"), lambda r: (
        r / "VOCdevkit/VOC2012/ImageSets/Segmentation/val.txt").write_text(""), [], "val.txt"),
    "voc_no_jpegs": ("voc", lambda f, t: _copy(f, t, "voc"), lambda r: _rm(r / "VOCdevkit/VOC2012/JPEGImages"), [],
                     "JPEGImages"),
    "ade20k_images_without_annotations": ("ade20k", lambda f, t: _copy(f, t, "ade20k"), lambda r: _rm(
        r / "ADEChallengeData2016/annotations/validation"), [], "annotations/validation is missing"),
    "cityscapes_images_without_labels": ("cityscapes", lambda f, t: _copy(f, t, "cityscapes"), lambda r: _rm(
        r / "gtFine/val"), [], "gtFine/val is missing"),
    "imagenet_flat_val": ("imagenet", lambda f, t: _copy(f, t, "imagenet"), lambda r: [
        p.rename(r / "val" / p.name) for d in list((r / "val").iterdir()) for p in list(d.iterdir())], [],
        "holds images directly"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_every_refusal_is_a_problem(case, fixtures_root, tmp_path, capsys):
    task, build, breaks, extra, why = REFUSALS[case]
    root = build(fixtures_root, tmp_path)
    assert main(["--task", task, "--data-root", str(root), "--no-progress", *extra]) == 0, capsys.readouterr().out
    capsys.readouterr()
    breaks(root)
    assert main(["--task", task, "--data-root", str(root), "--no-progress", *extra]) == 1
    out = capsys.readouterr().out
    assert why in out and "refused" in out and "FAILED" in out, out
    assert "OK:" not in out


def test_an_absent_split_is_a_note_unless_required(fixtures_root, tmp_path, capsys):
    root = _seg(fixtures_root, tmp_path)
    for sub in ("img_dir", "ann_dir"):
        _rm(root / sub / "val")  # a partial copy: the val split does not exist at all
    assert main(["--task", "custom_seg", "--data-root", str(root), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "absent" in out and "split 'val' not checked" in out and "OK: 0 problem(s)" in out
    assert main(["--task", "custom_seg", "--data-root", str(root), "--no-progress", "--require-all"]) == 1
    assert "FAILED: 1 problem(s)" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_make_check_data_exits_nonzero_on_an_image_without_its_label_map(fixtures_root, tmp_path):
    root = _seg(fixtures_root, tmp_path)
    _unpair(root, "ann_dir")
    r = procs.run(["make", "check-data", "TASK=custom_seg", f"DATA_ROOT={root}"], cwd=REPO, timeout=240,
                  env={"COLUMNS": "250", "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"})
    assert r.returncode != 0, r.stdout
    assert "without their label map" in r.stdout and "FAILED: 1 problem(s)" in r.stdout
