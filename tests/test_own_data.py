"""Your own data: custom_seg / custom_depth / imagefolder / folder built here from the real fixtures,
read like the official loaders read the same files, and every refusal naming the file."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from datamodules import build_dataset
from datamodules.errors import (DatasetError, DepthFormatError, EmptyDatasetError, LabelRangeError, MissingDataError,
                                SizeMismatchError)


# --------------------------------------------------------------------------- builders (also used by test_own_data_runs)

def make_custom_seg(fixtures: Path, out: Path) -> Path:
    """VOC2012 fixture rearranged: img_dir/{train,val}, ann_dir/{train,val} (the palette PNGs), classes.txt."""
    voc = fixtures / "voc" / "VOCdevkit" / "VOC2012"
    for split in ("train", "val"):
        for i in (voc / "ImageSets" / "Segmentation" / f"{split}.txt").read_text().split():
            for sub, src in (("img_dir", voc / "JPEGImages" / f"{i}.jpg"),
                             ("ann_dir", voc / "SegmentationClass" / f"{i}.png")):
                (out / sub / split).mkdir(parents=True, exist_ok=True)
                shutil.copy(src, out / sub / split / src.name)
    names = ("background aeroplane bicycle bird boat bottle bus car cat chair cow diningtable dog horse motorbike "
             "person pottedplant sheep sofa train tvmonitor").split()  # the devkit's 21 classes, in id order
    (out / "classes.txt").write_text("\n".join(names) + "\n")
    return out


def make_nyu_pair(fixtures: Path, nyu: Path, custom: Path) -> tuple[Path, Path]:
    """The NYU fixture frame (and its mirror image) as mmseg NYU (images/annotations/{train,test}) and as
    custom_depth (img_dir/depth_dir/{train,val}, metainfo.yaml with NYU's settings)."""
    src = fixtures / "nyu"
    img = Image.open(next((src / "images" / "test").glob("*.jpg")))
    dep = Image.open(next((src / "annotations" / "test").glob("*.png")))
    frames = {"a": (img, dep), "b": (img.transpose(Image.FLIP_LEFT_RIGHT), dep.transpose(Image.FLIP_LEFT_RIGHT))}
    for nsplit, csplit in (("train", "train"), ("test", "val")):
        for name, (im, d) in frames.items():
            for base, isub, dsub, s in ((nyu, "images", "annotations", nsplit),
                                        (custom, "img_dir", "depth_dir", csplit)):
                (base / isub / s).mkdir(parents=True, exist_ok=True)
                (base / dsub / s).mkdir(parents=True, exist_ok=True)
                im.save(base / isub / s / f"{name}.jpg", quality=95)
                d.save(base / dsub / s / f"{name}.png")
    (custom / "metainfo.yaml").write_text("depth_scale: 1000\nmin_depth: 0.001\nmax_depth: 10\neval_crop: eigen\n")
    return nyu, custom


def make_mixed_folder(fixtures: Path, out: Path) -> tuple[list[str], str]:
    """A nested folder of mixed-size JPEG / PNG (grayscale, RGBA, palette) / WebP images plus one truncated JPEG.
    Returns (every image written, relative and sorted; the corrupt one)."""
    srcs = sorted((fixtures / "imagenet_samples").glob("*.JPEG"))[:12]
    written = []
    for k, p in enumerate(srcs):
        im = Image.open(p).convert("RGB").resize((33 + 9 * k, 70 - 3 * k))  # every size and aspect differs
        rel = f"site{k % 3}/day{k % 2}/img{k:02d}" + (".jpg", ".png", ".png", ".webp")[k % 4]
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (im, im.convert("L"), im.convert("RGBA"), im)[k % 4].save(out / rel)
        written.append(rel)
    (out / "notes.txt").write_text("not an image")
    (out / ".hidden.jpg").write_bytes(b"ignored")
    data = srcs[0].read_bytes()
    bad = "site0/broken.jpg"
    (out / bad).write_bytes(data[: len(data) // 3])  # truncated: decoding fails
    return sorted(written + [bad]), bad


@pytest.fixture
def seg_root(fixtures_root, tmp_path):
    return make_custom_seg(fixtures_root, tmp_path / "seg")


# --------------------------------------------------------------------------- reading

def test_custom_seg_reads_as_voc_reads_the_same_files(fixtures_root, seg_root):
    for split in ("train", "val"):
        voc, own = build_dataset("voc", fixtures_root / "voc", split), build_dataset("custom_seg", seg_root, split)
        assert len(own) == len(voc) and own.classes == tuple(voc.classes)
        for a, b in ((voc[i], own[i]) for i in range(len(voc))):
            assert torch.equal(a["image"], b["image"]) and torch.equal(a["mask"], b["mask"])


def test_custom_seg_options_reduce_zero_label_suffix_and_metainfo(seg_root):
    # grayscale maps under another suffix, ids shifted by one (0 = ignore), classes + palette from metainfo.yaml
    for p in sorted((seg_root / "ann_dir").rglob("*.png")):
        raw = np.asarray(Image.open(p)).astype(np.int64)
        shifted = np.where(raw == 255, 255, raw + 1).astype(np.uint8)
        Image.fromarray(shifted, mode="L").save(p.with_name(p.stem + "_gt.png"))
        p.unlink()
    names = (seg_root / "classes.txt").read_text().split()
    (seg_root / "classes.txt").unlink()
    (seg_root / "metainfo.yaml").write_text(json.dumps({"classes": names, "palette": [[k, k, k] for k in range(21)],
                                                        "reduce_zero_label": True, "seg_map_suffix": "_gt.png"}))
    ds = build_dataset("custom_seg", seg_root, "train")
    raw = np.asarray(Image.open(sorted((seg_root / "ann_dir" / "train").glob("*_gt.png"))[0])).astype(np.int64)
    expect = np.where((raw == 0) | (raw == 255), 255, raw - 1)  # mmseg reduce_zero_label, by hand
    assert torch.equal(ds[0]["mask"], torch.from_numpy(expect))
    assert ds.classes == tuple(names) and ds.METAINFO["palette"][3] == (3, 3, 3)


def test_custom_depth_reads_as_nyuv2_reads_the_same_files(fixtures_root, tmp_path):
    nyu, custom = make_nyu_pair(fixtures_root, tmp_path / "nyu", tmp_path / "custom")
    a, b = build_dataset("nyuv2", nyu, "test")[0], build_dataset("custom_depth", custom, "val")[0]
    assert torch.equal(a["image"], b["image"]) and torch.equal(a["depth"], b["depth"])
    raw = np.asarray(Image.open(custom / "depth_dir" / "val" / "a.png")).astype(np.float32)
    assert torch.equal(b["depth"], torch.from_numpy(raw / 1000.0))  # millimetres -> metres, by hand
    # .npy maps in another unit: the same metres
    for p in sorted((custom / "depth_dir").rglob("*.png")):
        np.save(p.with_suffix(".npy"), np.asarray(Image.open(p)).astype(np.float32) / 10.0)  # centimetres
        p.unlink()
    c = build_dataset("custom_depth", custom, "val", depth_scale=100.0)[0]
    assert torch.allclose(c["depth"], a["depth"], atol=1e-6)


def test_custom_depth_eval_settings_follow_its_options(fixtures_root, tmp_path):
    from probes.core.task_table import depth_eval_settings
    _, custom = make_nyu_pair(fixtures_root, tmp_path / "nyu", tmp_path / "custom")
    lo, hi, crop, clip = depth_eval_settings("custom_depth", build_dataset("custom_depth", custom, "val"))
    assert (lo, hi, clip) == (0.001, 10.0) + (None,)
    assert int(crop(480, 640).sum()) == (471 - 45) * (601 - 41)  # NYU's Eigen crop, hand-counted
    ds = build_dataset("custom_depth", custom, "val", eval_crop="0.5,1,0,0.25", max_depth=80)
    m = ds.eval_settings()[2](10, 8)
    assert int(m.sum()) == 5 * 2 and bool(m[9, 0]) and not bool(m[4, 0])
    with pytest.raises(DatasetError, match="eval_crop"):
        build_dataset("custom_depth", custom, "val", eval_crop="middle")


def test_imagefolder_with_any_class_names(fixtures_root, tmp_path):
    root = tmp_path / "cls"
    for split in ("train", "val"):
        for src in (fixtures_root / "imagenet" / split).iterdir():
            shutil.copytree(src, root / split / {"n02219486": "ants", "n02206856": "bees"}[src.name])
    ds = build_dataset("imagefolder", root, "train")
    assert ds.classes == ("ants", "bees") and {ds[i]["label"] for i in range(len(ds))} == {0, 1}


# --------------------------------------------------------------------------- DATA=folder

def test_folder_index_finds_every_image_and_converts_modes(fixtures_root, tmp_path):
    from datamodules.datasets.folder import build_index
    from datamodules.transforms.multicrop import MultiCropTransform
    written, bad = make_mixed_folder(fixtures_root, tmp_path / "imgs")
    index = build_index(tmp_path / "imgs")
    assert index["files"] == written and index["count"] == len(written) and not index["verified"]
    assert index["sha256"] == hashlib.sha256("\n".join(written).encode()).hexdigest()
    verified = build_index(tmp_path / "imgs", verify=True)
    assert list(verified["corrupt"]) == [str(tmp_path / "imgs" / bad)] and bad not in verified["files"]
    assert verified["scanned"] == len(written) and verified["count"] == len(written) - 1
    ds = build_dataset("folder", tmp_path / "imgs", "train", max_corrupt=0.1, verify=True)
    crops = MultiCropTransform.from_preset("demo", global_size=32, local_size=16, n_local=2)
    for i, rel in enumerate(verified["files"]):
        item, ref = ds[i], Image.open(tmp_path / "imgs" / rel)
        assert item["image"].dtype == torch.uint8 and item["image"].shape == (3, ref.size[1], ref.size[0])
        if ref.mode == "L":
            assert torch.equal(item["image"][0], item["image"][2])
        assert [tuple(c.shape) for c in crops(item["image"], generator=torch.Generator().manual_seed(i))] == \
            [(3, 32, 32)] * 2 + [(3, 16, 16)] * 2


def test_folder_index_cached_once_and_read_by_other_ranks(fixtures_root, tmp_path, monkeypatch):
    import datamodules.datasets.folder as folder
    make_mixed_folder(fixtures_root, tmp_path / "imgs")
    index, path = folder.open_index(tmp_path / "imgs", index_dir=str(tmp_path / "run"), rank=0, max_corrupt=0.1)
    saved = json.loads(path.read_text())
    assert path.parent == tmp_path / "run" and saved["count"] == index["count"] and saved["sha256"] == index["sha256"]

    def no_scan(*a, **k):
        raise AssertionError("a rank other than 0 scanned the folder")
    monkeypatch.setattr(folder, "scan_folder", no_scan)
    other, other_path = folder.open_index(tmp_path / "imgs", index_dir=str(tmp_path / "run"), rank=1, max_corrupt=0.1)
    assert other_path == path and other["files"] == index["files"]


def test_folder_corrupt_file_met_on_reading_is_skipped_listed_and_bounded(fixtures_root, tmp_path):
    from datamodules.datasets.folder import FolderDataset, open_index
    written, bad = make_mixed_folder(fixtures_root, tmp_path / "imgs")
    index, path = open_index(tmp_path / "imgs", index_dir=str(tmp_path / "run"), rank=0, max_corrupt=0.1)
    ds = FolderDataset(tmp_path / "imgs", index=index, index_path=path, max_corrupt=0.1)
    k = written.index(bad)
    item = ds[k]  # the next image instead
    assert item["path"] == str(tmp_path / "imgs" / written[k + 1])
    other = FolderDataset(tmp_path / "imgs", index=index, index_path=path, max_corrupt=0.1)  # another process
    rep = other.report()
    assert rep["num_skipped"] == 1 and list(rep["skipped"]) == [str(tmp_path / "imgs" / bad)]
    strict = FolderDataset(tmp_path / "imgs", index=index, index_path=path, max_corrupt=0.01)
    with pytest.raises(DatasetError, match=r"1 of 13 files are unreadable .*max_corrupt 1 %"):
        strict[k]


def test_folder_refusals(fixtures_root, tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "empty" / "sub" / "readme.md").write_text("x")
    with pytest.raises(EmptyDatasetError, match="no images found under .*empty"):
        build_dataset("folder", tmp_path / "empty", "train")
    make_mixed_folder(fixtures_root, tmp_path / "imgs")
    with pytest.raises(DatasetError, match="broken.jpg: cannot decode"):  # 1 of 13 > the default 1 %
        build_dataset("folder", tmp_path / "imgs", "train", verify=True)
    lst = tmp_path / "list.txt"
    lst.write_text("site0/day0/img00.jpg\nsite0/gone.jpg\n")
    with pytest.raises(DatasetError, match="gone.jpg: missing .named by the file list"):
        build_dataset("folder", tmp_path / "imgs", "train", file_list=lst)
    ds = build_dataset("folder", tmp_path / "imgs", "train", file_list=lst, max_corrupt=0.5)
    assert ds.samples == ["site0/day0/img00.jpg"]


def test_folder_boxes_voc_style_and_coco(fixtures_root, tmp_path):
    voc = fixtures_root / "voc" / "VOCdevkit" / "VOC2012"
    root = tmp_path / "det"
    shutil.copytree(voc / "JPEGImages", root / "photos")
    shutil.copytree(voc / "Annotations", root / "Annotations")
    ref = build_dataset("voc", fixtures_root / "voc", "trainval", boxes=True)
    ds = build_dataset("folder", root, "trainval", boxes=True)
    assert len(ds) == len(ref)
    for a, b in ((ref[i], ds[i]) for i in range(len(ref))):
        assert Path(a["path"]).name == Path(b["path"]).name and torch.equal(a["boxes"], b["boxes"])
    coco = {"images": [{"id": 7, "file_name": "photos/2011_000003.jpg"}],
            "categories": [{"id": 3, "name": "dog"}],
            "annotations": [{"image_id": 7, "bbox": [10, 20, 30, 40], "category_id": 3, "iscrowd": 0}]}
    shutil.rmtree(root / "Annotations")
    (root / "instances.json").write_text(json.dumps(coco))
    ds = build_dataset("folder", root, "val", boxes=True)
    assert ds[0]["boxes"].tolist() == [[10, 20, 40, 60]] and ds[1]["boxes"].shape == (0, 4)


# --------------------------------------------------------------------------- refusals (custom_seg, custom_depth)

def test_seg_refuses_unpaired_files_naming_them(seg_root):
    (seg_root / "ann_dir" / "train" / "2011_000003.png").rename(seg_root / "2011_000003.png")
    with pytest.raises(MissingDataError, match=r"1 image\(s\) without their label map .*2011_000003.jpg"):
        build_dataset("custom_seg", seg_root, "train")
    shutil.move(seg_root / "2011_000003.png", seg_root / "ann_dir" / "train" / "extra.png")
    (seg_root / "img_dir" / "train" / "2011_000003.jpg").rename(seg_root / "img_dir" / "train" / "extra.jpg")
    build_dataset("custom_seg", seg_root, "train")  # paired again, by name
    shutil.copy(seg_root / "ann_dir" / "val" / "2011_000025.png", seg_root / "ann_dir" / "train" / "lonely.png")
    with pytest.raises(MissingDataError, match=r"label map\(s\) without their image .*lonely.png"):
        build_dataset("custom_seg", seg_root, "train")


def test_seg_refuses_no_images_naming_the_folder_and_suffix(seg_root):
    with pytest.raises(EmptyDatasetError, match=r"no images found: no '\*.png' file under .*img_dir/train .*\.jpg"):
        build_dataset("custom_seg", seg_root, "train", img_suffix=".png")


def test_seg_refuses_label_values_outside_the_classes(seg_root):
    p = seg_root / "ann_dir" / "val" / "2011_000025.png"
    m = Image.open(p)
    arr = np.asarray(m).copy()
    arr[5, 5] = 30  # not a class, not 255
    out = Image.fromarray(arr, mode="P")
    out.putpalette(m.getpalette())
    out.save(p)
    with pytest.raises(LabelRangeError, match=r"2011_000025.png: label map holds values \[30\] outside the 21 classes "
                                              r"of .*classes.txt"):
        build_dataset("custom_seg", seg_root, "train")  # before any work: every split is checked


def test_seg_refuses_size_mismatch(seg_root):
    p = seg_root / "ann_dir" / "train" / "2011_000006.png"
    m = Image.open(p)
    m.resize((m.size[0] // 2, m.size[1] // 2), Image.NEAREST).save(p)
    with pytest.raises(SizeMismatchError, match=r"2011_000006.png: label map is \d+x\d+ \(WxH\) but its image "):
        build_dataset("custom_seg", seg_root, "train")


def test_seg_refuses_a_class_list_that_does_not_match_the_labels(seg_root):
    used = sorted({int(v) for p in (seg_root / "ann_dir").rglob("*.png") for v in np.unique(np.asarray(Image.open(p)))
                   if v != 255})
    for p in (seg_root / "ann_dir").rglob("*.png"):  # the used ids made contiguous: 0..len(used)-1
        arr = np.asarray(Image.open(p)).copy()
        Image.fromarray(np.vectorize(lambda v: 255 if v == 255 else used.index(v))(arr).astype(np.uint8)).save(p)
    names = [f"c{k}" for k in range(len(used))]
    (seg_root / "classes.txt").write_text("\n".join(names))
    build_dataset("custom_seg", seg_root, "train")  # exact
    (seg_root / "classes.txt").write_text("\n".join(["class"] + names))  # a header line
    with pytest.raises(DatasetError, match=rf"classes.txt lists {len(used) + 1} classes but the labels of every split "
                                           rf"use only ids 0..{len(used) - 1}"):
        build_dataset("custom_seg", seg_root, "val")
    (seg_root / "classes.txt").write_text("\n".join(names[1:]))  # 'background' forgotten
    with pytest.raises(DatasetError, match=rf"classes.txt lists {len(used) - 1} classes but the labels use "
                                           rf"{len(used)} ids"):
        build_dataset("custom_seg", seg_root, "train")


def test_depth_refusals(fixtures_root, tmp_path):
    _, custom = make_nyu_pair(fixtures_root, tmp_path / "nyu", tmp_path / "custom")
    with pytest.raises(DepthFormatError, match=r"depth_dir/train/a.png: no depth value inside \(0.001, 10.0\) m after "
                                               r"dividing by depth_scale=1"):
        build_dataset("custom_depth", custom, "train", depth_scale=1)  # millimetres read as metres
    p = custom / "depth_dir" / "val" / "b.png"
    d = Image.open(p)
    d.resize((d.size[0] - 8, d.size[1]), Image.NEAREST).save(p)
    with pytest.raises(SizeMismatchError, match=r"depth_dir/val/b.png: depth map is 152x120"):
        build_dataset("custom_depth", custom, "val")
    p.unlink()
    with pytest.raises(MissingDataError, match=r"1 image\(s\) without their depth map .*img_dir/val/b.jpg"):
        build_dataset("custom_depth", custom, "val")


def test_probe_refuses_data_its_task_cannot_read(tmp_path):
    from probes.run import main
    with pytest.raises(ValueError, match="TASK=knn cannot read DATA=folder .*images without labels"):
        main(["--task", "knn", "--ckpt", "random", "--data", "folder", "--data-root", str(tmp_path)])
    with pytest.raises(ValueError, match="TASK=seg cannot read DATA=custom_depth .*TASK=depth"):
        main(["--task", "seg", "--ckpt", "random", "--data", "custom_depth", "--data-root", str(tmp_path)])


def test_check_data_knows_the_custom_layouts(seg_root, capsys):
    from datamodules.check import main
    assert main(["--task", "seg", "--data-root", str(seg_root), "--no-progress"]) == 0
    for p in (seg_root / "ann_dir" / "train").glob("*.png"):
        arr = np.asarray(Image.open(p)).copy()
        arr[0, 0] = 40
        Image.fromarray(arr).save(p)
    capsys.readouterr()
    assert main(["--task", "custom_seg", "--data-root", str(seg_root), "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert out.count("holds class ids [40] outside [0, 20]") == 2 and "2011_000003.png" in out  # every file listed


def test_study_plans_the_custom_datasets(tmp_path):
    from study.plan import Spec, plan
    spec = Spec.create(name="own", variants=["softmax"], seeds=[0], tasks=["seg", "depth", "knn", "pca"],
                       preset="tiny", data="folder", data_root="/imgs", root=tmp_path,
                       task_data=[("seg", "custom_seg", "/seg"), ("depth", "custom_depth", "/depth"),
                                  ("knn", "imagefolder", "/cls")])
    cmds = {c.id: c.command("py") for c in plan(spec)}
    assert cmds["pretrain.softmax.seed0"][3:9] == ["--variant", "softmax", "--data", "folder", "--data-root", "/imgs"]
    for task, data, root in (("seg", "custom_seg", "/seg"), ("depth", "custom_depth", "/depth"),
                             ("knn", "imagefolder", "/cls"), ("pca", "folder", "/imgs")):
        c = cmds[f"{task}.softmax.seed0"]
        assert c[c.index("--task") + 1] == task and c[c.index("--data") + 1] == data
        assert c[c.index("--data-root") + 1] == root
