"""DINO's protocols compute their features in fp32 on CUDA, as DINO does (k-NN, linear, revisited Oxford / Paris,
Copydays; DAVIS never enters autocast), and bf16 autocast only with --bf16; the dense probes keep bf16 on CUDA.
Checked by recording what each descriptor asks of ``tokenmix.precision.inference_autocast`` and by the autocast
state inside the backbone under a CUDA-like switch (``torch.is_autocast_enabled``)."""
from __future__ import annotations

import contextlib

import pytest
import torch

pytestmark = pytest.mark.timeout(60)


def test_dino_protocols_default_to_fp32_and_bf16_is_opt_in():
    from probes.core.flags import OPTIONS, parse_flags
    from probes.core.task_table import TASKS, Kind
    dino = {Kind.KNN: "knn", Kind.LINEAR: "imagenet", Kind.IMAGE_RETRIEVAL: "roxford5k",
            Kind.COPY_DETECTION: "copydays"}
    for kind, task in dino.items():
        assert OPTIONS[kind](parse_flags(["--task", task]), TASKS[task], 224).bf16 is False, kind
        assert OPTIONS[kind](parse_flags(["--task", task, "--bf16"]), TASKS[task], 224).bf16 is True, kind


def test_inference_autocast_off_when_not_enabled(monkeypatch):
    """On a bf16-capable CUDA device: enabled -> torch.autocast("cuda", bf16); not enabled -> nothing."""
    from tokenmix import precision
    entered = []
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    monkeypatch.setattr(torch, "autocast", lambda device, dtype: entered.append((device, dtype))
                        or contextlib.nullcontext())
    with precision.inference_autocast("cuda", enabled=False):
        pass
    assert entered == []
    with precision.inference_autocast("cuda"):
        pass
    assert entered == [("cuda", torch.bfloat16)]
    assert precision.device_line("cpu", bf16=False) == "device: cpu, backbone in fp32"


@pytest.mark.parametrize("bf16", [False, True])
def test_descriptors_and_frozen_features_pass_the_choice_on(monkeypatch, bf16):
    import backbones
    from probes.core import features as feats
    from probes.instance import copy_detection as cd
    from probes.instance import image_retrieval as ir
    asked = []

    @contextlib.contextmanager
    def record(device, enabled=True):
        asked.append(enabled)
        yield

    for mod in (feats, cd, ir):
        monkeypatch.setattr(mod, "inference_autocast", record)
    model = backbones.create_vit("vit_test_patch8", "softmax", seed=0).eval()
    x = torch.randint(0, 255, (2, 3, 32, 32), dtype=torch.uint8)
    cd.copy_descriptor(model, x, bf16=bf16)
    ir.retrieval_descriptor(model, x, multiscale=True, bf16=bf16)
    feats.FrozenFeatures(model, feats.FeatureSpec(kind="cls"), bf16=bf16)(x)
    assert asked == [bf16, bf16, bf16]
    assert feats.FrozenFeatures(model, feats.FeatureSpec()).bf16  # the dense probes: bf16 on CUDA by default
