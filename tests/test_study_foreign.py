"""Given checkpoint files as rows of a study (``--checkpoint NAME=FILE[:TIMM_NAME]``): every task once on the file,
no pretraining, keyed by the file's sha256, refused in the launching process when the file is missing or of an
unknown layout, and a row of its own in the report. The files are built here with random weights: a DINOv2
torch.hub state dict (registers, LayerScale) and a timm model's safetensors. Unit tier: planning, and the local
runner with its subprocesses replaced by a fake that writes what probes.run writes; slow tier: the real CLIs."""
import csv
import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import save_file

import study.local
from study.__main__ import main, parse_checkpoint
from study.plan import Spec, plan

REPO = Path(__file__).resolve().parents[1]
TIMM_NAME = "vit_tiny_patch16_224"


def _sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _small_hub(path: Path, seed: int = 0) -> Path:
    """DINOv2's hub layout (register_tokens, mask_token, ls gammas, [CLS] position), built by DINOv2's own module
    (``official/dinov2.py``) at the demo ViT's shapes."""
    return _dinov2_hub(path, seed, img_size=64, patch_size=8, embed_dim=128, depth=4, num_heads=2, init_values=1e-5)


def _dinov2_hub(path: Path, seed: int = 0, **shape) -> Path:
    """A ``dinov2_vits14_reg`` hub file (``shape`` overrides its shape), random weights."""
    from official.dinov2 import DinoVisionTransformer, hub_settings
    torch.manual_seed(seed)
    m = DinoVisionTransformer(**{**hub_settings("dinov2_vits14_reg"), **shape})
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    torch.save(m.state_dict(), path)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpts")
    tiny = d / "tiny.safetensors"
    save_file({k: v.contiguous() for k, v in timm.create_model(TIMM_NAME, num_classes=0).state_dict().items()},
              tiny)
    return {"hub": _small_hub(d / "hub.pth"), "timm": tiny}


def _spec(tmp_path, files, variants=("softmax",), tasks=("knn", "pib")):
    return Spec.create(name="f", variants=list(variants), seeds=[0, 1], tasks=list(tasks), preset="tiny",
                       root=tmp_path / "f", checkpoints=[("dinov2_reg", str(files["hub"]), ""),
                                                         ("vitt", str(files["timm"]), TIMM_NAME)])


def _flag(cmd, name):
    return next((cmd[i + 1] for i, a in enumerate(cmd) if a == name), None)


@pytest.mark.timeout(120)
def test_parse_checkpoint():
    assert parse_checkpoint("v=/a/m.safetensors:vit_small_patch14_reg4_dinov2") == \
        ("v", "/a/m.safetensors", "vit_small_patch14_reg4_dinov2")
    assert parse_checkpoint("d=/a/hub.pth") == ("d", "/a/hub.pth", "")
    assert parse_checkpoint("d=c:/dir/hub.pth") == ("d", "c:/dir/hub.pth", "")  # a folder after ':', not a name
    for bad in ("hub.pth", "=hub.pth", "d="):
        with pytest.raises(ValueError, match="NAME=FILE"):
            parse_checkpoint(bad)


@pytest.mark.timeout(120)
def test_plan_adds_one_cell_per_task_and_file(tmp_path, files):
    spec = _spec(tmp_path, files)
    cells = {c.id: c for c in plan(spec)}
    assert list(cells) == ["pretrain.softmax.seed0", "pretrain.softmax.seed1", "knn.softmax.seed0",
                           "knn.softmax.seed1", "knn.dinov2_reg", "knn.vitt", "pib.softmax.seed0",
                           "pib.softmax.seed1", "pib.dinov2_reg", "pib.vitt"]
    hub, tiny = cells["knn.dinov2_reg"], cells["pib.vitt"]
    assert hub.depends == "" and hub.kind == "probe" and hub.checkpoint == files["hub"].resolve()
    assert hub.sha256 == _sha(files["hub"]) and tiny.sha256 == _sha(files["timm"])
    cmd = hub.command("py")
    assert cmd[:3] == ["py", "-m", "probes.run"] and _flag(cmd, "--ckpt") == str(files["hub"].resolve())
    assert "--arch" not in cmd and "--variant" not in cmd  # the hub layout says what it is
    assert _flag(cmd, "--seed") == "0" and _flag(cmd, "--runs-dir") == str(spec.root / "checkpoints" / "dinov2_reg")
    cmd = tiny.command("py")
    assert cmd[:3] == ["py", "-m", "analysis.run"] and _flag(cmd, "--ckpt") == str(files["timm"].resolve())
    assert _flag(cmd, "--arch") == TIMM_NAME and tiny.env["TOKENMIX_RUNS"] == str(spec.root / "checkpoints/vitt")
    # the variants' cells are the ones of the same study without the files (same keys: finished cells kept)
    plain = {c.id: c for c in plan(Spec.create(name="f", variants=["softmax"], seeds=[0, 1], tasks=["knn", "pib"],
                                               preset="tiny", root=tmp_path / "f"))}
    assert all(cells[i] == c for i, c in plain.items())


@pytest.mark.timeout(120)
def test_key_follows_the_file_contents(tmp_path, files):
    spec = _spec(tmp_path, files, variants=(), tasks=("knn",))
    other = _small_hub(tmp_path / "other.pth", seed=1)
    moved = tmp_path / "moved.pth"
    moved.write_bytes(files["hub"].read_bytes())
    key = lambda f: plan(Spec.create(name="f", variants=[], seeds=[0], tasks=["knn"], preset="tiny",  # noqa: E731
                                     root=tmp_path / "f", checkpoints=[("dinov2_reg", str(f), "")]))[0].key
    assert [c.id for c in plan(spec)] == ["knn.dinov2_reg", "knn.vitt"]  # no variant: no pretraining cell
    assert key(moved) == key(files["hub"]) == plan(spec)[0].key  # same bytes elsewhere: the same cell
    assert key(other) != key(files["hub"])


@pytest.mark.timeout(120)
def test_bad_files_are_refused_before_anything_runs(tmp_path, files, capsys):
    unknown = tmp_path / "unknown.pth"
    torch.save({"encoder.weight": torch.zeros(2, 2)}, unknown)
    base = ["--name", "b", "--root", str(tmp_path / "b"), "--variants", "softmax", "--seeds", "1", "--tasks", "knn",
            "--preset", "tiny"]
    cases = [(f"x={tmp_path / 'missing.pth'}", ["--checkpoint x: no file", "missing.pth"]),
             (f"x={unknown}", ["--checkpoint x:", "unknown checkpoint layout", "encoder.weight", "known layouts",
                               "dinov2"]),
             (f"x={files['timm']}:vit_small_patch16_224", ["--checkpoint x:", "shape mismatch"]),
             (f"x={files['timm']}:no_such_model", ["--checkpoint x:", "no_such_model"]),
             (f"softmax={files['hub']}", ["already a variant"])]
    for value, words in cases:
        assert main(base + ["--checkpoint", value]) == 2
        err = capsys.readouterr().err
        assert all(w in err for w in words), (value, err)
    assert not (tmp_path / "b").exists()  # nothing planned, nothing written


class FakeProbes:
    """Stands in for subprocess.Popen: the pretraining CLI writes last.ckpt (its bytes: the seed flag), probes.run
    a results.json (k-NN top-1 by the checkpoint's sha256) under <runs-dir>/<run name>/probe/knn/version_N."""

    def __init__(self, values):
        self.values, self.calls = values, []

    def __call__(self, cmd, stdout=None, stderr=None, cwd=None, env=None):
        from tokenmix.results import backbone_entry, results_payload
        self.calls.append(list(cmd))
        if cmd[2] == "lightning_modules.pretrain":
            eq = {a.split("=")[0]: a for a in cmd if "=" in a}
            ck = (Path(_flag(cmd, "--runs-dir")) / "softmax" / "pretrain" / "tiny"
                  / eq["--trainer.logger.version"].split("=")[1] / "checkpoints" / "last.ckpt")
            ck.parent.mkdir(parents=True, exist_ok=True)
            ck.write_bytes(eq["--seed_everything"].encode())
        else:
            ckpt = Path(_flag(cmd, "--ckpt"))
            folder = Path(_flag(cmd, "--runs-dir")) / ckpt.stem / "probe" / "knn"
            out = folder / f"version_{len(list(folder.glob('version_*')))}"
            out.mkdir(parents=True)
            body = results_payload(task="knn", variant=ckpt.stem, data="demo",
                                   metrics={"top1": {"20": self.values[_sha(ckpt)]}},
                                   backbone=backbone_entry({}, str(ckpt), _sha(ckpt)), config={})
            (out / "results.json").write_text(json.dumps(body))
        self.returncode = 0
        return self

    def poll(self):
        return self.returncode

    wait = poll

    def terminate(self):
        pass


@pytest.mark.timeout(180)
def test_runs_once_reuses_and_reports_a_row(tmp_path, files, monkeypatch, capsys):
    hub = tmp_path / "hub.pth"
    hub.write_bytes(files["hub"].read_bytes())
    values = {hashlib.sha256(b"--seed_everything=0").hexdigest(): 80.0,
              hashlib.sha256(b"--seed_everything=1").hexdigest(): 82.0, _sha(hub): 61.25}
    fake = FakeProbes(values)
    monkeypatch.setattr(study.local.subprocess, "Popen", fake)
    monkeypatch.setattr(study.local.time, "sleep", lambda s: None)
    argv = ["--name", "r", "--root", str(tmp_path / "r"), "--out", str(tmp_path / "rep"), "--variants", "softmax",
            "--seeds", "2", "--tasks", "knn", "--preset", "tiny", "--no-tensorboard", "--checkpoint",
            f"dinov2_reg={hub}"]
    assert main(argv + ["--dry-run"]) == 0 and fake.calls == []
    out = capsys.readouterr().out
    assert "2 pretraining runs + 1 checkpoints, 1 tasks -> 3 evaluations" in out
    line = next(x for x in out.splitlines() if "knn.dinov2_reg" in x)
    assert line.split()[:2] == ["to", "run"] and f"--ckpt {hub}" in line
    assert main(argv) == 0
    assert [c[2] for c in fake.calls] == ["lightning_modules.pretrain"] * 2 + ["probes.run"] * 3
    md = (tmp_path / "rep" / "study.md").read_text()
    # softmax 80, 82: mean 81, std sqrt(2); the file's one run: 61.25, no std, not in the Δ table or verdicts
    assert "| softmax | 81.00 ± 1.41 (n=2) |" in md
    assert "| dinov2_reg (checkpoint) | 61.25 (single run) |" in md
    assert md.count("dinov2_reg (checkpoint)") == 1 and "dinov2_reg vs" not in md
    assert f"- `dinov2_reg`: `<…>/hub.pth`, sha256 {_sha(hub)[:12]}" in md and "no std over seeds" in md
    assert str(hub) not in md and "--checkpoint 'dinov2_reg=<…>/hub.pth'" in md  # no machine's own paths
    rows = list(csv.reader((tmp_path / "rep" / "study.csv").open()))
    assert [r[4:7] for r in rows if r[:2] == ["checkpoint", "dinov2_reg"]] == [["1", "61.25", ""]]

    fake.calls.clear()
    assert main(argv) == 0 and fake.calls == []  # all reused
    assert "done 5/5 cells" in capsys.readouterr().out
    hub.write_bytes(_small_hub(tmp_path / "new.pth", seed=2).read_bytes())  # same name, other weights
    values[_sha(hub)] = 70.0
    assert main(argv) == 0
    assert len(fake.calls) == 1 and _flag(fake.calls[0], "--ckpt") == str(hub)  # only the file's cell re-ran
    assert "| dinov2_reg (checkpoint) | 70.00 (single run) |" in (tmp_path / "rep" / "study.md").read_text()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_study_evaluates_a_dinov2_hub_file(tmp_path, files):
    """The real CLIs: a DINOv2-with-registers ViT-S/14 in the hub layout and a timm file named by its timm model,
    k-NN on a small demo set, no variant; the report's rows are the probes' own results."""
    from datamodules.demo import DemoSpec, ensure_demo_data
    from helpers import procs
    hub = tmp_path / "dinov2_vits14_reg4.pth"
    _dinov2_hub(hub, img_size=112)
    small = ensure_demo_data(tmp_path / "demo", spec=DemoSpec(cls_train=4, cls_val=2, voc_train=2, voc_val=2,
                                                                nyu_train=2, nyu_test=2))
    argv = [sys.executable, "-m", "study", "--name", "fx", "--root", str(tmp_path / "study"), "--out",
            str(tmp_path / "rep"), "--variants", "", "--tasks", "knn", "--task-data", f"knn=demo:{small}",
            "--probe-args=--knn-k 2,20", "--no-tensorboard", "--checkpoint", f"dinov2_reg={hub}",
            "--checkpoint", f"vitt={files['timm']}:{TIMM_NAME}"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    dry = procs.run(argv + ["--dry-run"], cwd=REPO, env=env, timeout=200)
    assert dry.returncode == 0, dry.stderr[-3000:]
    lines = {x.split()[2]: x for x in dry.stdout.splitlines() if x.startswith("  to run")}
    assert set(lines) == {"knn.dinov2_reg", "knn.vitt"}
    assert f"--ckpt {hub}" in lines["knn.dinov2_reg"] and "--arch" not in lines["knn.dinov2_reg"]
    assert f"--ckpt {files['timm'].resolve()} --arch {TIMM_NAME}" in lines["knn.vitt"]

    run = procs.run(argv, cwd=REPO, env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    md = (tmp_path / "rep" / "study.md").read_text()
    for name, path in (("dinov2_reg", hub), ("vitt", files["timm"])):
        res = list((tmp_path / "study" / "checkpoints" / name).glob("*/probe/knn/version_*/results.json"))
        assert len(res) == 1, res
        body = json.loads(res[0].read_text())
        assert body["backbone"]["sha256"] == _sha(path)
        assert f"| {name} (checkpoint) | {body['metrics']['top1']['20']:.2f} (single run) |" in md
