"""The checkpoint format has one owner (backbones/checkpoint.py): BackboneConfig round trips, old dicts, refusals,
one read per file. Expected values come from the module that saved the checkpoint, hashlib over the file and
the model built directly with create_vit."""
import builtins
import hashlib
import io
import json

import lightning.pytorch as pl
import pytest
import torch

import backbones
from backbones import BackboneConfig, read_checkpoint
from lightning_modules.dino_module import DINOPretrainModule
from lightning_modules.export import export
from lightning_modules.supervised_module import SupervisedModule
from backbones.load import resolve_backbone
from tokenmix.io import CheckpointError

TINY_HEAD = dict(out_dim=64, head_hidden_dim=32, head_bottleneck_dim=16, epochs=2, warmup_epochs=0)
X = torch.randn(2, 3, 32, 32)


def _dino(variant="entmax+lastvit", **opts):
    torch.manual_seed(0)
    m = DINOPretrainModule(arch="vit_test_patch8", variant=variant, variant_options=opts, **TINY_HEAD)
    m.trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                           enable_progress_bar=False, enable_model_summary=False)
    return m


def _save(module, path):
    """What Lightning writes: the state dict plus what the module's on_save_checkpoint adds."""
    ckpt = {"state_dict": module.state_dict(), "epoch": 1, "global_step": 7}
    module.on_save_checkpoint(ckpt)
    torch.save(ckpt, path)
    return path


def test_dino_checkpoint_round_trips_backbone_config(tmp_path):
    module = _dino(lastvit_k=3, img_size=48)
    path = _save(module, tmp_path / "last.ckpt")
    raw = torch.load(path, weights_only=True)  # plain types only
    assert raw["tokenmix"]["backbone"] == {"arch": "vit_test_patch8", "variant": "entmax+lastvit", "img_size": 48,
                                           "lastvit_k": 3}
    ck = read_checkpoint(path)
    assert ck.config == module.student.backbone.backbone_config and ck.recorded
    assert ck.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() and ck.progress["global_step"] == 7
    rebuilt = ck.build().eval()
    assert rebuilt.aggregator.k == 3 and rebuilt.pos_embed.shape[1] == 1 + 6 * 6
    teacher = module.teacher.backbone.eval()
    assert torch.equal(rebuilt(X), teacher(X))
    module.on_load_checkpoint(torch.load(path, weights_only=True))  # the same run resumes
    with pytest.raises(CheckpointError, match=r"trained with lastvit_k=3 but this run builds lastvit_k=1"):
        _dino(img_size=48).on_load_checkpoint(torch.load(path, weights_only=True))


def test_supervised_checkpoint_round_trips_backbone_config(tmp_path):
    torch.manual_seed(0)
    module = SupervisedModule(arch="vit_test_patch8", variant="lastvit", num_classes=4, zero_init_head=False,
                              variant_options={"lastvit_k": 2}, epochs=2)
    path = _save(module, tmp_path / "sup.ckpt")
    entry = torch.load(path, weights_only=True)["tokenmix"]
    assert (entry["kind"], entry["num_classes"], entry["backbone"]) == (
        "supervised", 4, {"arch": "vit_test_patch8", "variant": "lastvit", "lastvit_k": 2})
    ck = read_checkpoint(path)
    assert ck.config == module.backbone.backbone_config.replace(num_classes=0)
    clf = ck.build(num_classes=4).eval()
    assert torch.equal(clf(X), module.backbone.eval()(X))
    with pytest.raises(CheckpointError, match="a dino_pretrain checkpoint, not a supervised one"):
        module.on_load_checkpoint(torch.load(_save(_dino(), tmp_path / "dino.ckpt"), weights_only=True))


def test_old_style_dict_still_loads(tmp_path):
    """The entry as older versions wrote it: no kind, lastvit_sigma recorded as None, spec lists."""
    model = backbones.create_vit("vit_test_patch8", "entmax+lastvit", lastvit_k=2)
    old = {"arch": "vit_test_patch8", "variant": "entmax+lastvit", "lastvit_k": 2, "lastvit_sigma": None}
    sd = {f"teacher.backbone.{k}": v for k, v in model.state_dict().items()}
    torch.save({"state_dict": sd, "tokenmix": {"backbone": old, "variant": "entmax+lastvit",
                                               "arch": "vit_test_patch8"}}, tmp_path / "old.ckpt")
    ck = read_checkpoint(tmp_path / "old.ckpt")
    assert ck.config == BackboneConfig("vit_test_patch8", "entmax+lastvit", lastvit_k=2) == model.backbone_config
    assert ck.entry["kind"] == "dino_pretrain"
    assert torch.equal(ck.build().eval()(X), model.eval()(X))


@pytest.mark.parametrize("entry,message", [
    (None, "no 'tokenmix' entry"),
    ({"backbone": {"arch": "vit_test_patch8", "variant": "softmax", "mlp_ratio": 3}}, r"unknown fields \['mlp_ratio'\]"),
    ({"backbone": {"arch": "vit_test_patch8"}}, r"no \['variant'\] field"),
    ({"backbone": {"arch": "vit_huge", "variant": "softmax"}}, "unknown arch 'vit_huge'"),
])
def test_incompatible_checkpoints_are_refused(tmp_path, entry, message):
    model = backbones.create_vit("vit_test_patch8")
    ckpt = {"state_dict": {f"teacher.backbone.{k}": v for k, v in model.state_dict().items()}}
    if entry is not None:
        ckpt["tokenmix"] = entry
    torch.save(ckpt, tmp_path / "x.ckpt")
    with pytest.raises(CheckpointError, match=message):
        read_checkpoint(tmp_path / "x.ckpt")
    with pytest.raises(CheckpointError, match=message):
        resolve_backbone(str(tmp_path / "x.ckpt"), "", "vit_test_patch8", 8)


def test_resolve_backbone_reads_the_file_once(tmp_path, monkeypatch):
    path = _save(_dino("registers", num_registers=2), tmp_path / "last.ckpt")
    expected = hashlib.sha256(path.read_bytes()).hexdigest()
    opened = []
    real_open = builtins.open

    def spy(file, *args, **kwargs):
        if str(file) == str(path):
            opened.append(args[0] if args else kwargs.get("mode", "r"))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy)
    monkeypatch.setattr(io, "open", spy)
    info = resolve_backbone(str(path), "", "vit_test_patch8", 8, which="student")
    monkeypatch.undo()
    assert opened == ["rb"]  # hashing, config and weights all from one read
    assert info.sha256 == expected
    assert info.backbone_config == BackboneConfig("vit_test_patch8", "registers", num_registers=2)
    assert info.run_name == "registers" and info.model.reg_token.shape[1] == 2
    student = torch.load(path, weights_only=True)["state_dict"]["student.backbone.reg_token"]
    assert torch.equal(info.model.reg_token, student)


def test_export_sidecar_rebuilds_the_variant_and_stale_ones_are_refused(tmp_path):
    module = _dino("entmax+lastvit", lastvit_k=2)
    out = export(_save(module, tmp_path / "last.ckpt"), tmp_path / "backbone.pth")
    sd = torch.load(out, weights_only=True)
    assert all(isinstance(v, torch.Tensor) for v in sd.values())  # the released DINO format: tensors only
    side = json.loads((tmp_path / "backbone.pth.json").read_text())
    assert side["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    rebuilt = backbones.backbone_from_checkpoint(out).eval()  # entmax and lastvit leave no trace in the tensors
    assert rebuilt.backbone_config == module.teacher.backbone.backbone_config
    assert torch.equal(rebuilt(X), module.teacher.backbone.eval()(X))
    torch.save({k: v + 1 for k, v in sd.items()}, out)  # the file changed, the sidecar did not
    with pytest.raises(CheckpointError, match="describes another file"):
        read_checkpoint(out)
