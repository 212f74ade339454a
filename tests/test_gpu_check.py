"""``make gpu-check``: skips cleanly without a GPU, and its CPU rehearsal (``--smoke``) runs the same plan end to end.

The rehearsal is what lets a session with a GPU lent for minutes trust the script: every part (a)-(e) runs at
tiny sizes (the Triton rows in Triton's interpreter), each part's JSON and table are written, and the combined
table comes last. Values are checked where they mean something on a CPU: the kernel against the ``entmax``
library, and part (d)'s module step against the transcribed main_dino.py step (same step-1 loss).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from helpers import procs

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**env, **extra}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
@pytest.mark.timeout(120)
@pytest.mark.slow
def test_gpu_check_skips_cleanly_without_a_gpu(tmp_path):
    proc = procs.run([sys.executable, "-m", "gpu_check", "--out", str(tmp_path / "o")], cwd=ROOT,
                     timeout=110, env=_env())
    assert proc.returncode == 0 and proc.stdout.strip() == "no CUDA GPU: skipped", proc.stdout + proc.stderr
    assert not (tmp_path / "o").exists()


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    proc = procs.run([sys.executable, "-m", "gpu_check", "--smoke", "--out", str(out)], cwd=ROOT,
                     timeout=840, env=_env(TRITON_INTERPRET="1"))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    return out, proc.stdout, {p: json.loads((out / f"part_{p}.json").read_text()) for p in "abcde"}


def _rows(parts, p):
    rows = parts[p]["rows"]
    assert not [r for r in rows if "error" in r or "skipped" in r], rows
    return rows


@pytest.mark.timeout(900)
def test_every_part_writes_its_json_and_table_and_the_table_comes_last(rehearsal):
    out, stdout, parts = rehearsal
    for p in "abcde":
        table = (out / f"part_{p}.md").read_text()
        assert table.startswith(f"### ({p})") and "|---|" in table
        assert parts[p]["part"] == p and parts[p]["rows"]
    summary = json.loads((out / "gpu_check.json").read_text())
    assert [r["part"] for r in summary["parts"]] == list("abcde") and summary["smoke"] is True
    combined = (out / "gpu_check.md").read_text().strip()
    assert stdout.rstrip().endswith(combined.splitlines()[-1]) and combined.startswith("## make gpu-check --smoke")
    assert not list(out.glob(".*.tmp"))


@pytest.mark.timeout(900)
def test_kernel_rows_cover_every_normaliser_dtype_and_row_shape(rehearsal):
    rows = _rows(rehearsal[2], "a")
    assert {(r["kind"], r["dtype"], r["rows"]) for r in rows} == {
        (k, d, s) for k in ("entmax15", "sparsemax") for d in ("bfloat16", "float32")
        for s in ("peaked", "flat", "one query")}
    assert all(r["ok"] for r in rows), rows
    kept = {r["rows"]: r["kept"] for r in rows if r["kind"] == "entmax15" and r["dtype"] == "float32"}
    assert kept["flat"] > 0.9 and kept["peaked"] < 0.5  # the two row shapes really differ in sparsity


@pytest.mark.timeout(900)
def test_op_vit_and_demo_parts_measured_something(rehearsal):
    parts = rehearsal[2]
    b = _rows(parts, "b")
    assert {(r["op"], r["mode"]) for r in b} == {(o, m) for o in ("SDPA flash", "Triton entmax15")
                                                 for m in ("forward", "forward+backward")}
    assert all(r["ms"] > 0 for r in b) and all(r["x SDPA flash (time)"] == 1 for r in b if r["op"] == "SDPA flash")
    c = _rows(parts, "c")
    assert [r["variant"] for r in c] == ["softmax", "entmax"] and all(r["ms"] > 0 for r in c)
    e = _rows(parts, "e")
    assert [r["step"] for r in e] == ["make pretrain", "make probe TASK=voc"] and all(r["exit"] == 0 for r in e)
    assert isinstance(e[0]["k-NN gain"], float) and 0 <= e[0]["k-NN end"] <= 100
    assert isinstance(e[1]["mIoU"], float) and e[1]["mIoU"] >= 0


@pytest.mark.timeout(900)
def test_dino_part_compares_the_module_with_the_transcribed_main_dino_step(rehearsal):
    d = _rows(rehearsal[2], "d")
    compute = [r for r in d if "path" in r]
    assert {(r["precision"], r["path"]) for r in compute} == {
        (p, n) for p in ("bf16-mixed", "16-mixed") for n in
        ("main_dino.py step (transcribed) softmax", "DINOPretrainModule softmax", "DINOPretrainModule entmax")}
    assert all(r["images/s (compute ceiling)"] > 0 for r in compute)
    module = [r for r in compute if r["path"] == "DINOPretrainModule softmax"]
    assert all(r["ok"] for r in module), module  # same step-1 loss as the independent official step
    data = [r for r in d if "augment_on" in r]
    assert sorted(r["augment_on"] for r in data) == ["cpu", "gpu"]
    assert all(r["images/s (data ceiling)"] > 0 for r in data)
