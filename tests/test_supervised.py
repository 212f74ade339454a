"""Label-supervised module: the release's schedule and optimiser, learning on an easy task, and checkpoints that
the backbone loader (probes, analyses) reads."""
import math

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import backbones
from lightning_modules.supervised_module import SupervisedModule, lr_multiplier

pytestmark = pytest.mark.timeout(120)  # default for the quick tests; slow ones carry their own


def test_lr_multiplier_is_detectron2_warmup_cosine():
    # hand-worked from fvcore: cosine(t) = 0.001 + 0.5 * 0.999 * (1 + cos(pi t)); linear warm-up over the first
    # 1% from 0.1 * cosine(0) to cosine(0.01) (WarmupParamScheduler with "rescaled" warm-up, "fixed" cosine)
    c = lambda t: 0.001 + 0.4995 * (1 + math.cos(math.pi * t))  # noqa: E731
    assert lr_multiplier(0.0) == pytest.approx(0.1)
    assert lr_multiplier(0.005) == pytest.approx(0.1 + 0.5 * (c(0.01) - 0.1))
    assert lr_multiplier(0.01) == pytest.approx(0.99975353, abs=1e-8)  # = c(0.01), the cosine continues
    assert lr_multiplier(0.5) == pytest.approx(0.5005)
    assert lr_multiplier(1.0) == pytest.approx(0.001)


def test_adamw_decays_every_parameter_with_release_betas():
    m = SupervisedModule(arch="vit_test_patch8", variant="registers", num_classes=4, epochs=1)
    opt = m.configure_optimizers()
    assert len(opt.param_groups) == 1 and opt.param_groups[0]["weight_decay"] == 0.3
    assert opt.param_groups[0]["betas"] == (0.9, 0.95)
    ids = {id(p) for p in opt.param_groups[0]["params"]}
    for name in ("cls_token", "pos_embed", "reg_token", "norm.bias", "head.bias"):
        assert id(m.backbone.get_parameter(name)) in ids, name  # no exclusions (get_default_optimizer_params)
    assert torch.count_nonzero(m.backbone.head.weight) == 0  # torchvision's zero-initialised head


def _easy_data(n: int, seed: int):
    """4 classes, each a different colour patch at a random place on a noise background (32 px)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 32, 32, generator=g) * 0.3
    y = torch.arange(n) % 4
    colours = torch.tensor([[2.0, -1, -1], [-1, 2.0, -1], [-1, -1, 2.0], [2.0, 2.0, -1]])
    for i in range(n):
        r, c = torch.randint(0, 20, (2,), generator=g).tolist()
        x[i, :, r:r + 12, c:c + 12] = colours[y[i]].view(3, 1, 1)
    return TensorDataset(x, y)


class _EasyData(pl.LightningDataModule):
    def train_dataloader(self):
        return DataLoader(_easy_data(256, 0), batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0))

    def val_dataloader(self):
        return DataLoader(_easy_data(128, 1), batch_size=64)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("sup")
    pl.seed_everything(0)
    model = SupervisedModule(arch="vit_test_patch8", variant="entmax+lastvit", num_classes=4, epochs=5,
                             lr=2e-3, weight_decay=0.05)
    trainer = pl.Trainer(max_epochs=5, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=-1, default_root_dir=root,
                         callbacks=[pl.callbacks.ModelCheckpoint(dirpath=root, save_last=True)])
    trainer.fit(model, datamodule=_EasyData())
    return model, root / "last.ckpt"


@pytest.mark.timeout(300)
def test_training_learns_above_chance_and_init(trained):
    model, _ = trained
    init, final = model.random_init["val_top1"], model.last_val["val_top1"]
    assert init < 45  # 4 classes: chance 25%; the zero head predicts one class
    assert final > 85 and final > init + 40
    assert model.last_val["val_top5"] == 100.0  # top-k clipped to the 4 classes


@pytest.mark.timeout(300)
def test_checkpoint_loads_as_feature_backbone_and_as_classifier(trained):
    model, ckpt = trained
    model.eval()
    x = _easy_data(8, 2).tensors[0]
    feats = backbones.backbone_from_checkpoint(ckpt).eval()  # what make probe / make analyze call
    assert (feats.variant, "num_classes" in feats.config) == ("entmax+lastvit", False)
    clf = backbones.backbone_from_checkpoint(ckpt, num_classes=4).eval()
    with torch.no_grad():
        ref_tokens = model.backbone.extract(x)[-1]["cls"]
        assert torch.allclose(feats(x), ref_tokens, atol=1e-6)
        assert torch.allclose(clf(x), model(x), atol=1e-6)


def test_dino_checkpoint_loader_still_refuses_supervised_for_dino_resume(trained):
    from backbones.checkpoint import DINO, SUPERVISED, validate_lightning
    from tokenmix.io import CheckpointError, safe_torch_load
    _, ckpt = trained
    obj = safe_torch_load(ckpt)
    assert validate_lightning(obj, str(ckpt), SUPERVISED) is obj
    with pytest.raises(CheckpointError, match="student.backbone"):
        validate_lightning(obj, str(ckpt), DINO)
    with pytest.raises(CheckpointError, match="not a supervised one"):
        validate_lightning({"state_dict": {}, "tokenmix": {"kind": "dino_pretrain"}}, "x.ckpt", SUPERVISED)


def test_vote_box_stats_hand_worked():
    from analysis.votes import vote_box_stats
    votes = torch.tensor([[3, 1, 0, 0], [0, 0, 2, 2]])  # 4 votes per image over a 2x2 grid
    masks = torch.tensor([[True, False, False, True], [True, True, False, False]])
    s = vote_box_stats(votes, masks)
    assert s["share_in_box"].tolist() == [0.75, 0.0]
    assert s["top_in_box"].tolist() == [1.0, 0.0]
    assert s["chance"].tolist() == [0.5, 0.5]
    assert s["top1_share"].tolist() == [0.75, 0.5]
    assert s["patches_with_votes"].tolist() == [2.0, 2.0]


def test_report_has_supervised_rows_and_lastvit_reference(tmp_path):
    from analysis.report_supervised import supervised_section
    from tokenmix.results import write_summary
    run = tmp_path / "lastvit" / "pretrain" / "supervised_demo" / "version_0"
    run.mkdir(parents=True)
    write_summary(run, objective="supervised", variant="lastvit", data="demo", backbone_config={"arch": "a"},
                  metrics={"val_top1": 91.25, "val_top5": 100.0, "val_top1_random_init": 12.5, "steps": 300})
    dino = tmp_path / "softmax" / "pretrain" / "supervised_x" / "version_0"
    dino.mkdir(parents=True)
    write_summary(dino, objective="dino", variant="softmax", data="demo", backbone_config={}, metrics={"knn_top1": 80.0})
    text = "\n".join(supervised_section(tmp_path))
    assert "| lastvit [demo] | 91.25 | 100.00 | 12.50 | 300 | not run |" in text
    assert "softmax" not in text.split("| run |")[1].split("*paper")[0]  # DINO runs are not supervised rows
    assert "| 67.40 | 87.60 |" in text and "| 67.60 | 87.80 |" in text
