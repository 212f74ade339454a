"""DAVIS-2017 label propagation and scores against the transcribed references: DINO's eval_video_segmentation.py
(official/dino_video_segmentation.py) and davis2017-evaluation (official/davis2017_evaluation.py)."""
from __future__ import annotations

import copy
import json
import queue
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from helpers.davis_fixture import HW, SEQUENCES, write_davis
from datamodules.datasets.davis import DAVISDataset, read_frame_bgr
from datamodules.errors import LabelRangeError, MissingDataError, SizeMismatchError
from official import davis2017_evaluation as off_eval
from official import dino_video_segmentation as off
from probes.video import propagation as ours
from probes.video.davis_metrics import MEASURES, sequence_scores, summarize
from probes.video.davis_probe import DavisOptions, run_sequence

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def davis_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("davis")
    return root, write_davis(root)


class _TableModel:
    """DINO's model interface serving given features frame after frame (the official loop asks in frame order)."""

    def __init__(self, feats: torch.Tensor, patch: int):
        self.feats, self.calls = feats, 0
        self.patch_embed = SimpleNamespace(patch_size=patch)

    def get_intermediate_layers(self, x, n=1):
        f = self.feats[self.calls].reshape(1, -1, self.feats.shape[-1])
        self.calls += 1
        return [torch.cat([torch.zeros(1, 1, f.shape[-1]), f], 1)]


class _DinoView:
    """Our ViT behind DINO's interface: normed last-block tokens with [CLS] first."""

    def __init__(self, vit):
        self.vit, self.patch_embed = vit, SimpleNamespace(patch_size=vit.patch_size)

    def get_intermediate_layers(self, x, n=1):
        o = self.vit.extract(x, n_last_blocks=1)[-1]
        return [torch.cat([o["cls"][:, None], o["patch"]], 1)]


def _official_soft(feats, first, n_last, radius, topk=5):
    """eval_video_tracking_davis's propagation part on given features: soft maps (T-1, C, h, w)."""
    T, h, w, _ = feats.shape
    args = SimpleNamespace(n_last_frames=n_last, size_mask_neighborhood=radius, topk=topk)
    model, frame = _TableModel(feats, 1), torch.zeros(3, h, w)
    frame1_feat = off.extract_feature(model, frame).T
    que, mask, out = queue.Queue(n_last), None, []
    for _ in range(1, T):
        used_feats = [frame1_feat] + [p[0] for p in list(que.queue)]
        used_segs = [first[None]] + [p[1] for p in list(que.queue)]
        avg, feat_tar, mask = off.label_propagation(args, model, frame, used_feats, used_segs, mask)
        if que.qsize() == n_last:
            que.get()
        que.put([feat_tar, copy.deepcopy(avg)])
        out.append(avg[0])
    return torch.stack(out)


def _official_labels(soft, patch, frame_hw):
    out = []
    for s in soft:
        up = torch.nn.functional.interpolate(s[None], scale_factor=patch, mode="bilinear", align_corners=False,
                                             recompute_scale_factor=False)[0]
        seg = torch.max(off.norm_mask(up), dim=0)[1].numpy().astype(np.uint8)
        out.append(np.array(Image.fromarray(seg).resize((frame_hw[1], frame_hw[0]), 0)))
    return np.stack(out)


def _first(h, w, n_obj, seed):
    g = torch.Generator().manual_seed(seed)
    labels = torch.zeros(h, w, dtype=torch.long)
    for k in range(1, n_obj + 1):  # rectangles of random placement
        y, x = torch.randint(0, h - 4, (1,), generator=g).item(), torch.randint(0, w - 5, (1,), generator=g).item()
        labels[y:y + 4, x:x + 5] = k
    return torch.nn.functional.one_hot(labels, n_obj + 1).permute(2, 0, 1).float()


@pytest.mark.parametrize("T,h,w,n_last,radius", [(6, 14, 22, 3, 4), (9, 6, 27, 7, 12)])
def test_propagation_equals_official_on_random_features(T, h, w, n_last, radius):
    g = torch.Generator().manual_seed(h)
    base = torch.randn(1, h, w, 48, generator=g)
    feats = (base + 0.7 * torch.randn(T, h, w, 48, generator=g)) * (0.2 + 6 * torch.rand(T, h, w, 1, generator=g))
    first = _first(h, w, 3, seed=w)
    cfg = ours.PropagationOptions(n_last_frames=n_last, neighbourhood=radius)
    mine = ours.propagate_video(feats, first, cfg)
    ref = _official_soft(feats, first, n_last, radius)
    torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-6)
    frame_hw = (h * 4 + 3, w * 4 - 5)  # not a multiple of the patch: the nearest resize matters
    assert np.array_equal(ours.label_maps(mine, 4, frame_hw), _official_labels(ref, 4, frame_hw))


def test_propagation_keeps_ties_at_the_kth_value_as_official():
    T, h, w = 4, 9, 11
    g = torch.Generator().manual_seed(3)
    table = torch.randn(3, 16, generator=g)  # three distinct vectors: many sources tie exactly
    feats = table[torch.randint(0, 3, (T, h, w), generator=g)]
    first = _first(h, w, 2, seed=5)
    cfg = ours.PropagationOptions(n_last_frames=2, neighbourhood=2)
    mine, ref = ours.propagate_video(feats, first, cfg), _official_soft(feats, first, 2, 2)
    torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-6)
    assert np.array_equal(ours.label_maps(mine, 2, (18, 22)), _official_labels(ref, 2, (18, 22)))


def test_fixture_pipeline_writes_the_official_loops_pngs_and_scores(davis_root, tmp_path, monkeypatch):
    from backbones import create_vit
    root, _ = davis_root
    vit = create_vit("vit_test_patch8", "softmax", seed=0).eval()
    monkeypatch.setattr(off.read_frame, "__defaults__", ([64],))  # a 64 px short side keeps the test small
    monkeypatch.setattr(off.read_seg, "__defaults__", ([64],))
    off.evaluate_davis(_DinoView(vit), str(root), str(tmp_path / "official"), patch_size=8, n_last_frames=2,
                       size_mask_neighborhood=3)
    settings = DavisOptions(propagation=ours.PropagationOptions(n_last_frames=2, neighbourhood=3, short_side=64))
    ds = DAVISDataset(root, "val")
    for i, seq in enumerate(SEQUENCES):
        res = run_sequence(vit, ds, i, settings, torch.device("cpu"), tmp_path / "ours")
        names = sorted(p.name for p in (tmp_path / "official" / seq).glob("*.png"))
        assert names == sorted(p.name for p in (tmp_path / "ours" / seq).glob("*.png")) and len(names) == SEQUENCES[seq]
        a = [Image.open(tmp_path / "official" / seq / n) for n in names]
        b = [Image.open(tmp_path / "ours" / seq / n) for n in names]
        assert all(x.mode == y.mode == "P" and x.getpalette() == y.getpalette() for x, y in zip(a, b))
        pred = np.stack([np.asarray(x) for x in a])
        assert np.array_equal(pred, np.stack([np.asarray(y) for y in b]))
        assert len(np.unique(pred[1:])) > 1  # something was propagated
        gt = ds.load(ds.samples[i])["masks"]
        ref = off_eval.evaluate_sequence(gt, pred)
        assert len(ref) == len(res.objects) == 2
        for r, o in zip(ref, res.objects):
            assert np.array_equal(r["J"], o.j) and np.array_equal(r["F"], o.f)
            np.testing.assert_allclose(o.j_stats, r["J_stats"], rtol=0, atol=1e-9)
            np.testing.assert_allclose(o.f_stats, r["F_stats"], rtol=0, atol=1e-9)


def _blobs(rng, T, H, W, n):
    yy, xx = np.mgrid[0:H, 0:W]
    out = np.zeros((T, H, W), np.uint8)
    for k in range(1, n + 1):
        cy, cx, r = rng.uniform(0.2, 0.8) * H, rng.uniform(0.2, 0.8) * W, rng.uniform(0.1, 0.25) * H
        for t in range(T):
            out[t][(yy - cy - 2 * t) ** 2 + (xx - cx - 3 * k * t) ** 2 <= r ** 2] = k
    return out


@pytest.mark.parametrize("H,W", [(37, 53), (240, 427)])
def test_scores_equal_davis2017_evaluation(H, W):
    rng = np.random.default_rng(H)
    gt = _blobs(rng, 8, H, W, 3)
    gt[4, :3] = 255  # void: background for the tool
    pred = np.where(gt == 255, 0, gt).astype(np.uint8)
    pred = np.roll(pred, (2, -3), axis=(1, 2))
    pred[2][rng.random((H, W)) < 0.05] = 2  # speckle: many short boundaries
    pred[3][pred[3] == 3] = 0  # object 3 lost on a frame
    pred[5:] = np.where(pred[5:] == 3, 0, pred[5:])  # and for good: absent from the masks' ids on later frames
    gt[6][gt[6] == 1] = 0  # object 1 absent from the annotation on a frame
    pred[6][pred[6] == 1] = 0  # ... and from the masks: J = F = 1 there
    gt[7, -4:, -6:] = 2  # touching the last row and column: the boundary rule's special edge
    pred[1, :5, :4] = 1  # and the first
    objects, tables = [], []
    for name, (g, p) in {"a": (gt, pred), "b": (gt[1:], pred[1:])}.items():
        mine = sequence_scores(name, g, p)
        ref = off_eval.evaluate_sequence(g, p)
        for r, o in zip(ref, mine):
            assert np.array_equal(r["J"], o.j) and np.array_equal(r["F"], o.f)
        objects += mine
        tables += ref
    want = off_eval.global_table(tables)
    got = summarize(objects)
    assert set(got) == set(want)
    for k in want:
        assert abs(got[k] - want[k]) <= 1e-9, k


def test_frame_and_label_preparation_equal_dinos_readers(davis_root, tmp_path):
    root, _ = davis_root
    frame = root / "JPEGImages" / "480p" / "crossing" / "00003.jpg"
    ref, ori_h, ori_w = off.read_frame(str(frame))  # 480 px short side
    size = ours.input_size(ori_h, ori_w)
    assert (ori_h, ori_w) == HW and size == (480, 896) and tuple(ref.shape[1:]) == size
    assert torch.equal(ours.prepare_frame(read_frame_bgr(frame), size), ref)
    portrait = tmp_path / "portrait.jpg"
    Image.fromarray(np.asarray(Image.open(frame)).transpose(1, 0, 2).copy()).save(portrait)
    ref_p, ph, pw = off.read_frame(str(portrait))
    assert ours.input_size(ph, pw) == tuple(ref_p.shape[1:]) == (896, 480)
    ann = root / "Annotations" / "480p" / "crossing" / "00000.png"
    one_hot, seg_ori = off.read_seg(str(ann), 16)
    mine = ours.first_labels(np.asarray(Image.open(ann)), (size[0] // 16, size[1] // 16), 16)
    assert torch.equal(mine, one_hot[0]) and np.array_equal(seg_ori, np.asarray(Image.open(ann)))
    assert np.array_equal(ours.mask_palette(), off.UVC_PALETTE)


def test_dataset_refuses_missing_and_mismatched_files(davis_root, tmp_path):
    import shutil
    root, gt = davis_root
    ds = DAVISDataset(root, "val")
    assert [r["id"] for r in ds.samples] == list(SEQUENCES) and ds.num_frames == sum(SEQUENCES.values())
    item = ds.load(ds.samples[0])
    assert np.array_equal(item["masks"], gt["disc-square"][1]) and item["num_objects"] == 2
    from datamodules.check import main as check_data
    assert check_data(["--task", "davis", "--data-root", str(root), "--no-progress", "--jobs", "1"]) == 0
    bad = tmp_path / "bad"
    shutil.copytree(root, bad)
    ann = bad / "Annotations" / "480p" / "crossing"
    (ann / "00004.png").unlink()
    with pytest.raises(MissingDataError, match="00004.png"):
        DAVISDataset(bad, "val")
    assert check_data(["--task", "davis", "--data-root", str(bad), "--no-progress", "--jobs", "1"]) == 1
    shutil.copy(ann / "00003.png", ann / "00004.png")
    shutil.copy(ann / "00003.png", ann / "00009.png")
    with pytest.raises(MissingDataError, match="00009.png: annotation without a frame"):
        DAVISDataset(bad, "val")
    (ann / "00009.png").unlink()
    Image.open(ann / "00001.png").resize((40, 30)).save(ann / "00002.png")
    ds = DAVISDataset(bad, "val")
    with pytest.raises(SizeMismatchError, match="00002.png"):
        ds.load(ds.samples[1])
    m = np.asarray(Image.open(ann / "00001.png")).copy()
    m[0, 0] = 7
    Image.fromarray(m).save(ann / "00002.png")
    with pytest.raises(LabelRangeError, match="00002.png"):
        ds.load(ds.samples[1])
    (bad / "ImageSets" / "2017" / "val.txt").write_text("crossing\nnot-there\n")
    with pytest.raises(MissingDataError, match="not-there"):
        DAVISDataset(bad, "val")


def _probe_args(root) -> list[str]:
    return ["--task", "davis", "--data", "davis", "--data-root", str(root), "--ckpt", "random", "--arch",
            "vit_test_patch8", "--davis", "short_side=64,neighbourhood=3"]


def _tool_table(root, masks) -> dict:
    """davis2017-evaluation's global table (transcribed) on the PNGs a run wrote."""
    ds, objects = DAVISDataset(root, "val"), []
    for i, seq in enumerate(SEQUENCES):
        pred = np.stack([np.asarray(Image.open(p)) for p in sorted((masks / seq).glob("*.png"))])
        objects += off_eval.evaluate_sequence(ds.load(ds.samples[i])["masks"], pred)
    return off_eval.global_table(objects)


def test_make_probe_davis_writes_results_pngs_and_strips(davis_root, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from probes.run import main
    from tokenmix.results import KEYS
    root, _ = davis_root
    path = main(["--runs-dir", str(tmp_path), *_probe_args(root)])
    res = json.loads(path.read_text())
    assert tuple(res) == KEYS and res["task"] == "davis" and res["data"] == "davis"
    m = res["metrics"]
    assert (m["num_sequences"], m["num_objects"], m["num_frames"]) == (2, 4, sum(SEQUENCES.values()))
    pngs = sorted((path.parent / "masks").rglob("*.png"))
    assert len(pngs) == sum(SEQUENCES.values()) and {Image.open(p).mode for p in pngs} == {"P"}
    table = _tool_table(root, path.parent / "masks")  # the figures are the tool's on the PNGs written
    for k in MEASURES:
        assert abs(m[k] - 100 * table[k]) <= 1e-7, k
    ea = EventAccumulator(str(next(path.parent.glob("events.out.tfevents.*"))))
    ea.Reload()
    assert {f"davis/{s}" for s in SEQUENCES} <= set(ea.Tags()["images"])
    assert ea.Scalars("davis/J&F-Mean")[0].value == pytest.approx(m["J&F-Mean"])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_davis_two_processes_give_the_figures_of_one(davis_root, tmp_path):
    import os
    import sys

    from helpers import procs
    from probes.run import main
    root, _ = davis_root
    repo = Path(__file__).resolve().parents[1]
    one = json.loads(main(["--runs-dir", str(tmp_path / "one"), *_probe_args(root)]).read_text())
    env = dict(os.environ, PYTHONPATH=str(repo), OMP_NUM_THREADS="1")
    p = procs.run([sys.executable, "-m", "probes.run", "--runs-dir", str(tmp_path / "two"), "--devices", "2",
                   *_probe_args(root)], cwd=repo, env=env, timeout=500)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    found = sorted((tmp_path / "two").glob("*/probe/davis/version_*/results.json"))
    assert len(found) == 1, found
    two = json.loads(found[0].read_text())
    for k in (*MEASURES, "per_object", "per_sequence", "num_frames"):
        assert two["metrics"][k] == one["metrics"][k], k
    a = sorted((tmp_path / "one").rglob("masks/*/*.png"))
    b = sorted((tmp_path / "two").rglob("masks/*/*.png"))
    assert [x.relative_to(x.parents[2]) for x in a] == [y.relative_to(y.parents[2]) for y in b] and len(a) == 11
    assert all(np.array_equal(np.asarray(Image.open(x)), np.asarray(Image.open(y))) for x, y in zip(a, b))


@pytest.mark.timeout(60)
def test_data_root_alone_names_the_tasks_dataset(davis_root):
    """DATA_ROOT given and DATA not: DATA is the task's own dataset, said on the output's first line; DATA
    given wins; neither: the demo data. make passes DATA only when the user gave it."""
    import subprocess

    from probes.run import parse_args
    root, _ = davis_root
    parse = lambda *a: parse_args(["--ckpt", "random", *a])  # noqa: E731
    cfg = parse("--task", "davis", "--data-root", str(root))
    assert cfg.data.data == "davis" and cfg.note.startswith("[probe] DATA=davis")
    assert parse("--task", "voc").data.data == "demo" and parse("--task", "voc").note is None
    given = parse("--task", "voc", "--data", "demo", "--data-root", str(root))
    assert given.data.data == "demo" and given.note is None
    repo = Path(__file__).resolve().parents[1]
    dry = lambda *a: subprocess.run(["make", "-n", "-o", ".venv/.installed", "probe", *a], cwd=repo,  # noqa: E731
                                    capture_output=True, text=True, timeout=50).stdout
    assert "--data '' --data-root '/x'" in dry("TASK=davis", "DATA_ROOT=/x")
    assert "--data 'voc'" in dry("TASK=voc", "DATA=voc")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_make_probe_davis_with_data_root_alone_runs(davis_root, tmp_path):
    """``make probe TASK=davis DATA_ROOT=<DAVIS folder>`` runs on the task's dataset (no "no built-in demo data")."""
    import sys

    from helpers import procs
    root, _ = davis_root
    repo = Path(__file__).resolve().parents[1]
    args = f"--runs-dir {tmp_path} --arch vit_test_patch8 --davis short_side=64,neighbourhood=3 --accelerator cpu"
    p = procs.run(["make", "-s", "-o", ".venv/.installed", "probe", "TASK=davis", f"DATA_ROOT={root}", "CKPT=random",
                   f"ARGS={args}"], cwd=repo, timeout=280,
                  env={"PYTHONPATH": str(repo), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"})
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    assert p.stdout.splitlines()[0].startswith("[probe] DATA=davis: task davis's own dataset")
    res = json.loads(next(tmp_path.glob("*/probe/davis/version_*/results.json")).read_text())
    assert res["data"] == "davis" and res["metrics"]["num_sequences"] == len(SEQUENCES)
