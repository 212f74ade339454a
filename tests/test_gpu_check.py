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
    shapes = ("peaked", "flat", "one query")
    # the paper's combinations first (16-bit, entmax-1.5 then sparsemax), fp32 last: a budget cut drops fp32
    want = [(k, d, s) for k in ("entmax15", "sparsemax") for d in ("bfloat16", "float16") for s in shapes] + \
        [(k, "float32", s) for k in ("entmax15", "sparsemax") for s in shapes]
    assert [(r["kind"], r["dtype"], r["rows"]) for r in rows] == want
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
    assert e[0]["demo data s (untimed)"] >= 0  # generated before the timed commands
    assert isinstance(e[0]["k-NN gain"], float) and 0 <= e[0]["k-NN end"] <= 100
    assert isinstance(e[1]["mIoU"], float) and e[1]["mIoU"] >= 0


@pytest.mark.timeout(900)
def test_dino_part_compares_the_module_with_the_transcribed_main_dino_step(rehearsal):
    d = _rows(rehearsal[2], "d")
    compute = [r for r in d if "path" in r]
    paths = [f"main_dino.py step (transcribed) {v}" for v in ("softmax", "entmax")] + \
        [f"DINOPretrainModule {v}" for v in ("softmax", "entmax")]
    # 16-mixed (the paper preset's) first; on the CPU too it is fp16 autocast with a GradScaler, not bf16
    assert [(r["precision"], r["path"]) for r in compute] == [(p, n) for p in ("16-mixed", "bf16-mixed")
                                                              for n in paths]
    assert {r["autocast"] for r in compute if r["precision"] == "16-mixed"} == {"float16 + GradScaler"}
    assert {r["autocast"] for r in compute if r["precision"] == "bf16-mixed"} == {"bfloat16"}
    assert all(r["images/s (compute ceiling)"] > 0 for r in compute)
    module = [r for r in compute if r["path"].startswith("DINOPretrainModule")]
    assert len(module) == 4 and all(r["ok"] for r in module), module  # same step-1 loss as the official step
    data = [r for r in d if "augment_on" in r]
    assert sorted(r["augment_on"] for r in data) == ["cpu", "gpu"]
    assert all(r["images/s (data ceiling)"] > 0 for r in data)


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_a_skipped_kernel_row_fails_the_check(tmp_path):
    """Part (a) with no time: every row skipped, and the check exits 1 (an unchecked kernel is not a pass)."""
    proc = procs.run([sys.executable, "-m", "gpu_check", "--smoke", "--parts", "a", "--budget", "a=0",
                      "--out", str(tmp_path)], cwd=ROOT, timeout=280, env=_env(TRITON_INTERPRET="1"))
    rows = json.loads((tmp_path / "part_a.json").read_text())["rows"]
    assert rows and all(r["skipped"] == "budget" for r in rows), rows
    assert proc.returncode == 1 and "gpu-check FAILED" in proc.stderr, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_failures_count_skipped_rows_only_in_part_a():
    from gpu_check.check import failures
    res = [{"part": "a", "rows": [{"kind": "entmax15", "ok": True}]},
           {"part": "e", "rows": [{"step": "make probe TASK=voc", "skipped": "budget"}]}]
    assert failures(res) == []
    res[0]["rows"].append({"kind": "sparsemax", "skipped": "budget"})
    res.append({"part": "d", "rows": [{"path": "x", "ok": False}, {"error": "E"}]})
    assert failures(res) == [res[0]["rows"][1], *res[2]["rows"]]


def test_preflight_names_missing_modules_before_touching_cuda(monkeypatch, tmp_path, capsys):
    from gpu_check import check
    assert check.preflight("abcde") == []  # this venv has every module every part imports
    monkeypatch.setitem(check.REQUIRES, "a", ("triton", "no_such_module_p42"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("CUDA touched before the preflight"))
    assert check.main(["--parts", "a", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "no_such_module_p42" in err and "triton" not in err.split("modules")[1].split(":")[0]
    assert "make gpu-wheels" in err and not (tmp_path / "o").exists()
