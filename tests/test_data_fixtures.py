"""Loaders on the real-format fixtures (../shared/fixtures/real) against independent decodings of the raw files."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from datamodules import build_dataset

FIX = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "real"
pytestmark = pytest.mark.skipif(not FIX.is_dir(), reason="../shared/fixtures/real not present")


def pil_rgb(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def voc_colormap() -> dict[tuple, int]:
    """The devkit colour map written independently of the loader: bit k of the label goes to bit 7-k//3 of R/G/B."""
    cmap = {}
    for label in list(range(21)) + [255]:
        rgb = [0, 0, 0]
        for bit in range(8):
            for ch in range(3):
                if label >> (3 * bit + ch) & 1:
                    rgb[ch] |= 1 << (7 - bit)
        cmap[tuple(rgb)] = label
    return cmap


def test_voc_masks_equal_palette_colours_decoded_by_hand():
    ds = build_dataset("voc", FIX / "voc", "trainval")
    cmap = voc_colormap()
    assert len(ds) == 3
    for i in range(len(ds)):
        item = ds[i]
        stem = Path(item["path"]).stem
        colours = np.asarray(Image.open(ds.voc / "SegmentationClass" / f"{stem}.png").convert("RGB"))
        expected = np.vectorize(lambda r, g, b: cmap[(r, g, b)])(colours[..., 0], colours[..., 1], colours[..., 2])
        assert item["mask"].dtype == torch.int64
        assert np.array_equal(item["mask"].numpy(), expected)
        assert np.array_equal(item["image"].permute(1, 2, 0).numpy(), pil_rgb(item["path"]))
    assert {255, 15, 5} <= set(np.unique(ds[0]["mask"].numpy()).tolist())  # person, bottle, border


def test_voc_aug_masks_and_classes():
    voc = FIX / "voc" / "VOCdevkit" / "VOC2012"
    ds = build_dataset("voc_aug", FIX / "voc", "train", split_file=voc / "ImageSets/Segmentation/trainval.txt")
    for i in range(len(ds)):
        stem = Path(ds[i]["path"]).stem
        assert ds.samples[i]["mask"].parent.name == "SegmentationClassAug"
        palette_idx = np.asarray(Image.open(voc / "SegmentationClass" / f"{stem}.png"))
        assert np.array_equal(ds[i]["mask"].numpy(), palette_idx)
    assert ds.classes[15] == "person" and len(ds.classes) == 21  # from mmseg's PascalVOCDataset


def test_voc_boxes_are_zero_based_edges_of_the_object_masks():
    ds = build_dataset("voc", FIX / "voc", "trainval", boxes=True)
    for i in range(len(ds)):
        item = ds[i]
        stem = Path(item["path"]).stem
        inst = np.asarray(Image.open(ds.voc / "SegmentationObject" / f"{stem}.png"))
        cls = np.asarray(Image.open(ds.voc / "SegmentationClass" / f"{stem}.png"))
        ids = [k for k in np.unique(inst) if k not in (0, 255)]
        assert len(ids) == len(item["boxes"])
        for k, box, lab in zip(ids, item["boxes"].tolist(), item["box_labels"].tolist()):
            ys, xs = np.nonzero(inst == k)
            assert box == [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]
            assert lab == int(np.unique(cls[inst == k])[0])


@pytest.mark.filterwarnings("ignore:`reduce_zero_label` will be deprecated")
def test_ade20k_matches_mmseg_reduce_zero_label():
    from tokenmix.mmseg_compat import import_mmseg
    import_mmseg()
    from mmseg.datasets.transforms import LoadAnnotations

    ds = build_dataset("ade20k", FIX / "ade20k", "val")
    assert len(ds) == 3 and len(ds.classes) == 150
    for i in range(len(ds)):
        item, rec = ds[i], ds.samples[i]
        raw = np.asarray(Image.open(rec["mask"]))
        by_hand = np.where(raw == 0, 255, raw.astype(np.int64) - 1)
        ref = LoadAnnotations(reduce_zero_label=True)(
            {"seg_map_path": str(rec["mask"]), "reduce_zero_label": True, "seg_fields": []})["gt_seg_map"]
        assert np.array_equal(item["mask"].numpy(), by_hand)
        assert np.array_equal(item["mask"].numpy(), ref)
        assert (item["mask"] == 255).sum() == (raw == 0).sum() > 0


def test_cityscapes_labelids_mapping_equals_the_provided_trainids(tmp_path):
    src = FIX / "cityscapes"
    direct = build_dataset("cityscapes", src, "val")
    trainids = np.asarray(Image.open(next((src / "gtFine/val/frankfurt").glob("*_labelTrainIds.png"))))
    assert np.array_equal(direct[0]["mask"].numpy(), trainids)
    # a copy with only *_labelIds.png goes through the id -> trainId table
    for sub in ("leftImg8bit/val/frankfurt", "gtFine/val/frankfurt"):
        (tmp_path / sub).mkdir(parents=True)
        for f in (src / sub).iterdir():
            if not f.name.endswith("labelTrainIds.png"):
                shutil.copy(f, tmp_path / sub / f.name)
    mapped = build_dataset("cityscapes", tmp_path, "val")
    assert mapped.samples[0]["kind"] == "ids"
    m = mapped[0]["mask"].numpy()
    # The fixture's labelIds and labelTrainIds were downscaled separately, so 77 of 32,768 boundary pixels
    # disagree; every one of them has the file's trainId within 2 px in the mapped map. (Exact equality of the
    # table is tested on generated data in test_data_layouts.py.)
    assert (m == trainids).mean() > 0.997
    padded = np.pad(m, 2, constant_values=-1)
    for y, x in zip(*np.nonzero(m != trainids)):
        assert trainids[y, x] in padded[y:y + 5, x:x + 5]
    road = np.asarray(Image.open(next((tmp_path / "gtFine/val/frankfurt").glob("*_labelIds.png")))) == 7
    assert (m[road] == 0).all() and road.any()
    assert len(mapped.classes) == 19


def test_nyu_depth_is_millimetres_as_mmseg():
    from tokenmix.mmseg_compat import import_mmseg
    import_mmseg()
    from mmseg.datasets.transforms import LoadDepthAnnotation

    ds = build_dataset("nyuv2", FIX / "nyu", "test")
    item, rec = ds[0], ds.samples[0]
    raw = np.asarray(Image.open(rec["depth"]), dtype=np.float64)
    ref = LoadDepthAnnotation(depth_rescale_factor=1e-3)({"depth_map_path": str(rec["depth"]), "seg_fields": []})
    assert item["depth"].dtype == torch.float32
    np.testing.assert_allclose(item["depth"].numpy(), raw / 1000.0, rtol=1e-6)
    np.testing.assert_allclose(item["depth"].numpy(), ref["gt_depth_map"], rtol=1e-6)
    assert float(item["depth"].max()) == 10.0 and float(item["depth"].min()) == 0.0


def test_sunrgbd_bit_rotation():
    ds = build_dataset("sunrgbd", FIX / "sunrgbd", "test")
    item, rec = ds[0], ds.samples[0]
    d = np.asarray(Image.open(rec["depth"])).astype(np.int64)
    mm = (d // 8) + (d % 8) * 8192  # rotate right by 3 bits, with arithmetic instead of shifts
    np.testing.assert_allclose(item["depth"].numpy(), mm / 1000.0, rtol=1e-6)
    valid = item["depth"][item["depth"] > 0]
    assert 1.0 < float(valid.min()) and float(valid.max()) < 10.0  # README: about 1.1-9.9 m
    assert np.array_equal(item["image"].permute(1, 2, 0).numpy(), pil_rgb(rec["image"]))


def test_kitti_depth_over_256_and_split_paths():
    ds = build_dataset("kitti", FIX / "kitti", "test")
    item, rec = ds[0], ds.samples[0]
    assert "depth/val" in str(rec["depth"])  # BTS relative path resolved under depth/val/
    raw = np.asarray(Image.open(rec["depth"])).astype(np.float64)
    assert raw.shape == (375, 1242)
    np.testing.assert_allclose(item["depth"].numpy(), raw[23:, 13:1229] / 256.0, rtol=1e-6)  # KB crop
    assert item["focal"] == pytest.approx(721.5377)
    assert item["image"].shape == (3, 352, 1216)
    assert (item["depth"] == 0).float().mean() > 0.5  # sparse LiDAR ground truth


def test_imagenet_imagefolder_labels():
    tr, va = build_dataset("imagenet", FIX / "imagenet", "train"), build_dataset("imagenet", FIX / "imagenet", "val")
    assert tr.classes == va.classes == ("n02206856", "n02219486")
    assert (len(tr), len(va)) == (20, 10)
    for ds in (tr, va):
        for i in (0, len(ds) - 1):
            item = ds[i]
            assert item["label"] == ds.classes.index(Path(item["path"]).parent.name)
            assert np.array_equal(item["image"].permute(1, 2, 0).numpy(), pil_rgb(item["path"]))
