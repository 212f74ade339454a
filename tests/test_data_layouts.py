"""Every layout on generated miniature datasets (no ../shared needed): values, counts, boxes, DataModules."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from datamodules import build_dataset
from helpers import miniature as mini


def test_voc_and_voc_aug(tmp_path):
    gt = mini.write_voc(tmp_path)
    tr, va = build_dataset("voc", tmp_path, "train"), build_dataset("voc", tmp_path, "val")
    assert [len(tr), len(va)] == [2, 2]
    for ds in (tr, va):
        for i in range(len(ds)):
            item = ds[i]
            assert np.array_equal(item["mask"].numpy(), gt[ds.samples[i]["id"]])
            assert item["image"].dtype == torch.uint8 and item["image"].shape == (3, mini.H, mini.W)
    aug = build_dataset("voc_aug", tmp_path, "train")  # DeepLab-style '/JPEGImages/x.jpg /...png' lines
    assert [s["id"] for s in aug.samples] == ["2007_000001", "2007_000002", "aug_only"]
    assert np.array_equal(aug[2]["mask"].numpy(), gt["aug_only"])
    assert len(build_dataset("voc_aug", tmp_path, "val")) == 2


def test_voc_boxes_one_based_to_edges(tmp_path):
    mini.write_voc(tmp_path)
    item = build_dataset("voc", tmp_path, "train", boxes=True)[0]
    # XML (5, 4, 20, 30) is 1-based inclusive: columns 4..19, rows 3..29 -> edges (4, 3, 20, 30)
    assert item["boxes"].tolist() == [[4, 3, 20, 30], [0, 0, mini.W, mini.H]]
    assert item["box_labels"].tolist() == [12, 15]  # dog, person in the mmseg VOC class list
    assert item["box_difficult"].tolist() == [False, True]


def test_voc_detection_image_set(tmp_path):
    mini.write_voc(tmp_path)
    main = tmp_path / "VOCdevkit/VOC2012/ImageSets/Main"
    main.mkdir(parents=True)
    (main / "trainval.txt").write_text("2007_000001\n2007_000003\n")
    ds = build_dataset("voc", tmp_path / "VOCdevkit", "trainval", image_set="Main")  # root = VOCdevkit works too
    assert len(ds) == 2 and "mask" not in ds[0] and ds[1]["boxes"].shape == (2, 4)


def test_ade20k_reduce_zero_label(tmp_path):
    gt = mini.write_ade20k(tmp_path)
    ds = build_dataset("ade20k", tmp_path, "val")
    assert len(ds) == 2 and len(build_dataset("ade20k", tmp_path, "training")) == 2
    raw = gt["ADE_val_00000001"]
    m = ds[0]["mask"].numpy()
    assert m[0, :3].tolist() == [255, 0, 149]  # raw 0, 1, 150
    assert np.array_equal(m[raw > 0], raw[raw > 0].astype(np.int64) - 1)
    assert (m[raw == 0] == 255).all()


@pytest.mark.parametrize("with_train_ids", [True, False])
def test_cityscapes_train_ids_or_mapped_label_ids(tmp_path, with_train_ids):
    gt = mini.write_cityscapes(tmp_path, with_train_ids=with_train_ids)
    ds = build_dataset("cityscapes", tmp_path, "train")
    assert len(ds) == 2 and len(build_dataset("cityscapes", tmp_path, "val")) == 1
    assert ds.samples[0]["kind"] == ("trainids" if with_train_ids else "ids")
    for i in range(2):
        assert np.array_equal(ds[i]["mask"].numpy(), gt[f"train/aachen_{i:06d}_000019"])


def test_cityscapes_id_table_hand_checked():
    from datamodules.datasets.cityscapes import labelids_to_trainids
    ids = np.array([[7, 8, 11, 12, 13, 17, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 31, 32, 33],
                    [0, 1, 4, 6, 9, 10, 14, 15, 16, 18, 29, 30, 255, 0, 0, 0, 0, 0, 0]], np.uint8)
    out = labelids_to_trainids(ids)
    assert out[0].tolist() == list(range(19))
    assert (out[1] == 255).all()


def test_nyu_mmseg_and_bts_layouts(tmp_path):
    gt = mini.write_nyu_mmseg(tmp_path / "mm")
    ds = build_dataset("nyu", tmp_path / "mm", "val")  # 'val' is an alias of the Eigen 'test' split
    assert ds.split == "test" and ds.layout == "mmseg" and len(ds) == 2
    np.testing.assert_allclose(ds[0]["depth"].numpy(), gt["kitchen_0000_test"])
    assert float(ds[0]["depth"][0, 0]) == 0.0
    gt = mini.write_nyu_bts(tmp_path / "bts")
    ds = build_dataset("nyuv2", tmp_path / "bts", "test")
    assert ds.layout == "bts" and len(ds) == 2
    np.testing.assert_allclose(ds[1]["depth"].numpy(), gt["bathroom/rgb_00001.jpg"])
    assert ds[1]["focal"] == pytest.approx(518.8579)


def test_sunrgbd_rotation_round_trip(tmp_path):
    gt = mini.write_sunrgbd(tmp_path)
    ds = build_dataset("sunrgbd", tmp_path, "test")
    assert len(ds) == 2
    for i, rec in enumerate(ds.samples):
        key = str(rec["image"].relative_to(tmp_path))
        np.testing.assert_allclose(ds[i]["depth"].numpy(), gt[key], rtol=1e-6)
    # hand-worked: 1234 mm = 0b10011010010 is stored rotated left by 3 = 9872
    from datamodules.datasets.sunrgbd import decode_sunrgbd_depth
    assert mini.sunrgbd_encode(np.array([1234]))[0] == 9872
    assert decode_sunrgbd_depth(np.array([9872], np.uint16))[0] == pytest.approx(1.234)


def test_kitti_none_lines_and_train_val_gt_folders(tmp_path):
    gt = mini.write_kitti(tmp_path)
    ds = build_dataset("kitti", tmp_path, "test")
    assert (ds.num_lines, ds.num_without_gt, len(ds)) == (3, 1, 2)
    assert "depth/train" in str(ds.samples[0]["depth"]) and "depth/val" in str(ds.samples[1]["depth"])
    for i, rec in enumerate(ds.samples):  # KB crop of 375x1242: rows 23:375, cols 13:1229
        np.testing.assert_allclose(ds[i]["depth"].numpy(), gt[str(rec["image"].relative_to(tmp_path / "raw"))][23:, 13:1229])
        assert ds[i]["image"].shape == (3, 352, 1216)


def test_imagenet_boxes_from_xml_folder_and_loc_csv(tmp_path):
    mini.write_imagenet(tmp_path)
    ds = build_dataset("imagenet", tmp_path, "val")
    assert len(ds) == 4 and ds.classes == ("n01440764", "n01443537")
    assert [ds[i]["label"] for i in range(4)] == [0, 0, 1, 1]
    stem = ds.image_path(ds.samples[2]).stem
    (tmp_path / "xml").mkdir()
    (tmp_path / "xml" / f"{stem}.xml").write_text(
        "<annotation><size><width>40</width><height>32</height></size><object><name>n01443537</name>"
        "<bndbox><xmin>3</xmin><ymin>4</ymin><xmax>30</xmax><ymax>50</ymax></bndbox></object></annotation>")
    with_xml = build_dataset("imagenet", tmp_path, "val", boxes=tmp_path / "xml")
    assert with_xml[2]["boxes"].tolist() == [[3, 4, 30, 32]]  # ymax clipped to the image height
    assert with_xml[2]["box_labels"].tolist() == [1]
    assert with_xml[0]["boxes"].shape == (0, 4)
    (tmp_path / "LOC_val_solution.csv").write_text(
        f"ImageId,PredictionString\n{stem},n01443537 1 2 10 20 n01440764 5 6 7 8 \n")
    auto = build_dataset("imagenet", tmp_path, "val", boxes="auto")
    assert auto[2]["boxes"].tolist() == [[1, 2, 10, 20], [5, 6, 7, 8]]
    assert auto[2]["box_labels"].tolist() == [1, 0]


def test_demo_names_use_the_real_loaders(tmp_path, monkeypatch):
    mini.write_voc(tmp_path)
    mini.write_imagenet(tmp_path / "imagefolder")
    mini.write_nyu_mmseg(tmp_path / "nyu")
    assert len(build_dataset("demo_voc", tmp_path, "val")) == 2
    assert len(build_dataset("demo_cls", tmp_path, "train")) == 6
    assert build_dataset("demo_nyu", str(tmp_path), "val").split == "test"
    import tokenmix.paths
    monkeypatch.setattr(tokenmix.paths, "DEMO_ROOT", tmp_path)
    assert len(build_dataset("demo_voc", "", "train")) == 2  # '' = not given -> data/demo


def test_datamodules_give_the_probe_views(tmp_path):
    from datamodules.classification import ClassificationDataModule
    from datamodules.depth import DepthDataModule
    from datamodules.segmentation import SegmentationDataModule
    mini.write_voc(tmp_path / "voc")
    mini.write_nyu_mmseg(tmp_path / "nyu")
    mini.write_imagenet(tmp_path / "in")
    seg = SegmentationDataModule("voc", str(tmp_path / "voc"), img_size=30, patch_size=8, batch_size=2)
    b = next(iter(seg.train_dataloader()))  # 30 -> 24 (patch multiple); training masks follow the image
    assert b["image"].shape == (2, 3, 24, 24) and b["mask"].shape == (2, 24, 24) and b["image"].dtype == torch.uint8
    assert sorted(b["index"].tolist()) == [0, 1]
    v = next(iter(seg.val_dataloader()))
    assert v["image"].shape == (2, 3, 24, 24) and v["mask"].shape == (2, mini.H, mini.W)  # mask at label size
    assert v["index"].tolist() == [0, 1] and seg.num_classes == 21
    dep = DepthDataModule("nyuv2", str(tmp_path / "nyu"), img_size=(16, 24), patch_size=8, batch_size=2)
    b = next(iter(dep.train_dataloader()))
    assert b["image"].shape == (2, 3, 16, 24) and b["depth"].shape == (2, 16, 24)
    v = next(iter(dep.val_dataloader()))
    assert dep.val_set.split == "test" and v["depth"].shape == (2, mini.H, mini.W)
    d, (H, W) = v["depth"], (mini.H, mini.W)  # NYU: the Eigen crop (45:471, 41:601 of 480x640, as fractions here)
    eigen = torch.zeros(H, W, dtype=torch.bool)
    eigen[int(45 / 480 * H):int(471 / 480 * H), int(41 / 640 * W):int(601 / 640 * W)] = True
    assert torch.equal(dep.eval_mask(d), eigen & (d > 1e-3) & (d < 10.0))  # the validation set's own protocol
    cls = ClassificationDataModule("imagenet", str(tmp_path / "in"), img_size=32, patch_size=8, batch_size=3,
                                   max_samples=3)
    b = next(iter(cls.train_dataloader()))
    assert b["image"].shape == (3, 3, 32, 32) and b["label"].dtype == torch.int64
    assert cls.num_classes == 2 and len(cls.train_set) == 3
    assert sorted(cls.train_set[i]["label"] for i in range(3)) == [0, 0, 1]  # evenly spaced: both classes stay


def test_shard_sampler_splits_without_padding_and_shuffles_like_random_sampler():
    from torch.utils.data import RandomSampler

    from datamodules.datamodule_base import ShardSampler
    ds = list(range(7))
    train = [list(ShardSampler(ds, r, 2, train=True)) for r in range(2)]
    val = [list(ShardSampler(ds, r, 2, train=False)) for r in range(2)]
    assert val == [[0, 2, 4, 6], [1, 3, 5]]                       # every sample once, none padded
    assert [sorted(t) for t in train] == [[0, 2, 4], [1, 3, 5]]   # equal lengths: the 7th rests this epoch
    torch.manual_seed(5)
    ours = list(ShardSampler(ds, 0, 1, train=True))
    torch.manual_seed(5)
    assert ours == list(RandomSampler(ds))  # one process: torch's RandomSampler order, same RNG use
