"""Bad input -> a specific error naming the file, what was expected and how to fix it (never a wrong number)."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from datamodules import build_dataset
from helpers import miniature as mini
from datamodules.errors import (CorruptFileError, DatasetError, DepthFormatError, EmptyDatasetError,
                                LabelRangeError, MissingDataError, SizeMismatchError, SplitFileError,
                                UnknownDatasetError)

VOC = "VOCdevkit/VOC2012"


def _truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_truncated_image(tmp_path):
    mini.write_voc(tmp_path)
    bad = tmp_path / VOC / "JPEGImages/2007_000001.jpg"
    _truncate(bad)
    ds = build_dataset("voc", tmp_path, "train")
    with pytest.raises(CorruptFileError, match="truncated or corrupt") as e:
        ds[0]
    assert str(bad) in str(e.value) and "skip_corrupt=True" in str(e.value) and e.value.path == str(bad)


def test_garbage_image_and_skip_corrupt_counts(tmp_path):
    mini.write_voc(tmp_path)
    (tmp_path / VOC / "JPEGImages/2007_000001.jpg").write_bytes(b"not an image at all")
    ds = build_dataset("voc", tmp_path, "train", skip_corrupt=True)
    item = ds[0]  # skipped: the next sample comes back
    assert item["path"].endswith("2007_000002.jpg")
    assert ds.num_skipped == 1 and list(ds.skipped)[0].endswith("2007_000001.jpg")
    assert "cannot decode image" in list(ds.skipped.values())[0]
    assert ds[1]["path"].endswith("2007_000002.jpg") and ds.num_skipped == 1
    ds[0]  # the same file again (next epoch) is not counted twice
    assert ds.num_skipped == 1
    (tmp_path / VOC / "JPEGImages/2007_000002.jpg").write_bytes(b"")
    with pytest.raises(EmptyDatasetError, match="every one of its 2 samples is corrupt"):
        ds[0]


def test_missing_listed_file(tmp_path):
    mini.write_voc(tmp_path)
    (tmp_path / VOC / "SegmentationClass/2007_000003.png").unlink()
    with pytest.raises(CorruptFileError, match="label map file is missing") as e:
        build_dataset("voc", tmp_path, "val")[0]
    assert "2007_000003.png" in str(e.value)


def test_mask_labels_out_of_range(tmp_path):
    mini.write_voc(tmp_path)
    p = tmp_path / VOC / "SegmentationClass/2007_000001.png"
    m = np.asarray(Image.open(p)).copy()
    m[5, 5], m[6, 6] = 40, 254
    img = Image.fromarray(m, mode="P")
    img.putpalette(mini.voc_palette())
    img.save(p)
    with pytest.raises(LabelRangeError, match=r"class ids \[40, 254\] outside \[0, 20\]") as e:
        build_dataset("voc", tmp_path, "train")[0]
    assert str(p) in str(e.value)
    mini.write_ade20k(tmp_path / "ade")
    p = tmp_path / "ade/ADEChallengeData2016/annotations/validation/ADE_val_00000001.png"
    m = np.asarray(Image.open(p)).copy()
    m[0, 0] = 200
    Image.fromarray(m).save(p)
    with pytest.raises(LabelRangeError, match=r"\[200\] outside \[0, 150\].*raw ADE ids"):
        build_dataset("ade20k", tmp_path / "ade", "val")[0]


def test_cityscapes_label_ids_out_of_range(tmp_path):
    mini.write_cityscapes(tmp_path, with_train_ids=False)
    p = next((tmp_path / "gtFine/val/aachen").glob("*_labelIds.png"))
    m = np.asarray(Image.open(p)).copy()
    m[0, 0] = 40
    Image.fromarray(m).save(p)
    with pytest.raises(LabelRangeError, match=r"ids \[40\] outside the Cityscapes ids 0-33"):
        build_dataset("cityscapes", tmp_path, "val")[0]


def test_rgb_mask_rejected(tmp_path):
    mini.write_voc(tmp_path)
    p = tmp_path / VOC / "SegmentationClass/2007_000001.png"
    Image.open(p).convert("RGB").save(p)
    with pytest.raises(CorruptFileError, match="mode 'RGB', expected an 8-bit single-channel PNG"):
        build_dataset("voc", tmp_path, "train")[0]


def test_mask_and_image_of_different_sizes(tmp_path):
    mini.write_voc(tmp_path)
    p = tmp_path / VOC / "SegmentationClass/2007_000002.png"
    Image.open(p).resize((20, 16), Image.NEAREST).save(p)
    with pytest.raises(SizeMismatchError, match=r"mask is 20x16 \(WxH\) but its image .* is 40x32") as e:
        build_dataset("voc", tmp_path, "train")[1]
    assert str(p) in str(e.value)


def test_depth_of_the_wrong_dtype(tmp_path):
    mini.write_nyu_mmseg(tmp_path)
    p = tmp_path / "annotations/test/kitchen_0000_test.png"
    Image.fromarray((np.asarray(Image.open(p)) // 40).astype(np.uint8)).save(p)  # an 8-bit copy
    with pytest.raises(DepthFormatError, match="mode 'L' \\(8-bit\\), expected a 16-bit") as e:
        build_dataset("nyuv2", tmp_path, "test")[0]
    assert str(p) in str(e.value)


def test_missing_and_empty_split_files(tmp_path):
    mini.write_voc(tmp_path)
    (tmp_path / VOC / "ImageSets/Segmentation/val.txt").unlink()
    with pytest.raises(SplitFileError, match=r"val\.txt is missing"):
        build_dataset("voc", tmp_path, "val")
    (tmp_path / VOC / "ImageSets/Segmentation/train.txt").write_text("\n  \n")
    with pytest.raises(SplitFileError, match=r"train\.txt is empty"):
        build_dataset("voc", tmp_path, "train")
    mini.write_kitti(tmp_path / "kitti")
    (tmp_path / "kitti/splits/eigen_test_files_with_gt.txt").write_text("only_one_field.png\n")
    with pytest.raises(SplitFileError, match=r"eigen_test_files_with_gt\.txt:1: expected 'rgb_path depth_path"):
        build_dataset("kitti", tmp_path / "kitti", "test")
    with pytest.raises(SplitFileError, match="SUNRGBD_val_splits.txt is missing"):
        build_dataset("sunrgbd", tmp_path, "test")


def test_empty_dataset(tmp_path):
    (tmp_path / "train/n01440764").mkdir(parents=True)
    with pytest.raises(EmptyDatasetError, match="split 'train' .* has no samples"):
        build_dataset("imagenet", tmp_path, "train")
    Image.new("RGB", (8, 8)).save(tmp_path / "train/ILSVRC2012_val_00000001.JPEG")  # flat val, not sorted
    with pytest.raises(MissingDataError, match="holds images directly, not in <wnid>/ class folders"):
        build_dataset("imagenet", tmp_path, "train")
    (tmp_path / "ADEChallengeData2016/images/validation").mkdir(parents=True)
    (tmp_path / "ADEChallengeData2016/annotations/validation").mkdir(parents=True)
    with pytest.raises(EmptyDatasetError, match="ADEChallengeData2016/images"):
        build_dataset("ade20k", tmp_path, "val")


@pytest.mark.parametrize("name", ["imagenet", "voc", "ade20k", "cityscapes", "nyuv2", "sunrgbd", "kitti"])
def test_missing_data_root(tmp_path, name):
    with pytest.raises(MissingDataError, match="DATA_ROOT is not set") as e:
        build_dataset(name, "", "test" if name in ("sunrgbd", "kitti") else "val")
    assert "Expected layout" in str(e.value) and "Get it from" in str(e.value)
    with pytest.raises(MissingDataError, match=str(tmp_path / "nope")):
        build_dataset(name, tmp_path / "nope", "test" if name in ("sunrgbd", "kitti") else "val")


def test_layout_missing_under_root(tmp_path):
    with pytest.raises(MissingDataError, match="no VOCdevkit/VOC2012/JPEGImages") as e:
        build_dataset("voc", tmp_path, "train")
    assert "SegmentationClass" in str(e.value) and "host.robots.ox.ac.uk" in str(e.value)
    with pytest.raises(MissingDataError, match="leftImg8bit/train is missing"):
        build_dataset("cityscapes", tmp_path, "train")


def test_unknown_dataset_name_and_split():
    with pytest.raises(UnknownDatasetError, match="unknown dataset 'coco'; valid names: imagenet, voc, voc07, voc_aug"):
        build_dataset("coco", "/x", "train")
    assert issubclass(UnknownDatasetError, DatasetError) and issubclass(DatasetError, ValueError)
    with pytest.raises(ValueError, match="unknown split 'training', valid"):
        build_dataset("voc", "/tmp", "training")
