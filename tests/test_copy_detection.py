"""Copydays copy detection against DINO's eval_copy_detection.py transcribed (official/dino_copy_detection.py):
per-block mAP to 1e-9 on random descriptors with uneven norms and an offset (whitening on and off) and on the
fixture end to end (DINO's resize, [CLS] + GeM features on facebookresearch/dino's ViT holding our weights,
whitening set, distractors, ``eval_result``); the dataset refuses strong images without an original and blocks
whose size differs from ``original``, naming them."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from datamodules.datasets.copydays import CopydaysDataset
from datamodules.errors import DatasetError
from helpers.retrieval_fixtures import vit_pair, write_copydays
from official import dino_copy_detection as C
from probes.instance.copy_detection import (CopyDetectionOptions, Whitening, copy_descriptor, copydays_ap,
                                   run_copy_detection, score_blocks)
from probes.instance.global_features import Extraction, extract_descriptors

pytestmark = pytest.mark.timeout(120)
BLOCKS = ("original", "strong", "jpegqual/50", "crops/50")


def _reference(root, database, queries_by_block, whitening_feats):
    """DINO's __main__ from the whitening on: block order of CopydaysDataset, absent blocks of size 0."""
    ds = C.CopydaysDataset(str(root))
    sizes = {b: len(q) for b, q in queries_by_block.items()}
    ds.q_block_sizes = np.array([sizes.get(b, 0) for b in ds.block_names])
    queries = torch.cat([queries_by_block[b] for b in ds.block_names if b in sizes])
    database, queries = database.clone(), queries.clone()
    if whitening_feats is not None:
        database, queries = C.whiten(database, queries, whitening_feats.clone())
    distances, indices = C.search(database, queries)
    with np.errstate(invalid="ignore"):  # the blocks this copy lacks: 0 / 0
        maps = ds.eval_result(indices, distances)
    return {b: maps[b] for b in sizes}


@pytest.mark.parametrize("whiten", [True, False])
def test_map_equals_dino_eval_result_on_random_descriptors(tmp_path, whiten):
    names = write_copydays(tmp_path, n_orig=6, n_distractors=0, n_whitening=0)
    rng = np.random.default_rng(int(whiten))
    dim, n_orig = 12, 6
    offset = rng.normal(0, 3, dim)  # a shared offset: the centring matters

    def feats(n):
        return torch.from_numpy(offset + rng.normal(size=(n, dim)) * np.exp(rng.normal(0, 1, (n, 1)))).float()
    originals = feats(n_orig)
    database = torch.cat([originals, feats(18)])  # 18 distractors: DINO takes the top 20
    queries = {"original": originals + 0.3 * feats(n_orig), "strong": feats(len(names["strong"])),
               "jpegqual/50": originals + 0.1 * feats(n_orig), "crops/50": feats(n_orig)}
    white = feats(40) if whiten else None
    ref = _reference(tmp_path, database, queries, white)
    positives = {b: CopydaysDataset(tmp_path, b).positives() for b in BLOCKS}
    ours = score_blocks(database, queries, positives, Whitening.learn(white) if whiten else None)
    for b in BLOCKS:
        assert ours[b] == pytest.approx(100 * ref[b], abs=1e-7), b
    assert 0 < ref["strong"] < 1  # neither trivial nor empty


def test_ap_hand_worked():
    # list 4, 1, 7 ; positives {1, 7, 9}: hits at ranks 1 and 2 of 3 positives
    ap = copydays_ap(np.array([[4, 1, 7]]), [[1, 7, 9]])
    assert ap[0] == pytest.approx(((0 / 1 + 1 / 2) / 2 + (1 / 2 + 2 / 3) / 2) / 3, abs=1e-12)


def test_fixture_equals_the_official_pipeline(tmp_path):
    write_copydays(tmp_path, n_orig=4, n_distractors=16, n_whitening=10, seed=2)
    model, ref = vit_pair(seed=2)
    imsize = 36  # not a multiple of the patch size: DINO's convolution drops the remainder
    listing = C.CopydaysDataset(str(tmp_path))
    feats = {b: C.extract_features(listing.get_block(listing.block_names.index(b)), ref, imsize, batch_size=3)
             for b in BLOCKS}
    distractors = sorted(str(p) for p in (tmp_path / "distractors").iterdir() if C.is_image_file(p.name))
    whitening = sorted(str(p) for p in (tmp_path / "whitening").iterdir() if C.is_image_file(p.name))
    database = torch.cat([feats["original"], C.extract_features(distractors, ref, imsize)])
    expected = _reference(tmp_path, database, feats, C.extract_features(whitening, ref, imsize))

    blocks = {b: CopydaysDataset(tmp_path, b, imsize=imsize) for b in BLOCKS}
    ours_strong = extract_descriptors(model, blocks["strong"], copy_descriptor, 4, Extraction())
    torch.testing.assert_close(ours_strong, feats["strong"], atol=2e-5, rtol=1e-5)
    out = run_copy_detection(model, blocks, CopyDetectionOptions(imsize=imsize, batch_size=3), Extraction(),
                             distractors=CopydaysDataset(tmp_path, "distractors", imsize=imsize),
                             whitening_set=CopydaysDataset(tmp_path, "whitening", imsize=imsize))
    for b in BLOCKS:
        assert out["mAP"][b] == pytest.approx(100 * expected[b], abs=1e-7), b
    assert out["num_database"] == 20 and out["num_whitening"] == 10


def test_dataset_refuses_unmatched_strong_and_short_blocks(tmp_path):
    write_copydays(tmp_path, n_orig=3, n_distractors=0, n_whitening=0)
    stray = tmp_path / "strong" / "999901.jpg"
    stray.write_bytes((tmp_path / "strong" / "200001.jpg").read_bytes())
    with pytest.raises(DatasetError, match=str(stray)):
        CopydaysDataset(tmp_path, "strong")
    (tmp_path / "crops" / "50" / "200100.jpg").unlink()
    with pytest.raises(DatasetError, match="crops/50: 2 images but original/ has 3"):
        CopydaysDataset(tmp_path, "crops/50")
    with pytest.raises(DatasetError, match="whitening"):
        CopydaysDataset(tmp_path, "whitening", whitening_root=tmp_path / "nowhere")


def test_check_data_lists_absent_blocks_as_notes_and_refuses_a_broken_one(tmp_path, capsys):
    from datamodules.check import main as check_data
    write_copydays(tmp_path, n_orig=2, n_distractors=2, n_whitening=2)
    argv = ["--task", "copydays", "--data-root", str(tmp_path), "--no-progress", "--jobs", "1"]
    assert check_data(argv) == 0  # jpegqual/3, crops/10, ... absent: notes
    (tmp_path / "strong" / "777701.jpg").write_bytes((tmp_path / "strong" / "200001.jpg").read_bytes())
    assert check_data(argv) == 1
    assert "777701.jpg: no original shares its 4-character prefix" in capsys.readouterr().out.replace("\n", "")


def _dinov2_hub_file(tmp_path):
    """A DINOv2 ViT-S/14 with 4 registers at a cheap shape, saved as torch.hub's plain state dict."""
    from official.dinov2 import DinoVisionTransformer, hub_settings
    torch.manual_seed(0)
    m = DinoVisionTransformer(**{**hub_settings("dinov2_vits14_reg"), "embed_dim": 128, "num_heads": 2, "depth": 2})
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    path = tmp_path / "dinov2_vits14_reg4_pretrain.pth"
    torch.save(m.state_dict(), path)
    return path


def test_make_probe_copydays_with_a_dinov2_hub_file(tmp_path):
    """`make probe TASK=copydays CKPT=<DINOv2 hub file>` on the fixture (registers left out of the GeM pool):
    results.json holds the block mAPs, equal to the probe run directly on the same backbone."""
    import json

    from backbones.load import resolve_backbone
    from probes.run import main
    write_copydays(tmp_path / "data", n_orig=4, n_distractors=16, n_whitening=10, seed=4)
    ckpt = _dinov2_hub_file(tmp_path)
    path = main(["--runs-dir", str(tmp_path / "runs"), "--task", "copydays", "--data", "copydays", "--data-root",
                 str(tmp_path / "data"), "--ckpt", str(ckpt), "--img-size", "44", "--accelerator", "cpu"])
    r = json.loads(path.read_text())
    assert r["task"] == "copydays" and r["variant"] == "dinov2_reg"
    assert set(r["metrics"]["mAP"]) == set(BLOCKS) and r["metrics"]["num_whitening"] == 10
    model = resolve_backbone(str(ckpt), "", "vit_small_patch16", 16).model
    blocks = {b: CopydaysDataset(tmp_path / "data", b, imsize=44) for b in BLOCKS}
    direct = run_copy_detection(model, blocks, CopyDetectionOptions(imsize=44), Extraction(),
                                CopydaysDataset(tmp_path / "data", "distractors", imsize=44),
                                CopydaysDataset(tmp_path / "data", "whitening", imsize=44))
    assert r["metrics"]["mAP"] == pytest.approx(direct["mAP"], abs=1e-9)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_processes_give_the_figures_of_one(tmp_path):
    """`--devices 2` (gloo, Lightning DDP): each process describes its shard, the rows are gathered in dataset
    order; every block's mAP equals the one-process run's (which also batches differently)."""
    import json
    import os
    import sys
    from pathlib import Path

    from helpers import procs
    from probes.run import main
    write_copydays(tmp_path / "data", n_orig=4, n_distractors=16, n_whitening=10, seed=5)
    argv = ["--task", "copydays", "--data", "copydays", "--data-root", str(tmp_path / "data"), "--ckpt", "random",
            "--arch", "vit_test_patch8", "--img-size", "36", "--accelerator", "cpu"]
    one = json.loads(main(["--runs-dir", str(tmp_path / "one"), *argv]).read_text())
    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(repo), OMP_NUM_THREADS="1")
    p = procs.run([sys.executable, "-m", "probes.run", "--runs-dir", str(tmp_path / "two"), "--devices", "2",
                   "--batch-size", "3", *argv], cwd=repo, env=env, timeout=380)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    found = sorted((tmp_path / "two").glob("*/probe/copydays/version_*/results.json"))
    assert len(found) == 1, found
    two = json.loads(found[0].read_text())
    assert two["metrics"]["mAP"] == one["metrics"]["mAP"]
    assert two["metrics"]["num_database"] == one["metrics"]["num_database"] == 20
