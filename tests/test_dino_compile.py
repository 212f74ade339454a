"""``DINOPretrainModule(compile=True)``: the same losses as eager over 5 steps of a real fit (entmax-1.5 through
the C++ kernel, wrapped as a custom op), no graph break, and each crop size compiled once."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch._dynamo

from backbones import entmax_fast
from backbones.entmax_fast import sparse_attention
from backbones.compile_ops import sparse_attention_op

from test_dino_fast_step import (EPOCHS, NITER, STEPS, FixedData, Seeder, _split_key_bias, make_batches,
                                 tiny_module)

pytestmark = pytest.mark.skipif(not entmax_fast.cpp_available(), reason="the C++ entmax kernel did not build")


class GraphCount(Seeder):
    def __init__(self):
        super().__init__()
        self.graphs = []

    def on_train_batch_end(self, trainer, m, outputs, batch, batch_idx):
        super().on_train_batch_end(trainer, m, outputs, batch, batch_idx)
        self.graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def fit(tmp_path, compile: bool, backend: str):
    import lightning.pytorch as pl
    torch.manual_seed(0)
    # compiled graphs call torch's default GEMMs (backbones/linear.py leaves them to the compiler); eager runs
    # ``backend``: under onednn the two differ by fp32 rounding only (held to 1e-5 below)
    m = tiny_module(variant="entmax", compile=compile, backbone={"drop_path_rate": 0.1, "linear_backend": backend})
    cb = GraphCount()
    trainer = pl.Trainer(max_epochs=EPOCHS, max_steps=STEPS, accelerator="cpu", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[cb], default_root_dir=tmp_path)
    trainer.fit(m, datamodule=FixedData(make_batches(NITER)))
    return m, cb


def test_custom_op_matches_the_autograd_function_bit_for_bit():
    torch.manual_seed(0)
    for kind in ("entmax15", "sparsemax"):
        q, k, v = (torch.randn(2, 3, 7, 4, requires_grad=True) for _ in range(3))
        a = sparse_attention(q, k, v, 0.5, kind)
        ga = torch.autograd.grad(a.sin().sum(), (q, k, v))
        b = sparse_attention_op(q, k, v, 0.5, kind)
        gb = torch.autograd.grad(b.sin().sum(), (q, k, v))
        assert torch.equal(a, b) and all(torch.equal(x, y) for x, y in zip(ga, gb))
    # views of a permuted qkv, as in the attention layer: fake kernels must give the real strides
    q, k, v = torch.randn(2, 7, 3, 2, 4).permute(2, 0, 3, 1, 4).unbind(0)
    torch.library.opcheck(torch.ops.tokenmix.sparse_attn_fwd.default, (q, k, v, 0.5, True, "auto"))
    out, mt = torch.ops.tokenmix.sparse_attn_fwd(q, k, v, 0.5, True, "auto")
    dout = torch.randn(2, 2, 4, 7).transpose(-1, -2)
    torch.library.opcheck(torch.ops.tokenmix.sparse_attn_bwd.default, (dout, q, k, v, mt, 0.5, True, "auto"))


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_compiled_fit_matches_eager_and_compiles_each_shape_once(tmp_path):
    # both GEMM backends on every host, whatever the vendor: the eager fit on oneDNN, the compiled one on
    # torch's default GEMM (compiled graphs never take the oneDNN path, backbones/linear.py)
    eager, ref = fit(tmp_path / "eager", compile=False, backend="onednn")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled, got = fit(tmp_path / "compiled", compile=True, backend="onednn")
    np.testing.assert_allclose(got.losses, ref.losses, rtol=0, atol=1e-5)
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
    # step 0 compiles: student backbone at 32 px and at 16 px, teacher backbone, student and teacher heads;
    # later steps reuse them, except the student head once when its last layer unfreezes (epoch 1)
    assert got.graphs[0] == 5 and got.graphs[NITER - 1] == 5, got.graphs
    assert got.graphs[-1] - got.graphs[NITER - 1] <= 1, got.graphs
    for (n, a), b in zip(compiled.student.named_parameters(), eager.student.parameters()):
        # the key third of qkv.bias has exact gradient 0: its AdamW steps follow rounding noise (_split_key_bias)
        a, b, kb, kb_ref = _split_key_bias(n, a, b)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=lambda e: f"{n}: {e}")
        torch.testing.assert_close(kb, kb_ref, rtol=0, atol=5e-5, msg=lambda e: f"{n} (key part): {e}")
