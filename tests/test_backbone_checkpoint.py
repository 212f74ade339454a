"""Checkpoint import: project format, metadata checks and refusal of unusable files."""
import argparse
from pathlib import Path

import pytest
import torch

import backbones
from tokenmix.io import CheckpointError


def _project_ckpt(model, path, student_offset=1.0, teacher_offset=2.0):
    sd = {}
    for k, v in model.state_dict().items():
        sd[f"student.backbone.{k}"] = v + student_offset
        sd[f"teacher.backbone.{k}"] = v + teacher_offset
    sd["student.head.last_layer.weight"] = torch.zeros(8, 4)
    torch.save({"state_dict": sd, "epoch": 1, "global_step": 10,
                "tokenmix": {"backbone": dict(model.config), "variant": model.variant, "arch": model.arch}}, path)
    return path


def test_project_checkpoint_round_trip_and_rebuild(tmp_path):
    model = backbones.create_vit("vit_test_patch8", "entmax+lastvit", lastvit_k=3)
    ref = {k: v.clone() for k, v in model.state_dict().items()}
    path = _project_ckpt(model, tmp_path / "last.ckpt")
    rebuilt = backbones.backbone_from_checkpoint(path)
    assert (rebuilt.arch, rebuilt.variant, rebuilt.aggregator.k) == ("vit_test_patch8", "entmax+lastvit", 3)
    assert torch.equal(rebuilt.pos_embed, ref["pos_embed"] + 2.0)  # teacher by default
    student = backbones.backbone_from_checkpoint(path, which="student")
    assert torch.equal(student.pos_embed, ref["pos_embed"] + 1.0)


def test_recorded_variant_mismatch_is_refused(tmp_path):
    path = _project_ckpt(backbones.create_vit("vit_test_patch8", "entmax"), tmp_path / "a.ckpt")
    with pytest.raises(CheckpointError, match="variant='entmax' but the model is variant='softmax'"):
        backbones.load_checkpoint(backbones.create_vit("vit_test_patch8", "softmax"), path)


def test_other_architecture_names_shapes(tmp_path):
    path = tmp_path / "tiny.pth"
    torch.save(backbones.create_vit("vit_test_patch8", "softmax").state_dict(), path)
    with pytest.raises(CheckpointError, match=r"(?s)shape mismatch.*cls_token: checkpoint \(1, 1, 32\) vs model \(1, 1, 128\)"):
        backbones.load_checkpoint(backbones.create_vit("vit_demo_patch8", "softmax"), path)


def test_missing_and_unexpected_keys_are_named_unless_allowed(tmp_path):
    model = backbones.create_vit("vit_test_patch8", "registers", num_registers=2)
    sd = backbones.create_vit("vit_test_patch8", "softmax").state_dict()
    sd["extra.weight"] = torch.zeros(1)
    path = tmp_path / "plain.pth"
    torch.save(sd, path)
    with pytest.raises(CheckpointError, match=r"missing: \['reg_token'\]\n  unexpected: \['extra.weight'\]"):
        backbones.load_checkpoint(model, path)
    assert backbones.load_checkpoint(model, path, strict=False) == {"missing": ["reg_token"],
                                                                     "unexpected": ["extra.weight"]}


def test_checkpoint_needing_pickle_is_refused_but_dino_args_are_read(tmp_path):
    model = backbones.create_vit("vit_test_patch8")
    path = tmp_path / "dino.pth"  # main_dino.py saves its args as a Namespace: read, not refused
    torch.save({"teacher": {f"backbone.{k}": v for k, v in model.state_dict().items()},
                "args": argparse.Namespace(arch="vit_small")}, path)
    assert backbones.load_checkpoint(backbones.create_vit("vit_test_patch8"), path)["missing"] == []
    pickled = tmp_path / "pickled.pth"
    torch.save({"teacher": {}, "args": argparse.Namespace(out=Path("/tmp"))}, pickled)  # a Path is code to run
    with pytest.raises(CheckpointError, match=r"weights-only one: it holds a pathlib.*weights_only=True"):
        backbones.load_checkpoint(model, pickled)


def test_truncated_and_foreign_files_are_refused(tmp_path):
    good = tmp_path / "good.pth"
    torch.save(backbones.create_vit("vit_test_patch8").state_dict(), good)
    bad = tmp_path / "truncated.pth"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated or foreign"):
        backbones.load_checkpoint(backbones.create_vit("vit_test_patch8"), bad)
    foreign = tmp_path / "notes.pth"
    foreign.write_text("hello")
    with pytest.raises(CheckpointError, match="a text file .starts 'hello'., not a torch checkpoint"):
        backbones.load_checkpoint(backbones.create_vit("vit_test_patch8"), foreign)
    other = tmp_path / "other.pth"
    torch.save({"optimizer": {"lr": 0.1}}, other)
    with pytest.raises(CheckpointError, match="unrecognised checkpoint layout"):
        backbones.load_checkpoint(backbones.create_vit("vit_test_patch8"), other)
    with pytest.raises(CheckpointError, match="not found"):
        backbones.load_checkpoint(backbones.create_vit("vit_test_patch8"), tmp_path / "nope.pth")


def test_inferred_config_for_registers_and_specialization(tmp_path):
    for variant, extra in [("registers", {}), ("specialization", {"spec_blocks": [1]})]:
        model = backbones.create_vit("vit_test_patch8", variant, **extra)
        path = tmp_path / f"{variant}.pth"
        torch.save(model.state_dict(), path)
        rebuilt = backbones.backbone_from_checkpoint(path)
        assert rebuilt.variant == variant
        x = torch.randn(1, 3, 32, 32)
        assert torch.allclose(rebuilt.eval()(x), model.eval()(x))
