"""Protocol transforms against torchvision's reference implementation and hand-worked numbers."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision.transforms.v2 as T
import torchvision.transforms.v2.functional as TF
from torchvision import tv_tensors

from datamodules.depth_protocol import DEPTH_RANGES, eval_depth_mask
from datamodules.transforms import (FixedResize, LinearProbeTrain, RandomResizedCrop, ResizeCenterCrop,
                                    floor_to_multiple, normalize)
from datamodules.transforms.common import hflip


def _item(h=375, w=500, seed=0):
    g = torch.Generator().manual_seed(seed)
    img = torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8)
    boxes = torch.tensor([[100.0, 50.0, 300.0, 200.0], [0.0, 0.0, 40.0, 375.0]])
    return {"image": img, "boxes": boxes, "label": 3}


def test_resize256_centercrop224_matches_torchvision_image_and_boxes():
    item = _item()
    out = ResizeCenterCrop(256, 224)(item)
    ref = T.Compose([T.Resize(256, interpolation=T.InterpolationMode.BICUBIC, antialias=True), T.CenterCrop(224)])
    img_ref, box_ref = ref(item["image"], tv_tensors.BoundingBoxes(item["boxes"], format="XYXY",
                                                                   canvas_size=(375, 500)))
    assert torch.equal(out["image"], img_ref)
    assert torch.allclose(out["boxes"], box_ref.as_subclass(torch.Tensor), atol=1e-4)
    # hand-worked: 500x375 -> 341x256 (x scale 341/500, y 256/375), crop offsets left 58, top 16
    x0 = 100 * 341 / 500 - 58
    y0 = 50 * 256 / 375 - 16
    assert out["boxes"][0, :2].tolist() == pytest.approx([x0, y0], abs=1e-4)
    # the second box (x < 40 -> x < 27.3 after the resize) lies left of the crop: clipped to zero width
    assert out["boxes"][1].tolist() == pytest.approx([0, 0, 0, 224], abs=1e-4)
    assert out["label"] == 3


def test_eval_boxes_track_a_drawn_rectangle():
    img = torch.zeros(3, 300, 420, dtype=torch.uint8)
    img[:, 60:181, 130:331] = 255  # pixel edges x 130..331, y 60..181
    out = ResizeCenterCrop(256, 224)({"image": img, "boxes": torch.tensor([[130.0, 60.0, 331.0, 181.0]])})
    ys, xs = torch.nonzero(out["image"][0] > 127, as_tuple=True)
    drawn = torch.tensor([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], dtype=torch.float32)
    assert (out["boxes"][0] - drawn).abs().max() <= 1.0


def test_random_resized_crop_equals_torchvision_with_same_params():
    item = _item(seed=1)
    rrc = RandomResizedCrop(224, generator=torch.Generator().manual_seed(3))
    top, left, h, w = rrc.params(375, 500)
    rrc.generator = torch.Generator().manual_seed(3)
    out = rrc(item)
    boxes = tv_tensors.BoundingBoxes(item["boxes"], format="XYXY", canvas_size=(375, 500))
    img_ref = TF.resized_crop(item["image"], top, left, h, w, [224, 224], antialias=True)
    box_ref = TF.resized_crop(boxes, top, left, h, w, [224, 224])
    assert torch.equal(out["image"], img_ref)
    assert torch.allclose(out["boxes"], box_ref.as_subclass(torch.Tensor), atol=1e-4)
    assert 0.08 * 375 * 500 * 0.9 <= h * w <= 375 * 500


def test_hflip_boxes_match_torchvision():
    item = _item()
    ref = TF.horizontal_flip(tv_tensors.BoundingBoxes(item["boxes"], format="XYXY", canvas_size=(375, 500)))
    assert torch.equal(hflip(item)["boxes"], ref.as_subclass(torch.Tensor))


def test_eval_view_then_normalise_uses_imagenet_stats():
    img = torch.full((3, 300, 300), 128, dtype=torch.uint8)
    out = normalize(ResizeCenterCrop(None, 224)({"image": img})["image"])
    assert out.shape == (3, 224, 224)
    expected = [(128 / 255 - m) / s for m, s in zip((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]
    assert out[:, 0, 0].tolist() == pytest.approx(expected, abs=1e-5)


def test_linear_probe_train_is_torchvision_rrc_and_flip_on_the_same_rng():
    # DINO eval_linear.py: pth_transforms.RandomResizedCrop(224), RandomHorizontalFlip() on the global RNG
    item = _item(seed=2)
    ref = T.Compose([T.RandomResizedCrop(224, antialias=True), T.RandomHorizontalFlip()])
    for seed in range(4):
        torch.manual_seed(seed)
        out = LinearProbeTrain(224)(item)
        torch.manual_seed(seed)
        assert torch.equal(out["image"], ref(item["image"])) and out["label"] == 3
    assert out["image"].dtype == torch.uint8  # the model normalises


def test_fixed_resize_matches_pil_and_moves_targets_only_for_training():
    from PIL import Image
    g = torch.Generator().manual_seed(0)
    img = torch.randint(0, 256, (3, 64, 80), generator=g, dtype=torch.uint8)
    mask = torch.arange(64 * 80).view(64, 80) % 21
    depth = torch.rand(64, 80, generator=g)
    train = FixedResize((32, 40), targets=True)({"image": img, "mask": mask, "depth": depth, "label": 1})
    pil = Image.fromarray(img.permute(1, 2, 0).numpy()).resize((40, 32), Image.BILINEAR)  # antialiased by PIL
    ref = torch.from_numpy(np.array(pil)).permute(2, 0, 1).int()
    assert train["image"].dtype == torch.uint8 and (train["image"].int() - ref).abs().max() <= 1
    # nearest at exactly half size: pixel (i, j) <- (2i, 2j), hand-worked
    assert torch.equal(train["mask"], mask[::2, ::2]) and torch.equal(train["depth"], depth[::2, ::2])
    val = FixedResize((32, 40), targets=False)({"image": img, "mask": mask})
    assert val["image"].shape == (3, 32, 40) and val["mask"] is mask  # evaluation at label size
    assert floor_to_multiple(60, 16) == (48, 48) and floor_to_multiple((120, 7), 8) == (120, 8)


def test_eval_depth_mask_crops_and_ranges_hand_counted():
    assert DEPTH_RANGES == {"nyuv2": (1e-3, 10.0), "sunrgbd": (1e-3, 10.0), "kitti": (1e-3, 80.0)}
    d = torch.full((480, 640), 5.0)
    assert int(eval_depth_mask("nyuv2", d).sum()) == (471 - 45) * (601 - 41)
    m = eval_depth_mask("nyuv2", d)
    assert m[45, 41] and m[470, 600] and not m[44, 41] and not m[45, 601]
    d[100, 100], d[101, 100], d[102, 100] = 0.0, 10.0, 9.99  # unknown, at max (excluded), inside
    m = eval_depth_mask("nyu", d)
    assert not m[100, 100] and not m[101, 100] and m[102, 100]
    k = torch.full((352, 1216), 20.0)  # KB-cropped frame
    # Garg: rows int(0.40810811*352)=143 .. int(0.99189189*352)=349, cols int(0.03594771*1216)=43 .. 1172
    assert int(eval_depth_mask("kitti", k).sum()) == (349 - 143) * (1172 - 43)
    k[200, 200] = 80.0
    assert not eval_depth_mask("kitti", k)[200, 200]
    # SUN RGB-D: clipped at 8 m first (12 m counts), Eigen crop at fixed indices (clipped by a small frame)
    s = torch.full((2, 60, 80), 3.0)
    assert int(eval_depth_mask("sunrgbd", s).sum()) == 2 * (60 - 45) * (80 - 41)
    assert torch.equal(eval_depth_mask("sunrgbd", s * 4), eval_depth_mask("sunrgbd", s))
    assert eval_depth_mask("sunrgbd", s * 0).sum() == 0
    with pytest.raises(ValueError, match="no depth evaluation settings"):
        eval_depth_mask("voc", s)


@pytest.mark.parametrize("hw,crop", [((375, 500), 224), ((64, 64), 56), ((80, 60), 64), ((73, 90), 64)])
def test_eval_view_is_torchvision_resize_centercrop_and_the_dict_view_agrees(hw, crop):
    from datamodules.transforms.views import IMAGENET_MEAN, IMAGENET_STD, eval_resize, eval_view, normalize
    assert (eval_resize(224), eval_resize(56), eval_resize(64), eval_resize(32, 1.0)) == (256, 64, 73, 32)
    img = _item(*hw)["image"]
    ref = T.Compose([T.Resize(eval_resize(crop), interpolation=T.InterpolationMode.BICUBIC, antialias=True),
                     T.CenterCrop(crop)])(img)
    assert torch.equal(eval_view(img, crop), ref)
    assert torch.equal(ResizeCenterCrop(None, crop)({"image": img})["image"], ref)
    x = normalize(ref)
    expected = (ref[1, 3, 5].item() / 255 - IMAGENET_MEAN[1]) / IMAGENET_STD[1]  # hand-worked, one pixel
    assert x.dtype == torch.float32 and x[1, 3, 5].item() == pytest.approx(expected, abs=1e-6)
