"""Specialised norms and specialised q/k/v in separate block sets; checkpoints rebuild them."""
import pytest
import torch

import backbones
from backbones.specialization import specialization_sets


def _cls_params(model):
    return sorted(k for k, _ in model.named_parameters() if "_cls." in k)


def test_norms_and_qkv_in_their_own_blocks():
    model = backbones.create_vit("vit_test_patch8", "specialization", spec_norm_blocks=[0, 1], spec_qkv_blocks=[1])
    assert _cls_params(model) == sorted(
        [f"blocks.{b}.{n}_cls.{w}" for b in (0, 1) for n in ("norm1", "norm2") for w in ("weight", "bias")]
        + ["blocks.1.attn.qkv_cls.weight", "blocks.1.attn.qkv_cls.bias"])
    assert [blk.specialized for blk in model.blocks] == [("norm1", "norm2"), ("norm1", "qkv", "norm2")]
    assert model.config["spec_norm_blocks"] == [0, 1] and model.config["spec_qkv_blocks"] == [1]
    # the same numbers of extra parameters as counted by hand: 2 blocks x 2 norms x 2D + one qkv (3D x D + 3D)
    plain = backbones.create_vit("vit_test_patch8", "softmax")
    extra = sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in plain.parameters())
    assert extra == 2 * 2 * 2 * 32 + (96 * 32 + 96)
    # spec_blocks alone still specialises every component in the same blocks
    assert specialization_sets([2, 0]) == {"norm1": (0, 2), "qkv": (0, 2), "norm2": (0, 2)}
    assert specialization_sets([0], components=["qkv"], norm_blocks=[1]) == {"qkv": (0,)}
    with pytest.raises(ValueError, match="unknown specialization components"):
        specialization_sets([0], components=["mlp"])


def test_separate_sets_survive_a_checkpoint(tmp_path):
    model = backbones.create_vit("vit_test_patch8", "specialization", spec_blocks=[0, 1], spec_norm_blocks=[0, 1],
                                 spec_qkv_blocks=[0]).eval()
    path = tmp_path / "spec.pth"
    torch.save(model.state_dict(), path)  # no metadata: inferred from the *_cls keys
    rebuilt = backbones.backbone_from_checkpoint(path).eval()
    assert rebuilt.config["spec_qkv_blocks"] == [0] and _cls_params(rebuilt) == _cls_params(model)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(x), model(x))
