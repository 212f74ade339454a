"""DenseProbeCheck: a tiny pretraining writes the dense mIoU, the retrieval mIoU and the diffusion measures as
TensorBoard scalars and a summary.json series; the online mIoU equals ``probes.run --solver ridge`` on the
checkpoint, the retrieval mIoU a hand-worked case and the retrieval probe's core on the same features; 2 processes
give the numbers 1 process gives. Run as a script (``python tests/test_dense_check.py OUT DEVICES DEMO_ROOT``) it is the
DDP worker of the last test."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from helpers import shared_runs

REPO = Path(__file__).resolve().parents[1]
CHECK = {"max_samples": 5, "img_size": 32, "batch_size": 2, "attn_images": 3}


@pytest.fixture(scope="module")
def small_voc(tmp_path_factory):
    from datamodules.demo import DemoSpec, ensure_demo_data
    return ensure_demo_data(tmp_path_factory.mktemp("demo"), spec=DemoSpec(cls_train=2, cls_val=2, voc_train=6,
                                                                          voc_val=5, nyu_train=2, nyu_test=2))


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_pretraining_series_tensorboard_and_the_probe_cli_agree(tmp_path, entmax_run):
    # the session's shared tiny entmax run (tests/helpers/shared_runs.py) has DenseProbeCheck on with CHECK's settings
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from probes.run import main as probe
    assert shared_runs.DENSE_CHECK == CHECK
    call_wall, small_voc = entmax_run.call_wall, entmax_run.small_voc
    [summary] = entmax_run.runs.glob("entmax/pretrain/tiny/version_0/summary.json")
    metrics = json.loads(summary.read_text())["metrics"]
    series = metrics["dense_series"]
    # the stated cost: the checks' seconds over the fit's wall time, which is shorter than the whole call
    spent = sum(p["dense_seconds"] for p in series)
    assert spent / call_wall <= metrics["dense_check_share"] < 1
    assert all(0 < p["dense_cpu_seconds"] for p in series)
    # start, end of epoch 1, end: 3 points, each with every measure
    assert [(p["when"], p["step"], p["epoch"]) for p in series] == [("start", 0, 0), ("epoch", 3, 1), ("end", 6, 2)]
    keys = ["dense_mIoU", "dense_retrieval_mIoU", "diffusion_pib_cls", "diffusion_cls_patch_cosine",
            "diffusion_effective_rank", "diffusion_attn_entropy", "diffusion_attn_zero_share"]
    for p in series:
        assert all(p[k] is not None for k in keys), p
        assert 0 <= p["dense_mIoU"] <= 100 and 1 <= p["diffusion_effective_rank"] <= 32  # width 32
        assert 0 <= p["dense_retrieval_mIoU"] <= 100
        assert 0 < p["diffusion_attn_entropy"] <= __import__("math").log(17) + 1e-6  # 16 patches + [CLS]
    acc = EventAccumulator(str(summary.parent))
    acc.Reload()
    for k in keys:
        assert [e.step for e in acc.Scalars(k)] == [0, 3, 6], k

    # the probe CLI with the same reduced settings on the checkpoints of the end and (the flags `make study AT=`
    # adds) of epoch 1: the same numbers as the online check at those points
    for ckpt, point in (("last.ckpt", series[-1]), ("at_epoch0001.ckpt", series[1])):
        res = probe(["--task", "voc", "--ckpt", str(summary.parent / "checkpoints" / ckpt), "--data", "demo",
                     "--data-root", str(small_voc), "--solver", "ridge", "--max-samples", str(CHECK["max_samples"]),
                     "--img-size", str(CHECK["img_size"]), "--batch-size", "2", "--runs-dir", str(tmp_path / "probe")])
        m = json.loads(Path(res).read_text())["metrics"]
        assert m["solver"] == "ridge"
        assert m["mIoU"] == pytest.approx(point["dense_mIoU"], abs=1e-9), ckpt
        assert m["aAcc"] == pytest.approx(point["dense_aAcc"], abs=1e-9), ckpt


@pytest.mark.timeout(300)
def test_one_forward_per_image_and_one_collective_for_the_sums(small_voc):
    """Each labelled image goes through the teacher once (the attention of the first ``attn_images`` val images is
    read from that forward): the attention measures equal an independent computation on ``attention_maps``; the
    named sums reach the ranks in one reduce after the probe's."""
    from types import SimpleNamespace

    import torch

    from backbones import create_vit
    from lightning_modules.callbacks.dense_check import DenseProbeCheck
    from probes.core.features import normalize_images
    model = create_vit("vit_test_patch8", "softmax", seed=0).eval()
    seen = []
    model.patch_embed.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[0]))
    cb = DenseProbeCheck(data_root=str(small_voc), **CHECK)
    dm = cb.datamodule(model.patch_size)
    calls = []
    strategy = SimpleNamespace(reduce=lambda t, reduce_op: (calls.append(t.numel()), t)[1],  # 2 identical ranks
                               all_gather=lambda t: torch.stack([t, t]))
    module = SimpleNamespace(teacher=SimpleNamespace(backbone=model), device=torch.device("cpu"))
    one = cb.evaluate(SimpleNamespace(global_rank=0, world_size=1), module)
    assert sum(seen) == len(dm.train_set) + len(dm.val_set) == 2 * CHECK["max_samples"]
    D, n = model.embed_dim, CHECK["attn_images"]
    imgs = torch.stack([dm.val_set[i]["image"] for i in range(n)])
    with torch.no_grad():
        attns = model.attention_maps(normalize_images(imgs))  # (n, heads, T, T) per block
    ent = torch.stack([-(a.double() * a.double().clamp_min(1e-300).log()).sum(-1).mean((1, 2)) for a in attns])
    assert one["diffusion_attn_entropy"] == pytest.approx(ent.mean().item(), rel=1e-6)
    assert one["diffusion_attn_zero_share"] == 0.0  # softmax: no exact zeros
    two = cb.evaluate(SimpleNamespace(global_rank=0, world_size=2, strategy=strategy), module)
    C = dm.num_classes  # after the probe's reduces: every named sum and the retrieval confusion at once
    assert calls[-1] == 8 + D * D + C * C and 8 not in calls
    assert two["diffusion_attn_entropy"] == pytest.approx(ent[:, ::2].mean().item(), rel=1e-6)  # rank 0's shard


@pytest.mark.timeout(60)
def test_retrieval_hand_worked():
    """Memory: one training image, patch 2, two patches: A = (1, 0) with pixels 3 x class 0 + 1 x class 1 (label
    distribution (3/4, 1/4)), B = (0, 1) all class 1. Two validation images of one patch each, k = 2: q1 = (0.8, 0.6)
    (class 0), q2 = (0.6, 0.8) (class 1). At T = 0.1 q1's weights are softmax(8, 6) = (0.881, 0.119): class 0 gets
    0.881 * 3/4 = 0.661 > 0.339, q2 the mirror: class 1 → every pixel right, mIoU 100. At T = 1 q1's weights are
    softmax(0.8, 0.6) = (0.550, 0.450): class 0 gets 0.412 < 0.588, so both images say class 1: confusion
    [[0, 4], [0, 4]], either Hungarian map gives IoU 0 and 4/8 → mIoU 25."""
    import torch

    from lightning_modules.callbacks.dense_check import Retrieval
    train = torch.tensor([[1.0, 0.0], [0.0, 1.0]]).T.reshape(1, 2, 1, 2)  # (B, D, h, w): A left, B right
    train_mask = torch.tensor([[[0, 0, 1, 1], [0, 1, 1, 1]]])  # (1, 2, 4): patch A = 3 x 0 + 1 x 1
    val = torch.tensor([[0.8, 0.6], [0.6, 0.8]]).reshape(2, 2, 1, 1)
    val_masks = [torch.zeros(2, 2, dtype=torch.long), torch.ones(2, 2, dtype=torch.long)]
    for t, want, cm in ((0.1, 100.0, [[4, 0], [0, 4]]), (1.0, 25.0, [[0, 4], [0, 4]])):
        r = Retrieval(memory_size=100, n_train=1, num_patches=2, num_classes=2, patch=2, k=2, temperature=t)
        r.add_train(train, train_mask, [0])
        r.gather(2, torch.device("cpu"), 0, 1, None)
        assert sorted(r.memory[1].tolist()) == [[0.0, 1.0], [0.75, 0.25]]
        got = r.confusion(val, val_masks)
        assert got.tolist() == cm
        assert Retrieval.miou(got.double()) == pytest.approx(want, abs=1e-9)


@pytest.mark.timeout(300)
def test_retrieval_series_equals_the_probe_core_on_the_same_features(small_voc):
    """The check's retrieval mIoU from its shared forwards equals the retrieval probe's own core
    (``probes.headfree.retrieval``: memory_rows, memory_bank, confusion_of; Hungarian matching) run on FrozenFeatures of the
    same images, with a memory of 3 patches per image (so the per-image sampling matters)."""
    from types import SimpleNamespace

    import torch

    from backbones import create_vit
    from lightning_modules.callbacks.dense_check import DenseProbeCheck
    from probes.headfree import retrieval as hb
    from probes.core.features import FeatureSpec, FrozenFeatures
    from probes.headfree.matching import hungarian, matched_miou
    model = create_vit("vit_test_patch8", "softmax", seed=0).eval()
    cb = DenseProbeCheck(data_root=str(small_voc), **{**CHECK, "retrieval_memory": 15, "retrieval_k": 4})
    dm = cb.datamodule(model.patch_size)
    module = SimpleNamespace(teacher=SimpleNamespace(backbone=model), device=torch.device("cpu"))
    got = cb.evaluate(SimpleNamespace(global_rank=0, world_size=1), module)["dense_retrieval_mIoU"]
    features, C = FrozenFeatures(model, FeatureSpec(kind="dense", n_last_blocks=1, with_cls=False)), dm.num_classes
    train = [dm.train_set[i] for i in range(len(dm.train_set))]
    with torch.no_grad():
        ftr = features(torch.stack([x["image"] for x in train]))
        fva = features(torch.stack([dm.val_set[i]["image"] for i in range(len(dm.val_set))]))
    gens = [hb.image_generator(0, 0, i) for i in range(len(train))]
    f, y = hb.memory_rows(ftr, torch.stack([x["mask"] for x in train]), gens, 3, model.patch_size, C)
    assert f.shape[:2] == (len(train), 3)  # 15 patches / 5 images
    mem, lab = hb.memory_bank(f[:, None], y[:, None], 3)
    cm = hb.confusion_of(fva, [dm.val_set[i]["mask"] for i in range(len(dm.val_set))], mem, lab, C, k=4)
    assert got == pytest.approx(100 * matched_miou(cm, hungarian(cm))["mIoU"], abs=1e-9)
    assert 0 < got <= 100


def _worker(out: str, devices: int, root: str) -> None:
    """A LightningModule holding a random ``teacher.backbone``; one optimizer step of a dummy parameter (the
    backbone stays as it was), DenseProbeCheck at the start and the end; rank 0 writes the series."""
    import lightning as L
    import torch

    from backbones import create_vit
    from lightning_modules.callbacks.dense_check import DenseProbeCheck

    class Fake(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.teacher = torch.nn.Module()
            self.teacher.backbone = create_vit("vit_test_patch8", "entmax", seed=0).requires_grad_(False)
            self.w = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch, i):
            return (self.w ** 2).sum() + 0 * batch.sum()

        def configure_optimizers(self):
            return torch.optim.SGD([self.w], lr=0.1)

    cb = DenseProbeCheck(data_root=root, **CHECK)
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto", max_steps=1,
                        callbacks=[cb], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Fake(), torch.utils.data.DataLoader(torch.zeros(4, 1), batch_size=1))
    if trainer.global_rank == 0:
        Path(out).write_text(json.dumps(cb.series))


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_two_processes_equal_one(tmp_path, small_voc):
    import torch

    from helpers.procs import run
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}", OMP_NUM_THREADS="1")
    got = {}
    for n in (1, 2):
        out = tmp_path / f"series{n}.json"
        if n == 1:  # the reference in this process, on one thread as each rank below
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                _worker(str(out), 1, str(small_voc))
            finally:
                torch.set_num_threads(threads)
        else:
            r = run([sys.executable, __file__, str(out), str(n), str(small_voc)], timeout=500, cwd=REPO, env=env)
            assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
        got[n] = json.loads(out.read_text())
    assert [p["when"] for p in got[2]] == ["start", "end"] and all("dense_retrieval_mIoU" in p for p in got[2])
    for one, two in zip(got[1], got[2]):  # 5 + 5 images: shards of 3 and 2 images
        for k, v in one.items():
            if isinstance(v, str):
                assert two[k] == v
            elif k in ("dense_mIoU", "dense_aAcc", "dense_mAcc", "dense_retrieval_mIoU", "diffusion_pib_cls"):  # counts
                assert two[k] == pytest.approx(v, abs=1e-9), k
            elif not k.endswith("seconds"):  # other batches of float32 forwards: the last bits differ
                assert two[k] == pytest.approx(v, rel=1e-5), k


if __name__ == "__main__":
    _worker(sys.argv[1], int(sys.argv[2]), sys.argv[3])
