"""Write tiny copies of every supported layout (a few 40x32 images) for tests and examples.

Each writer returns what it wrote as ground truth (decoded values in the loaders' units) so a test can
compare a loader against it. Nothing here is used at training time.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from datamodules.datasets.palette import voc_palette

H, W = 32, 40
KITTI_HW = (375, 1242)  # the KB crop needs at least 352x1216


def _rng(seed):
    return np.random.default_rng(seed)


def _rgb(rng, h=H, w=W) -> np.ndarray:
    return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)


def _save(arr: np.ndarray, path: Path, **kw) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr, **kw).save(path)
    return path




def write_imagenet(root: Path, wnids=("n01440764", "n01443537"), per_class=(3, 2), seed=0) -> dict:
    rng, root = _rng(seed), Path(root)
    gt = {}
    for split, n in zip(("train", "val"), per_class):
        for c, wnid in enumerate(wnids):
            for k in range(n):
                name = f"ILSVRC2012_{split}_{c}{k:04d}.JPEG"
                p = root / split / wnid / name
                p.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(_rgb(rng)).save(p, format="JPEG", quality=95)
                gt[str(p)] = c
    return gt


def write_voc(root: Path, ids=("2007_000001", "2007_000002", "2007_000003", "2007_000004"), seed=0) -> dict:
    """VOC2012 + SBD aug: train = ids[:2], val = ids[2:], train_aug = ids[:2] + ['aug_only']."""
    rng, voc = _rng(seed), Path(root) / "VOCdevkit" / "VOC2012"
    gt = {}
    all_ids = list(ids) + ["aug_only"]
    for i in all_ids:
        img = _rgb(rng)
        _save(img, voc / "JPEGImages" / f"{i}.jpg")
        mask = rng.integers(0, 21, (H, W)).astype(np.uint8)
        mask[0, :] = 255  # object borders
        x0, y0, x1, y1 = 5, 4, 20, 30  # 1-based inclusive pixel box: columns 4..19, rows 3..29 (0-based)
        if i != "aug_only":
            m = Image.fromarray(mask, mode="P")
            m.putpalette(voc_palette())
            (voc / "SegmentationClass").mkdir(parents=True, exist_ok=True)
            m.save(voc / "SegmentationClass" / f"{i}.png")
        _save(mask, voc / "SegmentationClassAug" / f"{i}.png")
        (voc / "Annotations").mkdir(parents=True, exist_ok=True)
        (voc / "Annotations" / f"{i}.xml").write_text(
            f"<annotation><filename>{i}.jpg</filename><size><width>{W}</width><height>{H}</height><depth>3</depth>"
            f"</size><object><name>dog</name><difficult>0</difficult><bndbox><xmin>{x0}</xmin><ymin>{y0}</ymin>"
            f"<xmax>{x1}</xmax><ymax>{y1}</ymax></bndbox></object><object><name>person</name><difficult>1"
            f"</difficult><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>{W}</xmax><ymax>{H}</ymax></bndbox></object>"
            "</annotation>")
        gt[i] = mask
    seg = voc / "ImageSets" / "Segmentation"
    seg.mkdir(parents=True, exist_ok=True)
    (seg / "train.txt").write_text("\n".join(ids[:2]) + "\n")
    (seg / "val.txt").write_text("\n".join(ids[2:]) + "\n")
    (seg / "trainval.txt").write_text("\n".join(ids) + "\n")
    # DeepLab-style aug list ("/JPEGImages/x.jpg /SegmentationClassAug/x.png")
    (seg / "train_aug.txt").write_text("".join(f"/JPEGImages/{i}.jpg /SegmentationClassAug/{i}.png\n"
                                               for i in list(ids[:2]) + ["aug_only"]))
    return gt


def write_ade20k(root: Path, n=(2, 2), seed=0) -> dict:
    rng, base = _rng(seed), Path(root) / "ADEChallengeData2016"
    gt = {}
    for sub, k in zip(("training", "validation"), n):
        for j in range(k):
            name = f"ADE_{'train' if sub == 'training' else 'val'}_{j + 1:08d}"
            _save(_rgb(rng), base / "images" / sub / f"{name}.jpg")
            raw = rng.integers(0, 151, (H, W)).astype(np.uint8)
            raw[0, :3] = (0, 1, 150)
            _save(raw, base / "annotations" / sub / f"{name}.png")
            gt[name] = raw
    return gt


def write_cityscapes(root: Path, with_train_ids=True, seed=0) -> dict:
    from datamodules.datasets.cityscapes import ID_TO_TRAINID
    rng, root = _rng(seed), Path(root)
    gt = {}
    for split, n in (("train", 2), ("val", 1)):
        for j in range(n):
            stem = f"aachen_{j:06d}_000019"
            _save(_rgb(rng), root / "leftImg8bit" / split / "aachen" / f"{stem}_leftImg8bit.png")
            ids = rng.integers(0, 34, (H, W)).astype(np.uint8)
            train_ids = np.vectorize(ID_TO_TRAINID.get)(ids).astype(np.uint8)
            _save(ids, root / "gtFine" / split / "aachen" / f"{stem}_gtFine_labelIds.png")
            if with_train_ids:
                _save(train_ids, root / "gtFine" / split / "aachen" / f"{stem}_gtFine_labelTrainIds.png")
            gt[f"{split}/{stem}"] = train_ids
    return gt


def _depth_u16(rng, hi=10000) -> np.ndarray:
    d = rng.integers(1, hi, (H, W)).astype(np.uint16)
    d[:2, :2] = 0  # unknown
    return d


def write_nyu_mmseg(root: Path, n=(2, 2), seed=0) -> dict:
    rng, root = _rng(seed), Path(root)
    gt = {}
    for split, k in zip(("train", "test"), n):
        for j in range(k):
            name = f"kitchen_{j:04d}_{split}"
            _save(_rgb(rng), root / "images" / split / f"{name}.jpg")
            mm = _depth_u16(rng)
            _save(mm, root / "annotations" / split / f"{name}.png")
            gt[name] = mm.astype(np.float32) / 1000
    return gt


def write_nyu_bts(root: Path, seed=0) -> dict:
    """BTS test layout: official_splits/test/<scene>/rgb_*.jpg + sync_depth_*.png, list in root."""
    rng, root = _rng(seed), Path(root)
    gt, lines = {}, []
    for j in range(2):
        rgb, dep = f"bathroom/rgb_{j:05d}.jpg", f"bathroom/sync_depth_{j:05d}.png"
        _save(_rgb(rng), root / "official_splits" / "test" / rgb)
        mm = _depth_u16(rng)
        _save(mm, root / "official_splits" / "test" / dep)
        lines.append(f"{rgb} {dep} 518.8579")
        gt[rgb] = mm.astype(np.float32) / 1000
    (root / "nyudepthv2_test_files_with_gt.txt").write_text("\n".join(lines) + "\n")
    return gt


def sunrgbd_encode(mm: np.ndarray) -> np.ndarray:
    """Inverse of the SUN RGB-D bit rotation (file = rotate-left by 3 of the millimetres)."""
    d = mm.astype(np.uint32)
    return (((d << 3) | (d >> 13)) & 0xFFFF).astype(np.uint16)


def write_sunrgbd(root: Path, seed=0) -> dict:
    rng, root = _rng(seed), Path(root)
    gt, lines = {}, []
    for j in range(2):
        frame = f"SUNRGBD/kv2/kinect2data/{j:06d}_2014-05-26"
        rgb, dep = f"{frame}/image/{j:07d}.jpg", f"{frame}/depth/{j:07d}.png"
        _save(_rgb(rng), root / rgb)
        mm = _depth_u16(rng)
        _save(sunrgbd_encode(mm), root / dep)
        lines.append(f"{rgb} {dep}")
        gt[rgb] = mm.astype(np.float32) / 1000
    (root / "SUNRGBD_val_splits.txt").write_text("\n".join(lines) + "\n")
    return gt


def write_kitti(root: Path, seed=0) -> dict:
    """Two frames with ground truth (one under depth/train, one under depth/val) and one 'None' line, at KITTI's
    375x1242 (the loader KB-crops to 352x1216); returns the full-frame gt per rgb path."""
    rng, root = _rng(seed), Path(root)
    gt, lines = {}, []
    drive = "2011_09_26_drive_0002_sync"
    for j, sub in enumerate(("train", "val", None)):
        rgb = f"2011_09_26/{drive}/image_02/data/{j:010d}.png"
        _save(_rgb(rng, *KITTI_HW), root / "raw" / rgb)
        if sub is None:
            lines.append(f"{rgb} None 721.5377")
            continue
        dep = f"{drive}/proj_depth/groundtruth/image_02/{j:010d}.png"
        raw = rng.integers(0, 80 * 256, KITTI_HW).astype(np.uint16)
        _save(raw, root / "depth" / sub / dep)
        lines.append(f"{rgb} {dep} 721.5377")
        gt[rgb] = raw.astype(np.float32) / 256
    (root / "splits").mkdir(parents=True, exist_ok=True)
    (root / "splits" / "eigen_test_files_with_gt.txt").write_text("\n".join(lines) + "\n")
    return gt
