"""The probe kinds with no head to train, on a segmentation task's DataModule: dense retrieval (``run_retrieval``,
probes/retrieval.py) and overclustering (``run_overcluster``, probes/overcluster.py).

Both run as Lightning ``predict`` passes over one split at a time, each process on its fixed shard
(``ShardSampler``): the retrieval memory is built from the training shards and gathered on every process, then each
process labels its validation shard and the confusion matrices are summed; overclustering gathers the validation
features and rank 0 clusters them. Validation images and masks are both resized to the probe size (the reference
scores at its input size).
"""
from __future__ import annotations

import time
import warnings
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader

from datamodules.datamodule_base import ShardSampler, SplitView, dense_collate
from datamodules.transforms.dense import FixedResize
from tokenmix.launch import global_rank

from .features import FeatureSpec, FrozenFeatures, gather_shards
from .matching import hungarian, matched_miou
from .trainer import make_trainer
from . import retrieval as hb


def _predict_pass(ctx, features: FrozenFeatures, dataset, step: Callable, end: Callable):
    """``trainer.predict`` over ``dataset`` sharded over the processes: ``step(module, batch)`` per batch,
    ``end(module)`` once on every process (collectives go there)."""
    import lightning as L

    class Pass(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.features, self.local, self.result = features, [], None

        def predict_dataloader(self):
            sampler = ShardSampler(dataset, self.global_rank, self.trainer.world_size, train=False)
            return DataLoader(dataset, batch_size=ctx.dm.val_batch_size, sampler=sampler, collate_fn=dense_collate,
                              num_workers=ctx.args.num_workers)

        def predict_step(self, batch, batch_idx):
            self.local.append(step(self, batch))

        def on_predict_epoch_end(self):
            self.result = end(self)

    module = Pass()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(module\\(s\\) in eval mode|does not have many workers"
                                "|predict returned None).*")
        make_trainer(ctx.args, logger=False, enable_checkpointing=False).predict(module, return_predictions=False)
    return module.result


def _gather(module, local: torch.Tensor, n: int) -> torch.Tensor:
    return gather_shards(local, n, module.global_rank, module.trainer.world_size, module.all_gather)


def _val_view(ctx) -> SplitView:
    return SplitView(ctx.dm.val_set.dataset, FixedResize(ctx.dm.img_size, targets=True))


def _memory_sizes(args) -> list[int]:
    try:
        sizes = [int(float(s)) for s in str(args.hb_memory).split(",") if s.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--hb-memory {args.hb_memory!r}: expected comma-separated patch counts, e.g. 102400,1024000")
    return sizes


def build_memory(ctx, features: FrozenFeatures, n_keep: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(features (N, E, n_keep, D), labels (N, E, n_keep, C)) of every training image in every augmentation
    epoch, best-sampled patches first, identical on every process."""
    a, C, size = ctx.args, ctx.dm.num_classes, tuple(ctx.dm.img_size)
    train = SplitView(ctx.dm.train_set.dataset, None)  # images as stored: each is augmented here, seeded per image

    def step(m, batch):
        gens, views, masks = [], [], []
        for img, mask, idx in zip(batch["image"], batch["mask"], batch["index"]):
            for e in range(a.hb_aug_epochs):
                g = hb.image_generator(a.seed, e, int(idx))
                v, mk = hb.hummingbird_view(img, mask, size, g)
                gens.append(g), views.append(v), masks.append(mk)
        fk, lk = hb.memory_rows(m.features(torch.stack(views)), torch.stack(masks), gens, n_keep, ctx.patch_size, C)
        E = a.hb_aug_epochs
        return fk.reshape(-1, E, *fk.shape[1:]), lk.reshape(-1, E, *lk.shape[1:])

    def end(m):
        D = features.out_dim
        f = torch.cat([p[0] for p in m.local]) if m.local else torch.zeros(0, a.hb_aug_epochs, n_keep, D,
                                                                            device=m.device)
        y = torch.cat([p[1] for p in m.local]) if m.local else torch.zeros(0, a.hb_aug_epochs, n_keep, C,
                                                                            device=m.device)
        return _gather(m, f, len(train)), _gather(m, y, len(train))

    return _predict_pass(ctx, features, train, step, end)


def run_retrieval(ctx, spec: FeatureSpec, logger) -> dict[str, Any]:
    """Hummingbird dense retrieval: mIoU at every memory size of --hb-memory."""
    a, C, t0 = ctx.args, ctx.dm.num_classes, time.perf_counter()
    features = FrozenFeatures(ctx.info.model, spec)
    h, w = (s // ctx.patch_size for s in ctx.dm.img_size)
    n_img, E = len(ctx.dm.train_set), a.hb_aug_epochs
    sizes = _memory_sizes(a)
    n_per = {m: hb.per_image(m, n_img, E, h * w) for m in sizes}
    bank_f, bank_y = build_memory(ctx, features, max(n_per.values()))
    banks = {m: hb.memory_bank(bank_f, bank_y, n) for m, n in n_per.items()}
    val = _val_view(ctx)

    def step(m, batch):
        f = m.features(batch["image"])
        return torch.stack([hb.confusion_of(f, batch["mask"], mf, my, C, a.hb_k, a.hb_temperature)
                            for mf, my in banks.values()])

    def end(m):
        local = torch.stack(m.local).sum(0) if m.local else torch.zeros(len(banks), C, C, dtype=torch.long)
        g = m.all_gather(local.to(m.device))
        return (g.sum(0) if m.trainer.world_size > 1 else g).cpu()

    cms = _predict_pass(ctx, features, val, step, end)
    out = {}
    for (size, (mf, _)), cm in zip(banks.items(), cms):
        res = matched_miou(cm, hungarian(cm))
        out[str(size)] = {"mIoU": 100 * res["mIoU"], "memory": int(mf.shape[0]), "per_image": n_per[size],
                          "IoU": [100 * v for v in res["IoU"]]}
    if logger is not None and global_rank() == 0:
        for size, r in out.items():
            logger.experiment.add_scalar(f"retrieval/mIoU_mem{size}", r["mIoU"], 0)
        logger.experiment.flush()
    return {"mIoU": out, "k": a.hb_k, "temperature": a.hb_temperature, "aug_epochs": E, "num_train": n_img,
            "num_val": len(val), "seconds": time.perf_counter() - t0}


def run_overcluster(ctx, spec: FeatureSpec, logger) -> dict[str, Any]:
    """k-means on the validation patch features, K from --cluster-k, Hungarian / majority matching, mIoU."""
    from .overcluster import overcluster, resolve_ks
    a, C, t0 = ctx.args, ctx.dm.num_classes, time.perf_counter()
    ks = resolve_ks(a.cluster_k, C)
    features, val = FrozenFeatures(ctx.info.model, spec), _val_view(ctx)
    h, w = (s // ctx.patch_size for s in ctx.dm.img_size)

    def step(m, batch):
        return m.features(batch["image"]), torch.as_tensor(batch["mask"]).to(m.device)

    def end(m):
        if m.local:
            f, y = torch.cat([p[0] for p in m.local]), torch.cat([p[1] for p in m.local])
        else:  # an empty shard (fewer images than processes) still takes part in the gather
            f = torch.zeros(0, features.out_dim, h, w, device=m.device)
            y = torch.zeros(0, *ctx.dm.img_size, dtype=torch.long, device=m.device)
        return _gather(m, f, len(val)), _gather(m, y, len(val))

    feats, masks = _predict_pass(ctx, features, val, step, end)
    if global_rank() != 0:  # every rank took part in the extraction; rank 0 clusters and reports
        return {}
    res = overcluster(feats, masks.cpu(), C, ks, seed=a.seed, max_iter=a.cluster_iters)
    out = {str(k): {"mIoU": 100 * r["mIoU"], "matching": r["matching"], "IoU": [100 * v for v in r["IoU"]]}
           for k, r in res.items()}
    if logger is not None:
        for k, r in out.items():
            logger.experiment.add_scalar(f"overcluster/mIoU_K{k}", r["mIoU"], 0)
        logger.experiment.flush()
    return {"mIoU": out, "seed": a.seed, "num_val": len(val), "seconds": time.perf_counter() - t0}
