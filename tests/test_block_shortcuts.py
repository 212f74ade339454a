"""The two ways ``TokenMixBlock`` does less work (backbones/block.py): only [CLS] as a query in the last block
of ``TokenMixViT.forward``, and stochastic depth on a CPU running each residual branch on its kept samples only.

Two references. For every variant, the plain block written out here: every token through every layer, timm's
``DropPath`` multiplying the whole branch by its mask; in float64 the outputs and every gradient agree to 1e-10
(same maths; it reuses the model's token and output helpers). For the production path, independent code:
facebookresearch/dino's ``vit_small`` (official/vit.py) in fp32 on both GEMM backends, with gradients.
The row counts seen by the layers show the work really was skipped.
"""
from __future__ import annotations

import pytest
import torch

import backbones
from backbones.specialization import _split

VARIANTS = ["softmax", "entmax", "sparsemax", "registers", "specialization", "lastvit", "entmax+registers"]


def _norm(blk, which: str, x: torch.Tensor) -> torch.Tensor:
    norm, norm_cls = getattr(blk, which), getattr(blk, which + "_cls", None)
    return norm(x) if norm_cls is None else _split(x, norm_cls, norm)


def reference_block(blk, x: torch.Tensor) -> torch.Tensor:
    x = x + blk.drop_path1(blk.ls1(blk.attn(_norm(blk, "norm1", x))))  # timm's DropPath: branch * mask, all rows
    return x + blk.drop_path2(blk.ls2(blk.mlp(_norm(blk, "norm2", x))))


def reference_forward(model, images: torch.Tensor) -> torch.Tensor:
    x = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(images))))
    for blk in model.blocks:
        x = reference_block(blk, x)
    return model._split(model.norm(x), last=True, votes=False)["cls"]


def _model(variant: str, drop_path: float):
    kw = {"drop_path_rate": drop_path}
    if variant == "specialization":  # the last block specialised too: its [CLS] query uses its own q/k/v, norms
        kw["spec_blocks"] = [0, 1]
    torch.manual_seed(0)
    return backbones.create_vit("vit_test_patch8", variant, **kw).double()


def _run(model, fn, images, seed: int):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = fn(images)
    (out * torch.linspace(-1, 1, out.shape[-1], dtype=out.dtype)).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), grads, torch.get_rng_state()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("train", [True, False])
def test_forward_equals_the_plain_blocks_in_float64(variant, train):
    model = _model(variant, drop_path=0.5).train(train)
    images = torch.randn(6, 3, 32, 32, dtype=torch.float64)
    for seed in (1, 2, 3):  # several drop-path draws: some samples dropped, some kept
        out, grads, rng = _run(model, model, images, seed)
        ref, ref_grads, ref_rng = _run(model, lambda x: reference_forward(model, x), images, seed)
        assert torch.equal(rng, ref_rng)  # the same draws from the global generator, in the same number
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
        assert grads.keys() == ref_grads.keys() == {n for n, _ in model.named_parameters()}
        for n in grads:
            torch.testing.assert_close(grads[n], ref_grads[n], rtol=1e-10, atol=1e-10, msg=lambda e: f"{n}: {e}")


def _rows_seen(model, images) -> dict[str, list[int]]:
    """The (samples, tokens) each block's MLP fc1 received in one forward."""
    seen: dict[str, list] = {}
    hooks = [blk.mlp.fc1.register_forward_hook(lambda m, i, o, b=b: seen.setdefault(f"fc1.{b}", []).append(
        tuple(i[0].shape[:2]))) for b, blk in enumerate(model.blocks)]
    try:
        model(images)
    finally:
        for h in hooks:
            h.remove()
    return seen


def test_only_cls_is_a_query_in_the_last_block_except_for_lastvit():
    images = torch.randn(3, 3, 32, 32, dtype=torch.float64)
    for variant, tokens in (("softmax", 1), ("registers", 1), ("lastvit", 17)):
        seen = _rows_seen(_model(variant, drop_path=0.0).eval(), images)
        depth = len(seen)
        assert seen[f"fc1.{depth - 1}"] == [(3, tokens)], variant
        assert all(s[0][1] > 16 for b, s in seen.items() if b != f"fc1.{depth - 1}")  # earlier blocks: every token


def test_drop_path_runs_each_branch_on_the_kept_samples_only():
    model = _model("softmax", drop_path=0.6).train()
    images = torch.randn(8, 3, 32, 32, dtype=torch.float64)
    torch.manual_seed(4)
    seen = _rows_seen(model, images)
    # the MLP branch of block 1 has drop rate 0.6 (block 0: 0): fewer than 8 samples reach its fc1
    assert seen["fc1.0"] == [(8, 17)]
    assert seen["fc1.1"][0][0] < 8
    # the same rows timm's DropPath keeps: draw its masks with the same generator state
    torch.manual_seed(4)
    torch.empty(8, 1, 1, dtype=torch.float64).bernoulli_(1 - 0.6)  # block 1's attention branch
    keep_mlp = torch.empty(8, 1, 1, dtype=torch.float64).bernoulli_(1 - 0.6)
    assert seen["fc1.1"][0] == (int(keep_mlp.sum()), 1)


def test_a_branch_that_drops_every_sample_still_gives_every_parameter_a_gradient():
    """DDP expects a gradient for every parameter each step: a branch with no kept sample still runs."""
    model = _model("softmax", drop_path=0.999).train()
    torch.manual_seed(0)
    model(torch.randn(2, 3, 32, 32, dtype=torch.float64)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.fixture(scope="module")
def vit_s_pair():
    """The project's ViT-S/16 (softmax) and facebookresearch/dino's ``vit_small`` (official/vit.py,
    imports nothing of the project) holding its weights (strict load: the same keys)."""
    from official import vit as vits
    torch.manual_seed(0)
    model = backbones.create_vit("vit_small_patch16", "softmax", drop_path_rate=0.1)
    ref = vits.vit_small(patch_size=16, drop_path_rate=0.1)
    ref.load_state_dict(model.state_dict())
    return model, ref


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["aten", "onednn"])  # the production GEMMs: MKL (aten) and oneDNN
def test_fp32_vit_s_equals_the_official_vit_small_with_gradients(vit_s_pair, backend, monkeypatch):
    """The production path (fp32, training: [CLS]-only last block, drop-path on kept samples, oneDNN or MKL
    linears) against the official ViT-S/16 at 64 px (pos-embedding interpolation included): output and every
    gradient."""
    from official import vit as vits
    from backbones.linear import FastLinear
    monkeypatch.setattr(vits, "drop_path", vits.timm_drawn_drop_path)
    model, ref = vit_s_pair
    for layer in model.modules():
        if isinstance(layer, FastLinear):
            layer.backend = backend
    x, dy = torch.randn(6, 3, 64, 64), torch.randn(6, 384)
    outs, grads = [], []
    for net in (model, ref):
        net.train().zero_grad(set_to_none=True)
        torch.manual_seed(7)  # the same drop-path draws on both sides (seed 7: some samples dropped, some kept)
        out = net(x)
        (out * dy).sum().backward()
        outs.append(out.detach())
        grads.append({n: p.grad for n, p in net.named_parameters()})
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=2e-5)
    assert grads[0].keys() == grads[1].keys()
    for n, g in grads[0].items():
        assert g is not None and grads[1][n] is not None, n
        scale = grads[1][n].abs().max()
        torch.testing.assert_close(g, grads[1][n], rtol=0, atol=1e-4 * float(scale), msg=lambda e: f"{n}: {e}")


# ----------------------------------------------------------------- shortcuts step aside for what a user attaches
def _hook_shapes(module, store: list):
    return module.register_forward_hook(lambda m, i, o: store.append(tuple(o.shape)))


@pytest.mark.parametrize("where", ["block", "attn", "record"])
def test_watched_last_block_runs_every_token(where):
    """A hook on the last block or its attention, or ``attn.record``, sees what timm's block gives it: every
    token of every sample; the output is the full path's."""
    model = _model("softmax", drop_path=0.0).eval()
    images = torch.randn(3, 3, 32, 32, dtype=torch.float64)
    last, seen = model.blocks[-1], []
    with torch.no_grad():
        full = model.extract(images)[-1]["cls"]  # every token through every block
        if where == "record":
            last.attn.record = True
        handle = _hook_shapes(last if where == "block" else last.attn, seen) if where != "record" else None
        out = model(images)
    if handle is not None:
        handle.remove()
        assert seen == [(3, 17, 32)], seen
    else:
        assert last.attn.last_attn.shape == (3, 2, 17, 17)  # the whole map, not the [CLS] row
        torch.testing.assert_close(last.attn.last_attn.sum(-1), torch.ones(3, 2, 17, dtype=torch.float64))
    torch.testing.assert_close(out, full, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("where", ["block", "attn", "global"])
def test_watched_block_in_training_runs_every_sample(where):
    """With drop-path on, a hooked block (or a global module hook) gets every sample, as timm's DropPath path;
    the output and the RNG use are the full path's."""
    model = _model("softmax", drop_path=0.6).train()
    images = torch.randn(8, 3, 32, 32, dtype=torch.float64)
    blk, seen = model.blocks[0], []
    if where == "global":
        handle = torch.nn.modules.module.register_module_forward_hook(
            lambda m, i, o: seen.append(tuple(o.shape)) if m is model.blocks[1].mlp else None)
    else:
        blk = model.blocks[1]
        handle = _hook_shapes(blk if where == "block" else blk.attn, seen)
    try:
        out, grads, rng = _run(model, model, images, seed=4)
    finally:
        handle.remove()
    ref, ref_grads, ref_rng = _run(model, lambda x: reference_forward(model, x), images, seed=4)
    assert seen and all(s[0] == 8 for s in seen), seen  # no subset of the batch
    assert torch.equal(rng, ref_rng)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    for n in ref_grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=1e-10, atol=1e-10, msg=lambda e: f"{n}: {e}")


def test_per_sample_attention_mask_with_drop_path_equals_the_full_block():
    """A (B, 1, T, T) mask cannot follow a subset of the batch: the block runs timm's path (it was a broadcast
    error); a shared (T, T) mask still takes the shortcut, with the same result as the full block."""
    model = _model("softmax", drop_path=0.6).train()
    blk = model.blocks[1]
    x = torch.randn(6, 17, 32, dtype=torch.float64)
    for mask in (torch.randn(6, 1, 17, 17, dtype=torch.float64), torch.randn(17, 17, dtype=torch.float64)):
        torch.manual_seed(5)
        out = blk(x, attn_mask=mask)
        torch.manual_seed(5)
        y = x + blk.drop_path1(blk.ls1(blk.attn(blk.norm1(x), attn_mask=mask)))  # timm's block, written out
        ref = y + blk.drop_path2(blk.ls2(blk.mlp(blk.norm2(y))))
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
