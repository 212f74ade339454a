"""Feature cache of the dense probes: time of epoch 1 (backbone runs, features stored) vs later epochs
(features replayed from the cache). Target: later epochs <= 10% of the first.

``run(quick=False) -> {"rows": [...], "later_over_first": ..., "target": 0.10, "meets_target": ...}``.
Data: in-memory synthetic scenes (no disk decoding), so epoch 1 is, if anything, cheaper than on real data
and the ratio conservative. One epoch = training + validation.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

# the protocol's backbone (ViT-S/16 at 224 px) and the CPU demo's (width 128, depth 4, 128 px scenes): with the
# tiny demo backbone the head's full-resolution loss is a larger share of an epoch, so its ratio is higher
FULL = [dict(arch="vit_small_patch16", img=224, n_train=32, n_val=8, batch=8, epochs=3),
        dict(arch="vit_demo_patch8", img=128, n_train=64, n_val=16, batch=8, epochs=3)]
QUICK = [dict(arch="vit_test_patch8", img=32, n_train=16, n_val=8, batch=4, epochs=3)]
TARGET = 0.10


class _Scenes(torch.utils.data.Dataset):
    def __init__(self, n: int, img: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            blocks = torch.randint(0, 5, (img // 16, img // 16), generator=g)
            mask = blocks.repeat_interleave(16, 0).repeat_interleave(16, 1)
            image = (torch.rand(3, img, img, generator=g) * 60 + mask[None] * 40).to(torch.uint8)
            self.items.append({"image": image, "mask": mask})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


def _epoch_timer():
    import lightning as L

    class EpochTimer(L.Callback):
        def __init__(self):
            self.times: list[float] = []
            self._t0 = 0.0

        def on_train_epoch_start(self, trainer, module):
            self._t0 = time.perf_counter()

        def on_validation_epoch_end(self, trainer, module):
            self.times.append(time.perf_counter() - self._t0)

    return EpochTimer()


def _measure(cfg: dict, cache: bool) -> tuple[list[float], int]:
    import lightning as L

    from backbones import create_vit
    from datamodules.segmentation import SegmentationDataModule
    from probes.core.features import FeatureSpec, FrozenFeatures
    from probes.dense.module_seg import SegmentationProbe

    L.seed_everything(0, verbose=False)
    vit = create_vit(cfg["arch"], "softmax")
    calls = {"n": 0}
    extract = vit.extract

    def counting(*a, **k):
        calls["n"] += 1
        return extract(*a, **k)
    vit.extract = counting
    feats = FrozenFeatures(vit, FeatureSpec(kind="dense", with_cls=True))
    p = vit.patch_size

    class SceneData(SegmentationDataModule):  # the probes' DataModule over the in-memory scenes
        def _build(self, split, train=False):
            return _Scenes(cfg["n_train"] if train else cfg["n_val"], cfg["img"], 0 if train else 1)
    data = SceneData("voc", "", img_size=cfg["img"], patch_size=p, batch_size=cfg["batch"])
    module = SegmentationProbe(feats, data, num_classes=5, cache=cache)
    timer = _epoch_timer()
    trainer = L.Trainer(max_epochs=cfg["epochs"], logger=False, enable_checkpointing=False, num_sanity_val_steps=0,
                        reload_dataloaders_every_n_epochs=1, enable_model_summary=False, enable_progress_bar=False,
                        callbacks=[timer], accelerator="auto", devices=1)
    trainer.fit(module)
    return timer.times, calls["n"]


def run(quick: bool = False) -> dict:
    """Rows: one per (backbone, cache on/off, epoch). ``later_over_first``: median later epoch / epoch 1
    with the cache, for the first (protocol) configuration."""
    rows, summary = [], {}
    for cfg in (QUICK if quick else FULL):
        name = f"{cfg['arch']}@{cfg['img']}"
        for cache in (True, False):
            times, calls = _measure(cfg, cache)
            first = times[0]
            later = statistics.median(times[1:]) if len(times) > 1 else float("nan")
            for i, t in enumerate(times):
                rows.append({"backbone": name, "cache": cache, "epoch": i + 1, "seconds": round(t, 4),
                             "ratio_to_first": round(t / first, 4)})
            summary[f"{name} {'cached' if cache else 'uncached'}"] = {
                "later_over_first": round(later / first, 4), "backbone_calls": calls}
    ratio = next(iter(summary.values()))["later_over_first"]
    return {"bench": "probe_cache", "configs": QUICK if quick else FULL, "rows": rows, "summary": summary,
            "later_over_first": ratio, "target": TARGET, "meets_target": bool(ratio <= TARGET)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    print(json.dumps(run(quick=ap.parse_args(argv).quick), indent=2))


if __name__ == "__main__":
    main()
