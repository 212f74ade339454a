"""VOC 2007 (``voc07``): CorLoc's VOC07 trainval, read from VOCdevkit/VOC2007 with its own split counts."""
import shutil

import pytest

from analysis.data import iter_samples, open_dataset
from datamodules import build_dataset


@pytest.fixture
def voc_both_years(fixtures_root, tmp_path):
    """The real-format VOC2012 fixture, plus a VOC2007 copy holding only two of its images in Main/trainval."""
    src = fixtures_root / "voc" / "VOCdevkit" / "VOC2012"
    shutil.copytree(src, tmp_path / "VOCdevkit" / "VOC2012")
    v07 = tmp_path / "VOCdevkit" / "VOC2007"
    shutil.copytree(src, v07)
    ids = (src / "ImageSets" / "Segmentation" / "trainval.txt").read_text().split()
    (v07 / "ImageSets" / "Main").mkdir(parents=True)
    (v07 / "ImageSets" / "Main" / "trainval.txt").write_text("\n".join(ids[:2]) + "\n")
    return tmp_path, ids


def test_voc07_reads_voc2007_main_lists_with_boxes(voc_both_years):
    root, ids = voc_both_years
    ds = build_dataset("voc07", root, "trainval", image_set="Main")
    assert ds.year == "2007" and ds.voc.name == "VOC2007" and len(ds) == 2
    assert ds.OFFICIAL_COUNTS == {"trainval": 5011}  # VOC07 detection trainval, not VOC12's 11,540
    assert "VOC2007" in ds[0]["path"] and ds[0]["boxes"].shape[1] == 4 and "mask" not in ds[0]
    assert build_dataset("voc2007", root, "trainval", image_set="Main").year == "2007"  # alias
    # what `make analyze TASK=corloc DATA=voc07` opens: boxes from VOC2007/Annotations
    samples = list(iter_samples(open_dataset("voc07", str(root), "trainval", boxes=True, image_set="Main")))
    assert [s.path.split("/")[-1][:-4] for s in samples] == ids[:2] and all(s.boxes.shape[0] > 0 for s in samples)
    # the 2012 dataset in the same root stays VOC2012
    assert build_dataset("voc", root, "trainval").voc.name == "VOC2012"


def test_voc07_segmentation_counts(voc_both_years):
    root, ids = voc_both_years
    ds = build_dataset("voc07", root, "trainval")
    assert len(ds) == len(ids) and ds.OFFICIAL_COUNTS["trainval"] == 422 and "mask" in ds[0]
    assert build_dataset("voc", root, "val", year="2007").OFFICIAL_COUNTS == {"train": 209, "val": 213,
                                                                              "trainval": 422, "test": 210}
