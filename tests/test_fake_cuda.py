"""The CUDA path traced without a GPU: ``FakeTensorMode`` tensors on ``device="cuda"`` under bf16 autocast (the
DINO step also under 16-mixed: fp16 autocast and the GradScaler).

Fake tensors carry device, dtype and shape but no data, and mixing a CPU and a CUDA tensor in one op raises
``FakeTensorDeviceMismatchError``, as the GPU would. CUDA autocast is on (torch is told bf16 is supported). SDPA
is replaced by its math for the trace: the real op asks the CUDA driver which backend to use, and there is none.
Traced here: a DINO step (student + teacher on 2 global + 2 local crops, loss, centre, clipping, AdamW, EMA)
for softmax, entmax (the Triton op's registered fake), registers and lastvit; a supervised step; a segmentation and a depth probe step; k-NN feature extraction and
the vote; the PCA analysis. Asserted: devices, dtypes and shapes of what comes out.

Not traced: the backward pass. torch's autograd engine needs a real CUDA context to run a backward on CUDA tensors,
fake or not (pytorch/pytorch#92627), and a CUDA build without a driver has none; the steps give each parameter a
fake CUDA gradient of its own shape instead, so clipping, the optimiser and the EMA still run on CUDA tensors.
Host reads (``.item()``, ``.tolist()``) have no value on a fake tensor: the steps that make them are traced in the
parts around them (named where it happens).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from lightning_modules.dino_module import DINOPretrainModule

CUDA = torch.device("cuda", 0)


def _fake_cuda_blocker() -> str | None:
    """Why fake CUDA tensors cannot be traced on this torch build, or None. A CUDA build on a machine without a
    driver runs the CUDA runtime for Python indexing (``THPVariable_getitem``'s device guard) even on fake tensors;
    a CPU-only build or a GPU machine has no such call."""
    try:
        with FakeTensorMode():
            torch.empty(2, 3, device=CUDA)[:, :1]
    except Exception as e:  # noqa: BLE001 (the reason is reported)
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"
    return None


_BLOCKER = _fake_cuda_blocker()
pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),  # self.log() without a Trainer, etc.
              pytest.mark.skipif(_BLOCKER is not None, reason=(
                  f"fake CUDA tensors need a GPU machine or a CPU-only torch build here ({_BLOCKER}): a CUDA "
                  "build without a driver calls the CUDA runtime when indexing them"))]


@pytest.fixture
def fake(monkeypatch):
    """A fake-CUDA world: the mode, with CUDA autocast allowed to turn on (``torch.cuda.is_available`` stays
    False: patching it makes Python indexing of fake CUDA tensors call the CUDA runtime)."""
    monkeypatch.setattr(torch.cuda.amp.common, "amp_definitely_not_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(F, "scaled_dot_product_attention", _sdpa_math)
    return FakeTensorMode(shape_env=ShapeEnv(), static_shapes=True)


def _sdpa_math(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
    """SDPA's math, for the trace: the real op picks its CUDA backend by asking the driver (there is none)."""
    s = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
    return s.softmax(-1) @ v


def to_fake_cuda(module: torch.nn.Module, mode: FakeTensorMode) -> torch.nn.Module:
    """``module.to("cuda")`` for fake tensors (``Module.to`` would try to swap real and fake tensors in place)."""
    slots = []
    for m in module.modules():
        slots += [(m._parameters, n, mode.from_tensor(p.detach()), p.requires_grad)
                  for n, p in m._parameters.items() if p is not None]
        slots += [(m._buffers, n, mode.from_tensor(b), None) for n, b in m._buffers.items() if b is not None]
    with mode:
        for store, name, t, grad in slots:
            store[name] = t.to(CUDA) if grad is None else torch.nn.Parameter(t.to(CUDA), requires_grad=grad)
    return module


def amp(dtype=torch.bfloat16):
    return torch.autocast("cuda", dtype=dtype)


def fake_backward(params) -> None:
    """What ``loss.backward()`` leaves: a gradient of each trainable parameter's dtype, shape and device."""
    for p in params:
        if p.requires_grad:
            p.grad = torch.randn_like(p)


def all_cuda(tensors) -> bool:
    return all(t.device == CUDA for t in tensors)


# --------------------------------------------------------------------------------------------- DINO
def dino_module(variant: str) -> DINOPretrainModule:
    torch.manual_seed(0)
    return DINOPretrainModule(arch="vit_test_patch8", variant=variant, out_dim=64, head_hidden_dim=32,
                              head_bottleneck_dim=16, n_local_crops=2, epochs=2, warmup_epochs=1,
                              backbone={"img_size": 32})


@pytest.mark.parametrize("variant,precision", [(v, "bf16-mixed") for v in ("softmax", "entmax", "registers", "lastvit")]
                         + [(v, "16-mixed") for v in ("softmax", "entmax")])
def test_dino_step_on_fake_cuda(fake, variant, precision):
    """16-mixed (the paper preset): fp16 autocast, and the GradScaler's scale, un-scale and update on CUDA with
    the foreach AdamW the module picks for it, clipping after the un-scale (as Lightning's plugin orders them).
    ``GradScaler.step``'s found-inf read is a host read: its optimiser step is traced directly."""
    from types import SimpleNamespace
    module = to_fake_cuda(dino_module(variant), fake)
    # Module.to keeps each Parameter object (it swaps the data); the fake conversion makes new ones: rebind the
    # module's own parameter lists (EMA pairs, last layer) as they would still be after a real .to("cuda")
    module._ema_pairs = (list(module.teacher.parameters()), list(module.student.parameters()))
    module._last_layer = [p for n, p in module.student.named_parameters() if "last_layer" in n and p.requires_grad]
    half = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}[precision]
    B = 2
    with fake:
        crops = [torch.randn(B, 3, 32, 32, device=CUDA) for _ in range(2)] + \
            [torch.randn(B, 3, 16, 16, device=CUDA) for _ in range(2)]
        module._trainer = SimpleNamespace(precision=precision)  # what configure_optimizers reads
        opt = module.configure_optimizers()
        module._trainer = None
        scaler = torch.amp.GradScaler("cuda") if precision == "16-mixed" else None
        with amp(half):
            with torch.no_grad():
                teacher_out = module.teacher(crops[:2])
            student_out = module.student(crops)
            loss = module.dino_loss(student_out, teacher_out, 0)
        module._watch_finite(loss.detach(), 0, now=False)  # the on-device non-finite watch (no host read)
        scaled = scaler.scale(loss) if scaler else loss
        fake_backward(module.student.parameters())
        if scaler:
            scaler.unscale_(opt)
        module.configure_gradient_clipping(opt)  # per-parameter clipping, last layer frozen in epoch 0
        opt.step()
        if scaler:
            scaler.update()
        module.ema_update(0.996)
    assert teacher_out.shape == (2 * B, 64) and student_out.shape == (4 * B, 64)
    assert teacher_out.dtype == student_out.dtype == half  # the head's last Linear under autocast
    assert loss.dtype == torch.float32 and loss.shape == () and loss.device == CUDA
    assert opt.defaults["foreach" if scaler else "fused"] is True
    if scaler:
        assert scaled.device == CUDA and scaler._scale.device == CUDA and scaler._growth_tracker.device == CUDA
    center = module.dino_loss.center
    assert center.device == CUDA and center.dtype == torch.float32 and center.shape == (1, 64)
    assert all_cuda(module.parameters()) and all(p.dtype == torch.float32 for p in module.parameters())
    # foreach AdamW keeps its step counts on the host (torch's choice when not capturable); fused on the device
    state = [v for s in opt.state.values() for k, v in s.items() if torch.is_tensor(v) and (k != "step" or not scaler)]
    assert state and all_cuda(state)
    assert module._nonfinite.device == CUDA


# --------------------------------------------------------------------------------------- supervised
def test_supervised_step_on_fake_cuda(fake):
    """SupervisedModule.training_step's maths (its ``torch.isfinite(loss)`` host check and the torchmetrics
    accuracy, whose argument checks read values, are left out)."""
    from lightning_modules.supervised_module import SupervisedModule
    torch.manual_seed(0)
    module = to_fake_cuda(SupervisedModule(arch="vit_test_patch8", variant="lastvit", num_classes=5,
                                           backbone={"img_size": 32}, epochs=2), fake)
    with fake:
        images, labels = torch.randn(2, 3, 32, 32, device=CUDA), torch.zeros(2, dtype=torch.long, device=CUDA)
        opt = module.configure_optimizers()
        with amp():
            logits = module(images)
            loss = F.cross_entropy(logits.float(), labels)
        fake_backward(module.parameters())
        opt.step()
    assert logits.shape == (2, 5) and logits.dtype == torch.bfloat16 and logits.device == CUDA
    assert loss.dtype == torch.float32 and all_cuda(module.parameters())


# ------------------------------------------------------------------------------------------- probes
class _Data:
    """The two attributes a probe module reads from its DataModule at construction."""
    batch_size = 2
    train_set = val_set = range(4)

    def setup(self, stage):
        pass


def _probe(kind: str, fake):
    import backbones
    from probes.core.features import FeatureSpec, FrozenFeatures
    torch.manual_seed(0)
    backbone = backbones.create_vit("vit_test_patch8", "entmax", img_size=32)
    spec = FeatureSpec(kind="dense", n_last_blocks=1, blocks=None, with_cls=False)
    features = FrozenFeatures(backbone, spec)
    if kind == "seg":
        from probes.dense.module_seg import SegmentationProbe
        probe = SegmentationProbe(features, _Data(), num_classes=5, cache=False)
    else:
        from probes.dense.module_depth import DepthProbe
        probe = DepthProbe(features, _Data(), cache=False)
    probe = to_fake_cuda(probe, fake)
    # the cache bookkeeping reads the batch's sample indices on the host: features straight from the backbone
    probe.get_features = lambda batch, split: probe.features(batch["image"])
    return probe


def test_segmentation_probe_step_on_fake_cuda(fake):
    probe = _probe("seg", fake)
    with fake:
        batch = {"image": torch.randint(0, 255, (2, 3, 32, 32), dtype=torch.uint8, device=CUDA),
                 "mask": torch.randint(0, 5, (2, 32, 32), device=CUDA)}
        feats = probe.features(batch["image"])
        loss = probe.training_step(batch, 0)
    assert feats.shape == (2, 32, 4, 4) and feats.dtype == torch.float32 and feats.device == CUDA
    assert loss.shape == () and loss.dtype == torch.float32 and loss.device == CUDA


def test_depth_probe_step_on_fake_cuda(fake):
    """DepthProbe.training_step up to the loss: SigLoss counts the valid pixels on the host (``mask.sum() < 2``),
    a value a fake tensor does not have; its elementwise part is traced on all-valid pixels."""
    probe = _probe("depth", fake)
    with fake:
        batch = {"image": torch.randint(0, 255, (2, 3, 32, 32), dtype=torch.uint8, device=CUDA),
                 "depth": torch.rand(2, 32, 32, device=CUDA) * 5 + 0.5}
        pred = probe.predict_depth(probe.get_features(batch, "train"), (32, 32))[:, 0]
        g = torch.log(pred + probe.loss_fn.eps) - torch.log(batch["depth"].float() + probe.loss_fn.eps)
        loss = torch.sqrt(torch.var(g) + probe.loss_fn.lam * g.mean() ** 2)
    assert pred.shape == (2, 32, 32) and pred.dtype == torch.float32 and pred.device == CUDA
    assert loss.shape == () and loss.dtype == torch.float32 and loss.device == CUDA


# --------------------------------------------------------------------------------------- k-NN, PCA
def test_knn_features_and_vote_on_fake_cuda(fake):
    import backbones
    from probes.core.features import FeatureSpec, FrozenFeatures
    from tokenmix.knn import knn_scores
    torch.manual_seed(0)
    features = to_fake_cuda(FrozenFeatures(backbones.create_vit("vit_test_patch8", "entmax", img_size=32),
                                           FeatureSpec(kind="cls", n_last_blocks=1, blocks=None)), fake)
    with fake:
        images = torch.randint(0, 255, (4, 3, 32, 32), dtype=torch.uint8, device=CUDA)
        feats = features(images)
        scores = knn_scores(feats, torch.tensor([0, 1, 0, 1], device=CUDA), feats, num_classes=2, k=2, T=0.07)
    assert feats.shape == (4, 32) and feats.dtype == torch.float32 and feats.device == CUDA
    assert scores.shape == (4, 2) and scores.device == CUDA


def test_pca_analysis_on_fake_cuda(fake):
    """analysis/tasks.py's PCA: the backbone's patch tokens on the GPU (extract_pca), then the PCA fit and the
    projection (``pca_rgb``'s foreground selection is a boolean mask: a shape only real values give)."""
    import backbones
    from tokenmix.pca import pca_fit
    torch.manual_seed(0)
    model = to_fake_cuda(backbones.create_vit("vit_test_patch8", "registers", img_size=32).eval(), fake)
    from tokenmix.precision import inference_autocast
    with fake, torch.no_grad():
        x = torch.randn(2, 3, 32, 32, device=CUDA)
        with inference_autocast(x.device):
            patch = model.extract(x)[-1]["patch"]
        rows = patch.float().reshape(-1, 32).double()
        mean, comps, var = pca_fit(rows, 3)
        proj = (rows - mean) @ comps.T
    # the tokens leave the final LayerNorm, which autocast runs in fp32
    assert tuple(patch.shape) == (2, 16, 32) and patch.device == CUDA and patch.dtype == torch.float32
    assert comps.shape == (3, 32) and var.shape == (3,) and proj.shape == (32, 3)
    assert all(t.device == CUDA and t.dtype == torch.float64 for t in (mean, comps, var, proj))


def test_the_fake_world_catches_a_device_mix(fake):
    """The premise: mixing a CPU and a CUDA tensor fails under the fake mode as on a GPU."""
    from torch._subclasses.fake_tensor import FakeTensorDeviceMismatchError
    with fake, pytest.raises((FakeTensorDeviceMismatchError, RuntimeError), match="device"):
        torch.randn(2, device=CUDA) + torch.randn(2, device="cpu")
