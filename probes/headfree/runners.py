"""The probe kinds with no head to train, on a segmentation task's DataModule: dense retrieval (``run_retrieval``,
probes/headfree/retrieval.py) and overclustering (``run_overcluster``, probes/headfree/overcluster.py).

Both run as Lightning ``predict`` passes over one split at a time, each process on its fixed shard
(``ShardSampler``): the retrieval memory is built from the training shards and gathered on every process, then each
process labels its validation shard and the confusion matrices are summed; overclustering gathers the validation
features and rank 0 clusters them. Validation images and masks are both resized to the probe size (the reference
scores at its input size).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from datamodules.datamodule_base import SplitView, dense_collate
from datamodules.transforms.dense import FixedResize
from datamodules.transforms.views import IMAGENET_STD
from tokenmix.launch import global_rank

from probes.core.features import FeatureSpec, FrozenFeatures, sharded_predict
from probes.headfree import retrieval as hb
from probes.headfree.matching import hungarian, matched_miou


@dataclass(frozen=True)
class RetrievalOptions:
    """Hummingbird dense retrieval (``run_retrieval``); what --protocol fixes: ``hb.resolve_settings``."""
    memory: tuple[int, ...]  # --hb-memory: memory sizes in patches
    aug_epochs: int          # --hb-aug-epochs: augmented views of each training image
    seed: int                # --seed: the views' random draws
    k: int = hb.K_NEIGHBOURS                # --hb-k: nearest neighbours per patch
    temperature: float = hb.TEMPERATURE     # --hb-temperature
    protocol: hb.DenseRetrievalProtocol = hb.DenseRetrievalProtocol.PROJECT  # --protocol
    std_typo: bool = False   # --hb-std-typo: normalise with the reference's std (0.255 for blue)
    ade_other: bool = False  # ADE20K: "other" a class of its own, ignored when scoring (hummingbird)
    trainaug: bool = False   # VOC: the memory from trainaug (voc_aug) when its list is there (hummingbird)
    train_note: Optional[str] = None  # set when trainaug was asked for but the list is missing


@dataclass(frozen=True)
class OverclusterOptions:
    """Overclustering as Leopart / NeCo (``run_overcluster``, ``probes.headfree.overcluster``)."""
    ks: str = "1x,2x,5x,10x"  # --cluster-k: K values, 'Nx' = N x the number of classes
    iters: int = 100          # --cluster-iters: faiss k-means iterations (niter; the reference's 100)
    seeds: int = 5            # --cluster-seeds: k-means runs with seeds 0 .. seeds - 1, averaged (the reference's)


def _predict_pass(ctx, features: FrozenFeatures, dataset, step: Callable, end: Optional[Callable] = None):
    """``sharded_predict`` with the validation loader's settings (``ctx``: ``probes.core.kinds.ProbeContext``)."""
    return sharded_predict(ctx.launch, features, [dataset], step, batch_size=ctx.dm.val_batch_size,
                           collate_fn=dense_collate, num_workers=ctx.dm.num_workers, progress=ctx.progress,
                           end=end)[0]


def _val_view(ctx) -> SplitView:
    return SplitView(ctx.dm.val_set.dataset, FixedResize(ctx.dm.img_size, targets=True))


def _ade_other(ctx, a: RetrievalOptions) -> bool:
    """ADE20K with "other" kept as class 0 of 151 (the hummingbird protocol): the other datasets have no such label."""
    return a.ade_other and ctx.dataset == "ade20k"


def build_memory(ctx, a: RetrievalOptions, features: FrozenFeatures, n_keep: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(features (N, E, n_keep, D), labels (N, E, n_keep, C)) of every training image in every augmentation
    epoch, best-sampled patches first, identical on every process."""
    C, size, ade = ctx.dm.num_classes + _ade_other(ctx, a), tuple(ctx.dm.img_size), _ade_other(ctx, a)
    train = SplitView(ctx.dm.train_set.dataset, None)  # images as stored: each is augmented here, seeded per image

    def step(m, batch):
        gens, views, masks = [], [], []
        for img, mask, idx in zip(batch["image"], batch["mask"], batch["index"]):
            for e in range(a.aug_epochs):
                g = hb.image_generator(a.seed, e, int(idx))
                v, mk = hb.hummingbird_view(img, mask, size, g)
                gens.append(g), views.append(v), masks.append(mk)
        views, masks = hb.protocol_inputs(torch.stack(views), torch.stack(masks), a.std_typo, ade)
        fk, lk = hb.memory_rows(m.net(views), masks, gens, n_keep, ctx.patch_size, C)
        E = a.aug_epochs
        return fk.reshape(-1, E, *fk.shape[1:]), lk.reshape(-1, E, *lk.shape[1:])

    return _predict_pass(ctx, features, train, step)


def run_retrieval(ctx, a: RetrievalOptions, spec: FeatureSpec, logger) -> dict[str, Any]:
    """Hummingbird dense retrieval: mIoU at every memory size of --hb-memory (capped sizes warned and recorded)."""
    ade, t0 = _ade_other(ctx, a), time.perf_counter()
    C, ignore = ctx.dm.num_classes + ade, 0 if ade else 255  # ADE20K "other" kept: class 0 of 151, ignored
    features = FrozenFeatures(ctx.info.model, spec)
    h, w = (s // ctx.patch_size for s in ctx.dm.img_size)
    n_img, E = len(ctx.dm.train_set), a.aug_epochs
    plans = {p.requested: p for p in hb.plan_memory(a.memory, n_img, E, h * w)}
    n_per = {m: p.per_image for m, p in plans.items()}
    bank_f, bank_y = build_memory(ctx, a, features, max(n_per.values()))
    banks = {m: hb.memory_bank(bank_f, bank_y, n) for m, n in n_per.items()}
    val = _val_view(ctx)

    def step(m, batch):
        images, masks = hb.protocol_inputs(batch["image"], batch["mask"], a.std_typo, ade)
        f = m.net(images)
        return torch.stack([hb.confusion_of(f, masks, mf, my, C, a.k, a.temperature, ignore)
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
                          "requested": size, "capped": plans[size].capped, "IoU": [100 * v for v in res["IoU"]]}
    return {"mIoU": out, "k": a.k, "temperature": a.temperature, "aug_epochs": E, "num_train": n_img,
            "num_val": len(val), "protocol": a.protocol.value, "train_set": ctx.dataset, "train_note": a.train_note,
            "img_size": list(ctx.dm.img_size), "std": list(hb.REFERENCE_STD if a.std_typo else IMAGENET_STD),
            "ade_other": ade, "num_classes": C, "effective_memory": {str(m): p.rows for m, p in plans.items()},
            "capped": [m for m, p in plans.items() if p.capped], "seconds": time.perf_counter() - t0}


def run_overcluster(ctx, a: OverclusterOptions, spec: FeatureSpec, logger) -> dict[str, Any]:
    """Leopart / NeCo overclustering of the validation patch features (``probes.headfree.overcluster``), K from
    --cluster-k: mIoU mean and std over --cluster-seeds k-means runs."""
    from probes.headfree.overcluster import ClusterSettings, overcluster, resolve_ks
    C, t0 = ctx.dm.num_classes, time.perf_counter()
    ks = resolve_ks(a.ks, C)
    features, val = FrozenFeatures(ctx.info.model, spec), _val_view(ctx)

    def step(m, batch):
        return m.net(batch["image"]), torch.as_tensor(batch["mask"]).to(m.device)

    feats, masks = _predict_pass(ctx, features, val, step)
    if global_rank() != 0:  # every rank took part in the extraction; rank 0 clusters and reports
        return {}
    res = overcluster(feats, masks.cpu(), C, ks, ClusterSettings(seeds=a.seeds, niter=a.iters))
    out = {str(k): {"mIoU": 100 * r["mIoU"], "std": 100 * r["std"], "seeds": [100 * v for v in r["seeds"]],
                    "matching": r["matching"], "pca_dim": r["pca_dim"], "IoU": [100 * v for v in r["IoU"]]}
           for k, r in res.items()}
    return {"mIoU": out, "seeds": a.seeds, "num_val": len(val), "seconds": time.perf_counter() - t0}
