"""An official DINO training checkpoint (``main_dino.py``'s ``checkpoint.pth``) loads with weights_only=True.

The official ViT, head and wrapper are transcribed below from facebookresearch/dino (``vision_transformer.py``:
Mlp, Attention, Block, PatchEmbed, VisionTransformer, vit_small, DINOHead; ``utils.py``: MultiCropWrapper,
get_params_groups), without drop path / dropout (zero at evaluation). The checkpoint is saved with the keys and
objects of ``main_dino.py``: student under DDP (``module.`` prefixes), teacher plain, the optimiser state of the
student's two parameter groups (``--optimizer sgd``, the lighter of DINO's options), epoch, ``args`` as an ``argparse.Namespace`` and the ``dino_loss`` center.
"""
import argparse
import datetime
import pickle
from functools import partial

import pytest
import torch
from torch import nn

import backbones
from helpers.official_dino_utils import get_params_groups
from tokenmix.io import CheckpointError, safe_torch_load

pytestmark = pytest.mark.filterwarnings("ignore:.*weight_norm.*:FutureWarning")  # DINO's own (old) weight-norm API

# --------------------------------------------------------------------------- facebookresearch/dino, transcribed


class Mlp(nn.Module):
    def __init__(self, in_features, hidden_features):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_features, in_features)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Attention(nn.Module):
    def __init__(self, dim, num_heads=8, qkv_bias=False):
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(B, N, C))


class Block(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio=4., qkv_bias=False, norm_layer=nn.LayerNorm):
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = Attention(dim, num_heads=num_heads, qkv_bias=qkv_bias)
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    def __init__(self, img_size=224, patch_size=16, in_chans=3, embed_dim=768):
        super().__init__()
        self.num_patches = (img_size // patch_size) * (img_size // patch_size)
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class VisionTransformer(nn.Module):
    def __init__(self, img_size=(224,), patch_size=16, embed_dim=768, depth=12, num_heads=12, mlp_ratio=4.,
                 qkv_bias=False, norm_layer=nn.LayerNorm):
        super().__init__()
        self.num_features = self.embed_dim = embed_dim
        self.patch_embed = PatchEmbed(img_size=img_size[0], patch_size=patch_size, embed_dim=embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches + 1, embed_dim))
        self.blocks = nn.ModuleList([Block(embed_dim, num_heads, mlp_ratio, qkv_bias, norm_layer)
                                     for _ in range(depth)])
        self.norm = norm_layer(embed_dim)
        self.head = nn.Identity()
        nn.init.trunc_normal_(self.pos_embed, std=.02)
        nn.init.trunc_normal_(self.cls_token, std=.02)
        self.apply(self._init_weights)

    def _init_weights(self, m):
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=.02)
            if m.bias is not None:
                nn.init.constant_(m.bias, 0)

    def forward(self, x):  # 224 px input: the position embeddings need no interpolation
        x = self.patch_embed(x)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x)[:, 0]


def vit_small(patch_size=16):
    return VisionTransformer(patch_size=patch_size, embed_dim=384, depth=12, num_heads=6, mlp_ratio=4,
                             qkv_bias=True, norm_layer=partial(nn.LayerNorm, eps=1e-6))


class DINOHead(nn.Module):
    def __init__(self, in_dim, out_dim, nlayers=3, hidden_dim=2048, bottleneck_dim=256):
        super().__init__()
        layers = [nn.Linear(in_dim, hidden_dim), nn.GELU()]
        for _ in range(nlayers - 2):
            layers += [nn.Linear(hidden_dim, hidden_dim), nn.GELU()]
        layers.append(nn.Linear(hidden_dim, bottleneck_dim))
        self.mlp = nn.Sequential(*layers)
        self.last_layer = nn.utils.weight_norm(nn.Linear(bottleneck_dim, out_dim, bias=False))
        self.last_layer.weight_g.data.fill_(1)


class MultiCropWrapper(nn.Module):
    def __init__(self, backbone, head):
        super().__init__()
        backbone.fc, backbone.head = nn.Identity(), nn.Identity()
        self.backbone = backbone
        self.head = head


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
