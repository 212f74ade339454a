"""Box -> patch mapping, Patch Score and Point-in-Box on hand-built cases with known answers."""
import pytest
import torch
from torch import nn
from torchvision import tv_tensors
from torchvision.transforms import v2

from analysis.boxes import boxes_to_patch_mask, map_boxes, resize_crop_params
from analysis.data import Sample, eval_crop
from analysis.patch_score import patch_scores, pib_hits, single_small_object
from analysis.tasks import Options, run_pib


@pytest.mark.parametrize("w,h", [(500, 375), (333, 500), (257, 911), (300, 300), (100, 80), (641, 480)])
def test_box_mapping_matches_torchvision_transform(w, h):
    """map_boxes == torchvision v2 Resize(256) + CenterCrop(224) applied to BoundingBoxes (independent code)."""
    boxes = torch.tensor([[10.0, 20.0, w - 30.0, h - 5.0], [w * 0.4, h * 0.3, w * 0.6, h * 0.9], [0, 0, w, h]])
    bb = tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(h, w))
    img = tv_tensors.Image(torch.zeros(3, h, w, dtype=torch.uint8))
    out_img, out_b = v2.Compose([v2.Resize(256), v2.CenterCrop(224)])(img, bb)
    assert out_img.shape[-2:] == (224, 224)
    got = map_boxes(boxes, resize_crop_params(w, h, 256, 224))
    torch.testing.assert_close(got, out_b.as_subclass(torch.Tensor).double(), atol=1e-4, rtol=0)


def test_hand_worked_box_to_patches():
    # 448x320 image: short side 320 -> 256 (scale 0.8), resized 358x256, crop offsets left=67, top=16
    rc = resize_crop_params(448, 320)
    assert (rc.left, rc.top) == (67, 16) and rc.sx == pytest.approx(358 / 448) and rc.sy == pytest.approx(0.8)
    b = map_boxes(torch.tensor([[100.0, 50.0, 200.0, 150.0]]), rc)
    torch.testing.assert_close(b, torch.tensor([[100 * 358 / 448 - 67, 24.0, 200 * 358 / 448 - 67, 104.0]],
                                                dtype=torch.float64))
    # x 12.9..92.8 -> patch columns 0..5; y 24..104 -> rows 1..6 (16 px patches, 14x14 grid)
    m = boxes_to_patch_mask(b, (14, 14), 16).reshape(14, 14)
    expect = torch.zeros(14, 14, dtype=torch.bool)
    expect[1:7, 0:6] = True
    assert torch.equal(m, expect)


def test_patch_boundaries_and_cropped_away_boxes():
    # a box exactly covering patch (1, 1) does not touch its neighbours
    m = boxes_to_patch_mask(torch.tensor([[16.0, 16.0, 32.0, 32.0]]), (4, 4), 16)
    assert m.nonzero().flatten().tolist() == [5]
    # union of two boxes
    m2 = boxes_to_patch_mask(torch.tensor([[0.0, 0, 8, 8], [40.0, 40, 64, 64]]), (4, 4), 16)
    assert m2.nonzero().flatten().tolist() == [0, 10, 11, 14, 15]
    # a box entirely in the part the centre crop removes selects nothing
    rc = resize_crop_params(512, 256)  # resized 512x256 -> crop cols 144..368
    gone = map_boxes(torch.tensor([[0.0, 0.0, 100.0, 256.0]]), rc)
    assert not boxes_to_patch_mask(gone, (14, 14), 16).any()


def test_patch_scores_and_hits():
    cls = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    patch = torch.tensor([[[1.0, 1.0], [2.0, 0.0], [0.0, 3.0]], [[1.0, 0.0], [1.0, 1.0], [0.0, 0.1]]])
    s = patch_scores(cls, patch)
    torch.testing.assert_close(s, torch.tensor([[2 ** -0.5, 1.0, 0.0], [0.0, 2 ** -0.5, 1.0]]))
    masks = torch.tensor([[False, True, False], [True, True, False]])
    assert pib_hits(s, masks).tolist() == [True, False]


def test_single_small_object_filter():
    assert single_small_object(torch.tensor([[0.0, 0.0, 49.0, 50.0]]), 100, 100)  # 24.5% of the image
    assert not single_small_object(torch.tensor([[0.0, 0.0, 50.0, 50.0]]), 100, 100)  # exactly 25%
    assert not single_small_object(torch.tensor([[0.0, 0.0, 10.0, 10.0]] * 2), 100, 100)  # two objects


class RedDetector(nn.Module):
    """Stand-in backbone with a known answer: patch feature = mean colour of the patch, [CLS] = 'red'."""
    depth, patch_size, num_prefix_tokens, aggregator = 2, 16, 1, None

    def grid_size(self, x):
        return x.shape[-2] // 16, x.shape[-1] // 16

    def extract(self, x, blocks=None, votes=False, n_last_blocks=1):
        B = x.shape[0]
        f = nn.functional.avg_pool2d(x, 16).flatten(2).transpose(1, 2)  # (B, N, 3) normalised colour
        f = f - f.mean(1, keepdim=True)
        red = torch.tensor([1.0, -0.5, -0.5]).expand(B, 3)
        return [{"cls": red, "patch": f}, {"cls": red, "patch": f}]


class FakeRun:
    def __init__(self):
        self.figs, self.scalars = [], []

    def save_figure(self, name, fig):
        import matplotlib.pyplot as plt
        plt.close(fig)
        self.figs.append(name)

    def log_scalar(self, *a):
        self.scalars.append(a)


def scene(w, h, red_box):
    img = torch.full((3, h, w), 110, dtype=torch.uint8)
    x0, y0, x1, y1 = red_box
    img[:, y0:y1, x0:x1] = torch.tensor([230, 20, 20], dtype=torch.uint8)[:, None, None]
    return img


def test_pib_end_to_end_on_hand_built_scenes():
    # the red object sits inside the GT box in the first two images, outside it in the third
    s1 = Sample(0, scene(400, 300, (200, 120, 260, 170)), torch.tensor([[190.0, 110.0, 270.0, 180.0]]), "a")
    s2 = Sample(1, scene(300, 500, (60, 200, 140, 280)), torch.tensor([[50.0, 190.0, 150.0, 290.0]]), "b")
    s3 = Sample(2, scene(320, 320, (40, 40, 100, 100)), torch.tensor([[200.0, 200.0, 300.0, 300.0]]), "c")
    no_box = Sample(3, scene(320, 320, (0, 0, 1, 1)), torch.zeros(0, 4), "d")  # skipped: nothing to hit
    # sanity: the red object survives the crop where it should
    x, _ = eval_crop(s1.image, 256, 224)
    assert x.shape == (3, 224, 224)
    run = FakeRun()
    res = run_pib(RedDetector(), [s1, s2, s3, no_box], run, Options(crop=224, resize=256, batch_size=2, num_vis=2))
    assert res["n_images"] == 3
    assert res["pib"] == pytest.approx(200 / 3, abs=1e-3) and res["pib_per_layer"] == [res["pib"]] * 2
    assert "patch_score_maps" in run.figs and "pib_per_layer" in run.figs
    # chance level = mean share of box patches. By hand for s1 (400x300 -> 341x256, crop offsets 58, 16):
    # x 190..270 -> 103.975..172.175 (cols 6..10), y 110..180 -> 77.87..137.6 (rows 4..8): 25 of 196 patches
    s1_patches = boxes_to_patch_mask(map_boxes(s1.boxes, resize_crop_params(400, 300)), (14, 14), 16)
    assert s1_patches.sum() == 25 and s1_patches.reshape(14, 14)[4:9, 6:11].all()
    shares = [boxes_to_patch_mask(map_boxes(s.boxes, resize_crop_params(*s.image.shape[:0:-1])), (14, 14), 16)
              .float().mean() for s in (s1, s2, s3)]
    assert res["pib_chance"] == pytest.approx(100 * float(sum(shares)) / 3, abs=1e-3)
    only_small = run_pib(RedDetector(), [s1, s2, s3], FakeRun(), Options(pib_subset="single_small", num_vis=0))
    assert only_small["n_images"] == 3 and only_small["n_single_small"] == 3
