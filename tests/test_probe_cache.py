"""The feature cache: the backbone runs in the first epoch only, and training is unchanged by it."""
import lightning as L
import pytest
import torch

from backbones import create_vit
from datamodules.segmentation import SegmentationDataModule
from probes.core.features import FeatureSpec, FrozenFeatures
from probes.dense.module_seg import SegmentationProbe


class _Scenes(torch.utils.data.Dataset):
    """Tiny segmentation set: class = brightest colour channel per 8x8 block, some pixels ignored."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            blocks = torch.randint(0, 3, (4, 4), generator=g)
            mask = blocks.repeat_interleave(8, 0).repeat_interleave(8, 1)
            img = torch.nn.functional.one_hot(mask, 3).permute(2, 0, 1).to(torch.uint8) * 200 + 20
            mask = mask.clone()
            mask[:2] = 255
            self.items.append({"image": img, "mask": mask})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


class _SceneData(SegmentationDataModule):
    """The dense probes' DataModule (view, shards, loaders) over the in-memory scenes."""

    def __init__(self):
        super().__init__("voc", "", img_size=32, patch_size=8, batch_size=4)

    def _build(self, split, train=False):
        return _Scenes(10, 0) if train else _Scenes(5, 1)


def _fit(cache: bool, epochs: int = 3):
    L.seed_everything(0, verbose=False)
    torch.manual_seed(0)
    vit = create_vit("vit_test_patch8", "softmax")
    calls = {"n": 0}
    extract = vit.extract

    def counting(*a, **k):
        calls["n"] += 1
        return extract(*a, **k)
    vit.extract = counting
    feats = FrozenFeatures(vit, FeatureSpec(kind="dense"))
    module = SegmentationProbe(feats, _SceneData(), num_classes=3, cache=cache)
    trainer = L.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, num_sanity_val_steps=0,
                        reload_dataloaders_every_n_epochs=1, enable_model_summary=False, enable_progress_bar=False,
                        accelerator="cpu")
    trainer.fit(module)
    return module, calls["n"]


@pytest.mark.slow
def test_backbone_runs_once_and_results_equal_uncached():
    cached, n_cached = _fit(cache=True)
    plain, n_plain = _fit(cache=False)
    per_epoch = 3 + 2  # ceil(10/4) train + ceil(5/4) val batches
    assert n_cached == per_epoch and n_plain == 3 * per_epoch
    assert cached.caches["train"].complete and len(cached.caches["val"]) == 5
    # the cache holds exactly the features the backbone gives
    item = cached.data.train_set[7]
    ref = cached.features(item["image"][None])[0]
    assert torch.allclose(cached.caches["train"].feats[7], ref, atol=1e-6)
    # same shuffling, same features -> the same trained head and the same metrics
    for a, b in zip(cached.head.state_dict().values(), plain.head.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-5)
    assert cached.last_metrics["mIoU"] == plain.last_metrics["mIoU"]
