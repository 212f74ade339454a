"""Exact import of LaSt-ViT's released classifier (ChengShiest/LAST-ViT, cls_pretrain/conf.py).

The reference is torchvision's own ``vit_b_16`` encoder followed by the released ``dense_vit.forward``
aggregation, transcribed below; the project's aggregation code is never used to build the expectation.
"""
import pytest
import torch
import torchvision

import backbones
from tokenmix.io import CheckpointError

pytestmark = pytest.mark.timeout(120)  # default for the quick tests; slow ones carry their own


def released_forward(tv: torchvision.models.VisionTransformer, images: torch.Tensor) -> torch.Tensor:
    """``dense_vit.forward`` of the release, K=1, written out."""
    x = tv._process_input(images)
    x = torch.cat([tv.class_token.expand(x.shape[0], -1, -1), x], dim=1)
    x = tv.encoder(x)
    ks = 768
    kernel = torch.exp(-0.5 * (torch.arange(-ks // 2 + 1, ks // 2 + 1).float() / ks ** 0.5) ** 2)
    kernel = (kernel / torch.max(kernel))[None, None]
    x_detach = x[:, 1:]
    f = torch.fft.fftshift(torch.fft.fft(x[:, 1:], dim=-1), dim=-1) * kernel
    low = torch.fft.ifft(torch.fft.ifftshift(f, dim=-1), dim=-1).real
    diff = x_detach / torch.abs(low - x_detach)
    _, indices = torch.topk(diff, k=1, dim=1, largest=True)
    cls_token = torch.mean(torch.gather(x_detach, 1, indices), dim=1)
    return tv.heads(cls_token)


@pytest.fixture(scope="module")
def torchvision_model():
    torch.manual_seed(0)
    tv = torchvision.models.vit_b_16(weights=None).eval()
    with torch.no_grad():  # torchvision zero-inits these two: random values make the check meaningful
        tv.class_token.normal_(0, 0.5)
        tv.heads.head.weight.normal_(0, 0.05)
        tv.heads.head.bias.normal_(0, 0.05)
    images = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = released_forward(tv, images)
    return tv, images, expected


def _save_layouts(tv, tmp_path):
    sd = tv.state_dict()
    plain = tmp_path / "vit_b_16.pth"
    torch.save(sd, plain)
    d2 = tmp_path / "ViT_190k.pth"  # what detectron2's Checkpointer writes for ClassificationNet(model=...)
    torch.save({"model": {f"model.{k}": v for k, v in sd.items()}, "iteration": 190_000}, d2)
    return plain, d2


@pytest.mark.timeout(300)
def test_released_logits_reproduced_from_both_layouts(torchvision_model, tmp_path):
    tv, images, expected = torchvision_model
    for path in _save_layouts(tv, tmp_path):
        model = backbones.create_vit("vit_base_patch16", "lastvit", num_classes=1000, lastvit_reference=True).eval()
        info = backbones.load_checkpoint(model, path)
        assert info == {"missing": [], "unexpected": []}
        with torch.no_grad():
            got = model(images)
        assert got.shape == (2, 1000)
        assert (got - expected).abs().max().item() < 1e-4, path.name
        assert torch.equal(got.argmax(1), expected.argmax(1))


@pytest.mark.timeout(300)
def test_project_default_aggregation_differs_and_feature_backbone_ignores_head(torchvision_model, tmp_path):
    """The documented default (centred window, epsilon) is not the released one; a backbone without a head
    (probes, analyses) loads the same file and returns the aggregated token the head reads."""
    tv, images, expected = torchvision_model
    _, d2 = _save_layouts(tv, tmp_path)
    default = backbones.create_vit("vit_base_patch16", "lastvit", num_classes=1000).eval()
    backbones.load_checkpoint(default, d2)
    feats = backbones.backbone_from_checkpoint(d2, variant="lastvit", lastvit_reference=True).eval()
    assert "num_classes" not in feats.config
    with torch.no_grad():
        assert (default(images) - expected).abs().max().item() > 1e-3  # some channel picks another patch
        token = feats(images)
    assert token.shape == (2, 768)
    assert (tv.heads(token) - expected).abs().max().item() < 1e-4


def test_reference_window_is_off_centre():
    """The released window for even D peaks one bin left of DC (index D//2 after fftshift)."""
    from backbones.lastvit import gaussian_window
    w = gaussian_window(8, 2.0, reference=True)
    assert int(w.argmax()) == 3 and w.max().item() == 1.0
    # hand-worked: offsets -3..4, so the DC bin (index 4) carries exp(-0.5 * (1/2)^2)
    assert abs(w[4].item() - 0.8824969) < 1e-6
    assert int(gaussian_window(8, 2.0).argmax()) == 4


def test_unknown_torchvision_keys_are_named(tmp_path):
    sd = {"class_token": torch.zeros(1, 1, 8), "heads.pre_logits.weight": torch.zeros(8, 8)}
    torch.save(sd, tmp_path / "x.pth")
    with pytest.raises(CheckpointError, match="heads.pre_logits.weight"):
        backbones.load_checkpoint(backbones.create_vit("vit_test_patch8"), tmp_path / "x.pth")
