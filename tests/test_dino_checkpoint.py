"""An official DINO training checkpoint (``main_dino.py``'s ``checkpoint.pth``) loads with weights_only=True.

The official ViT, head and wrapper are the transcription of facebookresearch/dino in ``official/vit.py``
(``vision_transformer.py``: vit_small, DINOHead; ``utils.py``: MultiCropWrapper); drop path / dropout are zero.
The checkpoint is saved with the keys and objects of ``main_dino.py``: student under DDP (``module.`` prefixes), teacher plain, the optimiser state of the
student's two parameter groups (``--optimizer sgd``, the lighter of DINO's options), epoch, ``args`` as an ``argparse.Namespace`` and the ``dino_loss`` center.
"""
import argparse
import datetime
import pickle

import pytest
import torch

import backbones
from official.vit import DINOHead, MultiCropWrapper, get_params_groups, vit_small
from tokenmix.io import CheckpointError, safe_torch_load

pytestmark = pytest.mark.filterwarnings("ignore:.*weight_norm.*:FutureWarning")  # DINO's own (old) weight-norm API

# --------------------------------------------------------------------------- the checkpoint, as main_dino.py saves it

ARGS = argparse.Namespace(  # main_dino.py's parser defaults (out_dim made small to keep the file small)
    arch="vit_small", patch_size=16, out_dim=1024, norm_last_layer=True, momentum_teacher=0.996,
    use_bn_in_head=False, warmup_teacher_temp=0.04, teacher_temp=0.04, warmup_teacher_temp_epochs=0,
    use_fp16=False, weight_decay=0.04, weight_decay_end=0.4, clip_grad=3.0, batch_size_per_gpu=64, epochs=100,
    freeze_last_layer=1, lr=0.0005, warmup_epochs=10, min_lr=1e-06, optimizer="sgd", drop_path_rate=0.1,
    global_crops_scale=(0.4, 1.0), local_crops_number=8, local_crops_scale=(0.05, 0.4),
    data_path="/path/to/imagenet/train/", output_dir=".", saveckp_freq=20, seed=0, num_workers=10,
    dist_url="env://", local_rank=0, rank=0, world_size=1, gpu=0)


@pytest.fixture(scope="module")
def dino_checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    student = MultiCropWrapper(vit_small(16), DINOHead(384, ARGS.out_dim))
    teacher = MultiCropWrapper(vit_small(16), DINOHead(384, ARGS.out_dim))
    teacher.load_state_dict(student.state_dict())
    optimizer = torch.optim.SGD(get_params_groups(student), lr=0, momentum=0.9)  # --optimizer sgd (1 state/param)
    for i, param_group in enumerate(optimizer.param_groups):  # what train_one_epoch's schedules set
        param_group["lr"] = 0.05
        if i == 0:
            param_group["weight_decay"] = 0.04
    for p in student.parameters():  # one training step: the student (and its optimiser state) moves on
        p.grad = torch.randn_like(p)
    optimizer.step()
    with torch.no_grad():  # the EMA teacher lags behind
        for ps, pt in zip(student.parameters(), teacher.parameters()):
            pt.mul_(0.5).add_(0.5 * ps.detach())
    student_sd = {f"module.{k}": v for k, v in student.state_dict().items()}  # DistributedDataParallel's keys
    save_dict = {
        'student': student_sd,
        'teacher': teacher.state_dict(),
        'optimizer': optimizer.state_dict(),
        'epoch': 1,
        'args': ARGS,
        'dino_loss': {"center": torch.randn(1, ARGS.out_dim)},  # DINOLoss.state_dict(): its center buffer
    }  # (use_fp16=False: no 'fp16_scaler' entry)
    path = tmp_path_factory.mktemp("dino") / "checkpoint.pth"
    torch.save(save_dict, path)
    return path, student.backbone.eval(), teacher.backbone.eval()


@pytest.mark.timeout(300)
def test_official_training_checkpoint_loads_teacher_and_student(dino_checkpoint):
    path, student, teacher = dino_checkpoint
    ckpt = safe_torch_load(path)  # weights_only=True, Namespace allowed
    assert isinstance(ckpt["args"], argparse.Namespace) and ckpt["args"].arch == "vit_small"
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    ours = backbones.create_vit("vit_small_patch16", "softmax").eval()
    assert backbones.load_checkpoint(ours, path) == {"missing": [], "unexpected": []}
    with torch.no_grad():
        ref_t, ref_s = teacher(x), student(x)
        got = ours(x)
        torch.testing.assert_close(got, ref_t, atol=1e-4, rtol=0)
        assert (got - ref_s).abs().max() > 1e-2  # the teacher was loaded, not the student
        rebuilt = backbones.backbone_from_checkpoint(path, which="student").eval()
        assert (rebuilt.arch, rebuilt.variant) == ("vit_small_patch16", "softmax")
        torch.testing.assert_close(rebuilt(x), ref_s, atol=1e-4, rtol=0)


def test_text_files_and_other_pickles_say_what_they_are_not(tmp_path):
    text = tmp_path / "checkpoint.pth"
    text.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\n")  # an LFS pointer
    with pytest.raises(CheckpointError, match=r"a text file \(starts 'version https://git-lfs.*not a torch checkpoint"):
        safe_torch_load(text)
    plain = tmp_path / "plain.pkl"
    plain.write_bytes(pickle.dumps({"teacher": {}}))
    with pytest.raises(CheckpointError, match=r"a plain pickle \(pickle.dump\), not a torch checkpoint"):
        safe_torch_load(plain)
    other = tmp_path / "other.pth"
    torch.save({"teacher": {}, "args": argparse.Namespace(when=datetime.date(2021, 4, 29))}, other)
    with pytest.raises(CheckpointError, match=r"not a weights-only one: it holds a datetime.date object"):
        safe_torch_load(other)
    empty = tmp_path / "empty.pth"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError, match="an empty file, not a torch checkpoint"):
        safe_torch_load(empty)
    binary = tmp_path / "random.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(CheckpointError, match="not a torch checkpoint .neither a zip archive"):
        safe_torch_load(binary)
