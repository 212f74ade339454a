"""The two ways ``TokenMixBlock`` does less work (backbones/block.py): only [CLS] as a query in the last block
of ``TokenMixViT.forward``, and stochastic depth on a CPU running each residual branch on its kept samples only.

The reference is the plain block written out here: every token through every layer, timm's ``DropPath``
multiplying the whole branch by its mask. In float64 the outputs and every gradient agree to 1e-10 (same
maths); the row counts seen by the layers show the work really was skipped.
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


def test_fp32_vit_s_forward_equals_the_full_last_block():
    torch.manual_seed(0)
    model = backbones.create_vit("vit_small_patch16", "entmax").eval()
    x = torch.randn(2, 3, 96, 96)
    with torch.no_grad():
        full = model.extract(x)[-1]["cls"]
        torch.testing.assert_close(model(x), full, rtol=0, atol=2e-6)
