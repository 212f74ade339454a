"""k-NN on frozen [CLS] features (DINO eval_knn): both splits embedded once (sharded over the processes and gathered
on every one), the weighted k-NN vote at temperature T on rank 0 (``tokenmix.knn``)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from datamodules.datamodule_base import dense_collate
from tokenmix.knn import DEFAULT_KS, knn_top1_topk
from tokenmix.launch import global_rank, on_gpu

from probes.core.features import FeatureSpec, FrozenFeatures, sharded_predict


@dataclass(frozen=True)
class KnnOptions:
    ks: tuple[int, ...] = DEFAULT_KS  # --knn-k
    temperature: float = 0.07         # --knn-t (DINO's)
    bf16: bool = False                # --bf16: the backbone in bf16 autocast on CUDA (DINO: fp32)


def embed_splits(ctx, features: FrozenFeatures) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(features, labels) of each split of ``ctx.dm`` in dataset order, identical on every process."""
    def step(m, batch):
        return m.net(batch["image"]).float(), torch.as_tensor(batch["label"]).to(m.device)

    return sharded_predict(ctx.launch, features, [ctx.dm.train_set, ctx.dm.val_set], step,
                           batch_size=ctx.dm.val_batch_size, collate_fn=dense_collate,
                           num_workers=ctx.dm.num_workers, progress=ctx.progress)


def run_knn(ctx, opts: KnnOptions, spec: FeatureSpec, logger) -> dict[str, Any]:
    """DINO eval_knn: Resize 256 + CenterCrop 224 for both splits, weighted k-NN vote at temperature T."""
    t0 = time.perf_counter()
    (ftr, ytr), (fva, yva) = embed_splits(ctx, FrozenFeatures(ctx.info.model, spec, bf16=opts.bf16))
    if global_rank() != 0:  # every rank took part in the extraction; rank 0 votes and reports
        return {}
    if on_gpu(ctx.launch.accelerator):  # similarity matrix on the GPU (DINO keeps the features there)
        ftr, fva = ftr.cuda(), fva.cuda()
    res = knn_top1_topk(ftr, ytr, fva, yva, ctx.dm.num_classes, ks=list(opts.ks), T=opts.temperature)
    return {"top1": {k: v["top1"] for k, v in res.items()}, "top5": {k: v["top5"] for k, v in res.items()},
            "num_train": len(ytr), "num_val": len(yva), "seconds": time.perf_counter() - t0}


def summary_line(m: dict) -> str:
    return "k-NN top-1 " + ", ".join(f"k={k}: {v:.2f}" for k, v in m["top1"].items())
