"""Revisited Oxford / Paris retrieval against the transcribed references (official/revisitop.py: revisitop's
``compute_map`` and protocol ground truth, DINO's eval_image_retrieval.py pipeline): mAP and mP@k to 1e-9 on random
rankings (overlapping and repeated lists included) and on the fixture end to end, descriptors with uneven norms;
the dataset refuses a missing image or a malformed ground-truth pickle, naming it."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from datamodules.datasets.revisitop import ROxford5kDataset, RParis6kDataset
from datamodules.errors import DatasetError, MissingDataError
from helpers.retrieval_fixtures import vit_pair, write_revisitop
from official import revisitop as R
from probes.instance.global_features import Extraction, extract_descriptors


@pytest.fixture(autouse=True)
def _pil_truncated_flag(monkeypatch):
    """revisitop's and DINO's loaders (official/revisitop.py) turn on PIL's process-wide LOAD_TRUNCATED_IMAGES;
    put it back after each test, so that later tests in this worker still see truncated files refused."""
    from PIL import ImageFile
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", ImageFile.LOAD_TRUNCATED_IMAGES)
from probes.instance.image_retrieval import (RevisitopProtocol, ImageRetrievalOptions, protocol_lists, rank_database,
                                    retrieval_descriptor, revisitop_map, run_image_retrieval)

pytestmark = pytest.mark.timeout(120)
NAMES = {RevisitopProtocol.EASY: "easy", RevisitopProtocol.MEDIUM: "medium", RevisitopProtocol.HARD: "hard"}


def _random_gnd(rng, n_db, nq):
    """Lists drawn with replacement (repeats, and easy/hard/junk overlapping) and some empty ones."""
    gnd = []
    for q in range(nq):
        sizes = rng.integers(0, 8, 3) if q % 4 else (0, 0, 3)  # every 4th query: no positives at all
        gnd.append({k: rng.integers(0, n_db, s) for k, s in zip(("easy", "hard", "junk"), sizes)})
    return gnd


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_map_equals_revisitop_compute_map_on_random_features(seed, monkeypatch):
    import probes.instance.image_retrieval as ir
    if seed == 2:
        monkeypatch.setattr(ir, "CHUNK", 80 * 2)  # queries scored 2 at a time (the last chunk: 1)
    rng = np.random.default_rng(seed)
    n_db, nq, dim = 80, 9, 16
    scale_db = np.exp(rng.normal(0, 1.5, (n_db, 1)))  # uneven norms: the ranking must be by cosine
    db = torch.from_numpy(rng.normal(size=(n_db, dim)) * scale_db).float()
    q = torch.from_numpy(rng.normal(size=(nq, dim)) * np.exp(rng.normal(0, 1.5, (nq, 1)))).float()
    ranks = rank_database(db, q)
    assert np.array_equal(ranks, R.dino_ranks(db, q))
    gnd = _random_gnd(rng, n_db, nq)
    for p in RevisitopProtocol:
        ref = R.compute_map(ranks, R.protocol_gnd(gnd, NAMES[p]), [1, 5, 10])
        ours = revisitop_map(ranks, protocol_lists(gnd, p), (1, 5, 10))
        assert ours[0] == pytest.approx(ref[0], abs=1e-9)
        np.testing.assert_allclose(ours[1], ref[1], atol=1e-9, equal_nan=True)
        np.testing.assert_allclose(ours[2], ref[2], atol=1e-9)
        np.testing.assert_allclose(ours[3], ref[3], atol=1e-9, equal_nan=True)


def test_map_hand_worked():
    # ranking 3, 0, 2, 1 ; positives {0, 1}, junk {2}: positive 0 at rank 1, positive 1 at rank 3 - 1 junk = 2
    ranks = np.array([[3], [0], [2], [1]])
    m, aps, _, prs = revisitop_map(ranks, [(np.array([0, 1]), np.array([2]))], (1, 2))
    # trapezoids: (0/1 + 1/2) / 2 * 1/2 + (1/2 + 2/3) / 2 * 1/2
    assert m == pytest.approx((0.5 / 2 + (0.5 + 2 / 3) / 2) / 2, abs=1e-12)
    assert prs[0].tolist() == pytest.approx([0.0, 0.5])


@pytest.mark.parametrize("multiscale,crop", [(False, True), (True, False)])
def test_fixture_equals_the_official_pipeline(tmp_path, multiscale, crop):
    """revisitop's configdataset + query crop, DINO's thumbnail / transform / [CLS] (multi-scale) / ranking on
    facebookresearch/dino's ViT holding our weights, and revisitop's compute_map, against our dataset and probe."""
    write_revisitop(tmp_path, "roxford5k", n_db=12, n_q=3, seed=3)
    model, ref = vit_pair(seed=1)
    imsize = 44  # below most fixture sides: every image is shrunk, to sides that are not multiples of 8
    cfg = R.configdataset("roxford5k", str(tmp_path))
    qims = [R.dino_image(R.load_query(cfg, i) if crop else cfg["qim_fname"](cfg, i), imsize)[None]
            for i in range(cfg["nq"])]
    dbims = [R.dino_image(cfg["im_fname"](cfg, i), imsize)[None] for i in range(cfg["n"])]
    fq, fdb = R.extract_features(ref, qims, multiscale), R.extract_features(ref, dbims, multiscale)
    ranks = R.dino_ranks(fdb, fq)

    db = ROxford5kDataset(tmp_path, "database", imsize=imsize)
    q = ROxford5kDataset(tmp_path, "query", imsize=imsize, crop_queries=crop)
    ours_q = extract_descriptors(model, q, lambda b, x: retrieval_descriptor(b, x, multiscale), 1, Extraction())
    torch.testing.assert_close(ours_q, fq, atol=2e-5, rtol=1e-5)
    out = run_image_retrieval(model, db, q, ImageRetrievalOptions(imsize=imsize, multiscale=multiscale, crop_queries=crop),
                              Extraction())
    for p in RevisitopProtocol:
        m = R.compute_map(ranks, R.protocol_gnd(cfg["gnd"], NAMES[p]), [1, 5, 10])
        assert out["mAP"][p.value] == pytest.approx(100 * m[0], abs=1e-7)
        assert list(out["mP@k"][p.value].values()) == pytest.approx(list(100 * m[2]), abs=1e-7)
    assert out["num_database"] == 12 and out["num_queries"] == 3


def test_dataset_refuses_missing_or_malformed_files(tmp_path):
    cfg = write_revisitop(tmp_path, "rparis6k", n_db=6, n_q=2)
    assert len(RParis6kDataset(tmp_path / "rparis6k", "database")) == 6  # DATA_ROOT may be the set's own folder
    missing = tmp_path / "rparis6k" / "jpg" / f"{cfg['imlist'][4]}.jpg"
    missing.unlink()
    with pytest.raises(MissingDataError, match=str(missing)):
        RParis6kDataset(tmp_path, "query")
    gnd_file = tmp_path / "rparis6k" / "gnd_rparis6k.pkl"
    bad = dict(cfg, gnd=[{k: v for k, v in g.items() if k != "bbx"} for g in cfg["gnd"]])
    gnd_file.write_bytes(pickle.dumps(bad))
    with pytest.raises(DatasetError, match="lacks \\['bbx'\\]"):
        RParis6kDataset(tmp_path, "query")
    cfg["gnd"][0]["junk"] = np.array([99])
    gnd_file.write_bytes(pickle.dumps(cfg))
    with pytest.raises(DatasetError, match="index 99 outside the database of 6"):
        RParis6kDataset(tmp_path, "database")
    with pytest.raises(MissingDataError, match="gnd_roxford5k.pkl"):
        ROxford5kDataset(tmp_path, "database")


def test_check_data_decodes_every_listed_image(tmp_path):
    """`make check-data TASK=roxford5k`: both splits pass, then a truncated database jpg is listed by name."""
    from datamodules.check import main as check_data
    cfg = write_revisitop(tmp_path, "roxford5k", n_db=5, n_q=2)
    assert check_data(["--task", "roxford5k", "--data-root", str(tmp_path), "--no-progress", "--jobs", "1"]) == 0
    bad = tmp_path / "roxford5k" / "jpg" / f"{cfg['imlist'][3]}.jpg"
    bad.write_bytes(bad.read_bytes()[:60])
    assert check_data(["--task", "roxford5k", "--data-root", str(tmp_path), "--no-progress", "--jobs", "1"]) == 1


def test_make_probe_writes_the_direct_runs_figures(tmp_path):
    """`make probe TASK=roxford5k` on the fixture (random ViT): results.json in the one schema holds E/M/H mAP,
    equal to the probe run directly on the same backbone."""
    import json

    from backbones.load import resolve_backbone
    from probes.run import main
    write_revisitop(tmp_path / "data", "roxford5k", n_db=12, n_q=3, seed=3)
    path = main(["--runs-dir", str(tmp_path / "runs"), "--task", "roxford5k", "--data", "roxford5k", "--data-root",
                 str(tmp_path / "data"), "--ckpt", "random", "--arch", "vit_test_patch8", "--img-size", "44",
                 "--accelerator", "cpu"])
    r = json.loads(path.read_text())
    assert r["task"] == "roxford5k" and set(r["metrics"]["mAP"]) == {"E", "M", "H"}
    assert r["metrics"]["crop_queries"] and not r["metrics"]["multiscale"]  # Oxford: DINO's single scale
    model = resolve_backbone("random", "softmax", "vit_test_patch8", 8, seed=0).model
    db = ROxford5kDataset(tmp_path / "data", "database", imsize=44)
    direct = run_image_retrieval(model, db, ROxford5kDataset(tmp_path / "data", "query", imsize=44),
                                 ImageRetrievalOptions(imsize=44), Extraction())
    assert r["metrics"]["mAP"] == pytest.approx(direct["mAP"], abs=1e-9)
