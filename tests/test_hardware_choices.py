"""No silent hardware choices: a real dataset never falls back to the CPU unseen, DINO's
``deterministic: true`` is refused on CUDA before any process starts, and the checkpoint's backend record says
what ran. The CUDA side is rehearsed on this CPU host by patching ``torch.cuda.is_available``."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch

from lightning_modules.cli import PretrainCLI
from lightning_modules.pretrain import parse_launch
from tokenmix.launch import LaunchError

REPO = Path(__file__).resolve().parents[1]


def _driver_text() -> str:
    """What torch's CUDA initialisation says here, read independently of tokenmix.launch."""
    try:
        torch.cuda.init()
    except Exception as e:  # noqa: BLE001
        return str(e).strip()
    return ""


def _plan(tmp_path, *args):
    """The configuration the run would use, resolved and checked, nothing built."""
    return PretrainCLI(parse_launch(["--runs-dir", str(tmp_path), *args]), build=False).config


@pytest.mark.slow  # LightningCLI's parser starts a Python process (jsonargparse's stub resolver)
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host where torch sees no GPU")
def test_real_data_on_the_cpu_needs_an_explicit_accelerator(fixtures_root, tmp_path):
    real = ["--data", "imagenet", "--data-root", str(fixtures_root / "imagenet")]
    with pytest.raises(LaunchError) as err:
        _plan(tmp_path, *real)  # the paper preset: accelerator auto
    msg = str(err.value)
    assert f"built for CUDA {torch.version.cuda}" in msg and "torch.cuda.is_available() is False" in msg, msg
    assert _driver_text() and _driver_text() in msg, msg  # e.g. "Found no NVIDIA driver on your system"
    assert "--trainer.accelerator=cpu" in msg
    cpu_yaml = tmp_path / "cpu.yaml"
    cpu_yaml.write_text("trainer:\n  accelerator: cpu\n")
    for explicit in (["--trainer.accelerator=cpu"], ["--trainer.accelerator", "cpu"], ["--config", str(cpu_yaml)]):
        config = _plan(tmp_path, *real, *explicit)
        assert (config.trainer.accelerator, config.trainer.precision) == ("cpu", "32-true")  # the chosen CPU run
    assert _plan(tmp_path, *real, "--config", str(cpu_yaml), "--trainer.precision=bf16-mixed").trainer.precision \
        == "bf16-mixed"  # a precision the user sets is kept
    _plan(tmp_path, "--data", "demo")  # the demo data: auto may pick the CPU
    with pytest.raises(LaunchError, match="would train on the CPU"):  # a GPU asked for, none usable
        _plan(tmp_path, *real, "--trainer.accelerator=gpu")


@pytest.mark.slow  # LightningCLI's parser starts a Python process (jsonargparse's stub resolver)
def test_cpu_only_torch_build_is_named(monkeypatch, fixtures_root, tmp_path):
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(LaunchError, match=r"is a CPU-only build \(torch.version.cuda is None\)"):
        _plan(tmp_path, "--data", "imagenet", "--data-root", str(fixtures_root / "imagenet"))


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host where torch sees no GPU")
def test_make_pretrain_on_imagenet_is_refused_within_a_minute(fixtures_root, tmp_path):
    if shutil.which("make") is None:
        pytest.skip("no make")
    t0 = time.monotonic()
    p = subprocess.run(["make", "-s", "pretrain", "DATA=imagenet", f"DATA_ROOT={fixtures_root / 'imagenet'}",
                        f"ARGS=--runs-dir {tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=90,
                       env={**os.environ, "MAKEFLAGS": ""})
    took = time.monotonic() - t0
    assert p.returncode != 0 and took < 60, (took, p.stdout[-2000:], p.stderr[-2000:])
    assert "error: DATA=imagenet would train on the CPU" in p.stderr and f"CUDA {torch.version.cuda}" in p.stderr
    assert not list(tmp_path.rglob("*.ckpt")) and not list(tmp_path.rglob("version_*"))  # nothing started


@pytest.mark.slow  # LightningCLI's parser starts a Python process (jsonargparse's stub resolver)
def test_deterministic_dino_on_cuda_is_refused_with_the_reason(monkeypatch, tmp_path):
    # the reason, as torch documents it: bicubic interpolate has no deterministic CUDA backward
    doc = torch.use_deterministic_algorithms.__doc__
    raising = doc[doc.index("will throw a"):]
    assert "interpolate" in raising and "bicubic" in raising[:raising.index("ReflectionPad1d")]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(LaunchError, match=r"deterministic=true cannot train DINO on CUDA.*bicubic"):
        _plan(tmp_path, "--data", "demo", "--trainer.deterministic=true")
    with pytest.raises(LaunchError, match="upsample_bicubic2d_backward_out_cuda"):
        _plan(tmp_path, "--data", "demo", "--preset", "tiny", "--trainer.accelerator=gpu")  # tiny: deterministic
    _plan(tmp_path, "--data", "demo", "--trainer.deterministic=warn")
    _plan(tmp_path, "--data", "demo", "--preset", "tiny")  # tiny: deterministic on the CPU: fine
    _plan(tmp_path, "--objective", "supervised", "--data", "demo", "--trainer.deterministic=true",
          "--trainer.accelerator=gpu")  # 224 px only: no interpolation, the atomic-free Triton backward


def test_the_bicubic_interpolation_is_what_dino_local_crops_run():
    """The refusal's premise: a 96 px crop (6 x 6 patches) of a 224 px ViT-S/16 interpolates (14 x 14 -> 6 x 6),
    a 224 px crop does not."""
    import backbones
    vit = backbones.create_vit("vit_small_patch16", "softmax")
    assert vit.interpolate_pos_encoding(14, 14) is vit.pos_embed
    assert vit.interpolate_pos_encoding(6, 6).shape == (1, 37, 384)


def test_the_backend_record_says_cuda_on_a_gpu():
    """``runtime_record`` of a model whose weights are on a GPU: ``cuda`` (its F.linear ran there), whatever the
    host CPU's vendor would resolve ``auto`` to."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    import backbones
    from backbones.checkpoint import runtime_record
    model = backbones.create_vit("vit_test_patch8", "softmax", linear_backend="onednn")
    assert runtime_record(model) == {"linear_backend": "onednn"}  # on the CPU: what runs there
    with FakeTensorMode(allow_non_fake_inputs=True):
        on_gpu = model.to("cuda")
        assert next(on_gpu.parameters()).is_cuda
        assert runtime_record(on_gpu) == {"linear_backend": "cuda"}
