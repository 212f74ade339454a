"""Other projects' ViT checkpoints through ``CKPT=`` (``backbones.load.resolve_backbone``): timm checkpoints named
by their timm model (timm's own class with random weights; its features, timm's ``forward_features``, are the
reference at the native size and, resampled by timm's ``dynamic_img_size`` forward, at another), the key routes
of DINOv2's training checkpoints, refusals, and the probe and analysis CLIs on a DINOv2-with-registers file.
DINOv2 files against DINOv2's own forward: ``tests/test_foreign_dinov2.py``; DeiT and MAE files against their
repositories' models: ``tests/test_foreign_deit_mae.py``. No network."""
import functools
import hashlib
import re
import json
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import save_file

from backbones import read_checkpoint
from backbones.load import resolve_backbone
from tokenmix.io import CheckpointError

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "real"
pytestmark = pytest.mark.timeout(180)


@functools.lru_cache(maxsize=None)  # read-only sources, built once (ViT-S on 2 cores)
def _timm(name, **kw):
    torch.manual_seed(0)
    m = timm.create_model(name, pretrained=False, num_classes=0, **kw).eval()
    with torch.no_grad():  # timm zero-inits some tensors (pos_embed of no_embed_class, biases): make all count
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return m


def _ours(path, arch="vit_demo_patch8"):
    return resolve_backbone(str(path), "", arch, 16).model.eval()


@torch.no_grad()
def _assert_same_features(ours, ref_tokens, n_prefix, x):
    """Our [CLS] and patch features (registers removed) against the source's normed token outputs."""
    out = ours.extract(x)[-1]
    torch.testing.assert_close(out["cls"], ref_tokens[:, 0], atol=1e-5, rtol=0)
    torch.testing.assert_close(out["patch"], ref_tokens[:, n_prefix:], atol=1e-5, rtol=0)


@pytest.mark.slow  # ViT-S/14 at its native 518 px
@pytest.mark.parametrize("name,fmt,size", [("vit_small_patch14_reg4_dinov2", "safetensors", (224, 182)),
                                           ("deit3_small_patch16_224", "pth", (160, 160))])
def test_timm_checkpoint_by_name(tmp_path, name, fmt, size):
    """A timm model's own weights file with its timm name (--arch): timm's forward, resampling included."""
    src = _timm(name, dynamic_img_size=True)  # the registered shape (DINOv2: 518 px, a 37 x 37 grid)
    path = tmp_path / f"model.{fmt}"
    sd = {k: v.contiguous() for k, v in src.state_dict().items()}
    save_file(sd, path) if fmt == "safetensors" else torch.save(sd, path)
    info = resolve_backbone(str(path), "", name, 16)
    ours = info.model.eval()
    assert ours.backbone_config.pos_interp == "timm" and info.run_name == name  # its own run folder
    n = src.num_prefix_tokens
    s = src.patch_embed.img_size[0]
    x = torch.randn(1, 3, s, s)
    with torch.no_grad():
        _assert_same_features(ours, src.forward_features(x), n, x)
        x = torch.randn(1, 3, *size)  # timm resamples its position table to this grid
        _assert_same_features(ours, src.forward_features(x), n, x)


def test_unknown_layouts_are_refused(tmp_path):
    path = tmp_path / "other.pth"
    torch.save({"encoder.embed.weight": torch.zeros(2, 2), "encoder.blocks.0.w": torch.zeros(2)}, path)
    with pytest.raises(CheckpointError, match=r"unknown checkpoint layout \(keys: \['encoder.blocks.0.w', 'encoder."
                                              r"embed.weight'\]\); known layouts: timm .*dinov2 .*torchvision"):
        _ours(path)
    sd = _timm("vit_small_patch16_224", img_size=128).state_dict()
    torch.save({**sd, "cls_token_2": torch.zeros(1, 1, 384)}, path)  # a tensor no tokenmix ViT has
    with pytest.raises(CheckpointError, match=r"missing: \[\]\n  unexpected: \['cls_token_2'\]"):
        _ours(path)
    with pytest.raises(CheckpointError, match="vit_giant_patch14_dinov2.*MLP other than"):  # SwiGLU
        _ours(path, arch="vit_giant_patch14_dinov2")
    with pytest.raises(CheckpointError, match="neither a tokenmix arch .* nor a timm model"):
        _ours(path, arch="vit_nonesuch")


@pytest.fixture(scope="module")
def hub_ckpt(tmp_path_factory):
    """A DINOv2 ViT-S/14 + 4 registers in the hub layout, built by DINOv2's own module (``official/dinov2.py``) at
    112 px (an 8 x 8 table), random weights."""
    from official.dinov2 import DinoVisionTransformer, hub_settings
    path = tmp_path_factory.mktemp("foreign") / "dinov2_vits14_reg4.pth"
    torch.manual_seed(0)
    src = DinoVisionTransformer(**{**hub_settings("dinov2_vits14_reg"), "img_size": 112})
    with torch.no_grad():
        for p in src.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    torch.save(src.state_dict(), path)
    return path


@pytest.mark.slow
@pytest.mark.skipif(not (FIXTURES / "voc").is_dir(), reason=f"real-format fixtures not present at {FIXTURES}")
def test_probe_voc_fixture_with_dinov2_registers(hub_ckpt, tmp_path):
    """``make probe TASK=voc DATA=voc CKPT=<DINOv2 hub file>`` on the real VOC layout; a patch-14 model reads the
    probe input rounded down to a multiple of 14 (--img-size 64 -> 56: a 4 x 4 grid, position table resampled)."""
    from probes.run import main
    out = main(["--runs-dir", str(tmp_path / "runs"), "--task", "voc", "--ckpt", str(hub_ckpt), "--data", "voc",
                "--data-root", str(FIXTURES / "voc"), "--train-split", "train", "--img-size", "64",
                "--max-epochs", "1", "--batch-size", "2"])
    res = json.loads(Path(out).read_text())
    assert 0 <= res["metrics"]["mIoU"] <= 100
    assert res["backbone"]["sha256"] == hashlib.sha256(hub_ckpt.read_bytes()).hexdigest()
    assert res["backbone"]["config"]["arch"] == "vit_small_patch14"
    assert res["backbone"]["config"]["num_registers"] == 4 and res["variant"] == "dinov2_reg"
    from probes.run import build_context, parse_args  # the input the patch-14 model read: 64 px floored to 56
    args = parse_args(["--task", "voc", "--ckpt", str(hub_ckpt), "--data", "voc", "--data-root",
                       str(FIXTURES / "voc"), "--train-split", "train", "--img-size", "64"])
    assert tuple(build_context(args).dm.img_size) == (56, 56)


@pytest.mark.slow
@pytest.mark.skipif(not (FIXTURES / "voc").is_dir(), reason=f"real-format fixtures not present at {FIXTURES}")
def test_analysis_with_dinov2_registers(hub_ckpt, tmp_path, monkeypatch):
    """``make analyze TASK=pib CKPT=<DINOv2 hub file>``: the crop follows the checkpoint (112 px, 8 x 8 patches)."""
    from analysis import run as analysis_run
    from tokenmix import paths
    monkeypatch.setattr(paths, "RUNS", tmp_path / "runs")
    res = analysis_run.main(["--task", "pib", "--variant", "", "--ckpt", str(hub_ckpt), "--data", "voc",
                             "--data-root", str(FIXTURES / "voc"), "--split", "trainval", "--batch-size", "2",
                             "--no-tensorboard"])
    assert res["metrics"]["n_images"] == 3 and res["config"]["crop"] == 112 and res["variant"] == "dinov2_reg"
    assert res["backbone"]["sha256"] == hashlib.sha256(hub_ckpt.read_bytes()).hexdigest()


def test_random_baseline_of_a_timm_architecture():
    """``CKPT=random ARGS="--arch <timm name>"``: that architecture untrained, the same for the same seed."""
    a = resolve_backbone("random", "", "vit_small_patch14_reg4_dinov2", 16, seed=3)
    b = resolve_backbone("random", "", "vit_small_patch14_reg4_dinov2", 16, seed=3)
    assert a.config["variant"] == "registers" and a.model.patch_size == 14 and a.config["init_values"] == 1e-5
    assert all(torch.equal(p, q) for p, q in zip(a.model.state_dict().values(), b.model.state_dict().values()))


def test_dinov2_training_checkpoints_give_the_teacher_backbone(tmp_path):
    """DINOv2's training checkpoints: fvcore's ``{"model": {"teacher.backbone.*", "student.*", heads}}`` and
    ``eval/<it>/teacher_checkpoint.pth`` (``{"teacher": {"backbone.*", "dino_head.*", "ibot_head.*"}}``), blocks
    under ``block_chunks`` (``blocks.<chunk>.<N>``): the teacher's backbone tensors, nothing else."""
    from backbones import create_vit
    src = create_vit("vit_test_patch8", "registers", seed=0, num_registers=2, init_values=1e-5).state_dict()
    hub = {("register_tokens" if k == "reg_token" else re.sub(r"^blocks\.(\d+)\.", r"blocks.\1.\1.", k)): v
           for k, v in src.items()}  # 2 blocks in 2 chunks: blocks.0.0.*, blocks.1.1.*
    hub["mask_token"] = torch.zeros(1, 32)
    heads = {"dino_head.last_layer.weight": torch.ones(8, 32), "ibot_head.mlp.0.weight": torch.ones(8, 32)}
    full = {"model": {**{f"teacher.backbone.{k}": v for k, v in hub.items()},
                      **{f"student.backbone.{k}": v + 1 for k, v in hub.items()},
                      **{f"teacher.{k}": v for k, v in heads.items()}}, "iteration": 5}
    for name, obj in (("model_0000004.pth", full), ("teacher_checkpoint.pth",
                                                      {"teacher": {**{f"backbone.{k}": v for k, v in hub.items()},
                                                                   **heads}})):
        torch.save(obj, tmp_path / name)
        ck = read_checkpoint(tmp_path / name)
        assert ck.layout == "dinov2" and ck.config.num_registers == 2 and ck.config.arch == "vit_test_patch8"
        assert sorted(ck.state_dict) == sorted(src) and all(torch.equal(ck.state_dict[k], v) for k, v in src.items())
    assert read_checkpoint(tmp_path / "model_0000004.pth").progress == {"iteration": 5}
