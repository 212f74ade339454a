"""Dense nearest-neighbour retrieval, the "Hummingbird" protocol (Balažević et al., NeurIPS 2023, *Towards
In-context Scene Understanding*), as open-hummingbird-eval (vpariza, v2.0.0) evaluates it; written here from the
paper and that code's behaviour, not copied.

- Memory bank: every training image, augmented ``aug_epochs`` times (``hummingbird_view``: the reference's colour
  jitter on the whole image first, brightness / contrast / saturation / hue 0.1 each with p = 0.5, on the PIL image
  as the reference; then RandomResizedCrop with scale (0.5, 2) shared by image and mask, bilinear on the float
  image), gives ``memory_size // (num_images * aug_epochs)`` patches (``sample_patches``: patches whose classes are
  rare in the image first, ties broken by uniform noise), each stored as its L2-normalised feature and its label
  distribution (the class frequencies of its pixels; ignore pixels count as class 0, as in the reference).
- A validation patch gets the labels of its k = 30 nearest memory patches (cosine similarity, exact search)
  averaged with the attention weights softmax(cos / 0.02); the label map is upsampled bilinearly to the mask, its
  argmax scored by ``probes.headfree.matching`` (Hungarian matching, as the reference's ``PredsmIoU``).
- ``DenseRetrievalProtocol``: the project's default, or ``HUMMINGBIRD``, the reference's published setting
  (``resolve_settings``).

Every random draw of an image comes from its own generator (seed, augmentation epoch, image index), so the memory
is the same however the images are sharded over processes.

>>> mem = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
>>> lab = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
>>> retrieve(torch.tensor([[2.0, 0.1]]), mem, lab, k=1).tolist()   # nearest patch: the first, class 0
[[1.0, 0.0]]
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace
from enum import Enum
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from datamodules.transforms.dense import resize_target
from datamodules.transforms.views import IMAGENET_MEAN, IMAGENET_STD, random_resized_crop_box

K_NEIGHBOURS = 30      # the reference's n_neighbours
TEMPERATURE = 0.02     # the reference's cross-attention beta
PAPER_MEMORY = (1024 * 10 ** 2, 1024 * 10 ** 3, 1024 * 10 ** 4)  # the memory sizes open-hummingbird-eval reports
REFERENCE_STD = (0.229, 0.224, 0.255)  # open-hummingbird-eval's IMAGENET_STD: 0.255 for 0.225, in its figures too


class DenseRetrievalProtocol(str, Enum):
    """--protocol: the project's retrieval setting, or the one open-hummingbird-eval's published figures use."""
    PROJECT = "project"
    HUMMINGBIRD = "hummingbird"


@dataclass(frozen=True)
class RetrievalSettings:
    """What a protocol fixes (flags given explicitly win)."""
    aug_epochs: int                # augmented views of each training image
    img_size: Optional[int]        # input size (None: the task's; floored to patch multiples)
    memory: tuple[int, ...]        # memory sizes in patches
    trainaug: bool                 # VOC: the 10,582 SBD train_aug images (voc_aug) instead of VOC train
    std_typo: bool                 # normalise with REFERENCE_STD (its 0.255) instead of ImageNet's
    ade_other: bool                # ADE20K: "other" (raw label 0) a class of its own, ignored when scoring


PROTOCOLS = {
    DenseRetrievalProtocol.PROJECT: RetrievalSettings(aug_epochs=1, img_size=None, memory=PAPER_MEMORY,
                                                      trainaug=False, std_typo=False, ade_other=False),
    # open-hummingbird-eval README: VOC trainaug, 2 augmentation epochs, 512 px, memory 1024 x 10^2..10^4
    DenseRetrievalProtocol.HUMMINGBIRD: RetrievalSettings(aug_epochs=2, img_size=512, memory=PAPER_MEMORY,
                                                          trainaug=True, std_typo=True, ade_other=True),
}


def resolve_settings(protocol: DenseRetrievalProtocol, aug_epochs: Optional[int] = None,
                     memory: Optional[Sequence[int]] = None, std_typo: Optional[bool] = None,
                     img_size: Optional[int] = None) -> RetrievalSettings:
    """The protocol's settings with the values given explicitly (not None) in their place."""
    given = {"aug_epochs": aug_epochs, "memory": tuple(memory) if memory else None, "std_typo": std_typo,
             "img_size": img_size}
    return replace(PROTOCOLS[DenseRetrievalProtocol(protocol)], **{k: v for k, v in given.items() if v is not None})


def protocol_inputs(images: torch.Tensor, masks: torch.Tensor, std_typo: bool,
                    ade_other: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Images and masks as the protocol reads them: the std typo folded into the images (``reference_std_input``),
    ADE20K's raw ids with "other" = 0 restored (``restore_zero_label``)."""
    if ade_other:
        from datamodules.datasets.ade20k import restore_zero_label
        masks = ([restore_zero_label(torch.as_tensor(m)) for m in masks] if isinstance(masks, (list, tuple))
                 else restore_zero_label(torch.as_tensor(masks)))
    return (reference_std_input(images) if std_typo else images), masks


@dataclass(frozen=True)
class MemoryPlan:
    """One memory size: what was asked, what each view gives, the rows the memory holds."""
    requested: int
    per_image: int
    rows: int
    capped: bool  # the request exceeds every patch of every view: the memory holds fewer rows than asked


def plan_memory(sizes: Sequence[int], num_images: int, aug_epochs: int, num_patches: int) -> list[MemoryPlan]:
    """The memory each requested size gives; warns for each size capped by the patches available (the reference
    would fail there: its ``topk`` asks for more patches than a view has)."""
    plans = []
    for m in sizes:
        n = per_image(m, num_images, aug_epochs, num_patches)
        capped = int(m) // max(1, num_images * aug_epochs) > num_patches
        plans.append(MemoryPlan(int(m), n, n * num_images * aug_epochs, capped))
        if capped:
            warnings.warn(f"retrieval memory {m} is capped at {plans[-1].rows} patches: {num_images} images x "
                          f"{aug_epochs} views x {num_patches} patches is all there is (results.json: mIoU[{m}]"
                          "['memory']); more images (VOC trainaug), views (--hb-aug-epochs) or a larger input "
                          "make it the size asked", stacklevel=2)
    return plans


def reference_std_input(img: torch.Tensor) -> torch.Tensor:
    """uint8 / [0, 1] float (..., 3, H, W) -> float such that the ImageNet normalisation of the probes
    (``views.normalize``) gives ``(x - mean) / REFERENCE_STD``: the reference's std typo, reproduced."""
    x = img.float() / 255.0 if img.dtype == torch.uint8 else img.float()
    m = torch.tensor(IMAGENET_MEAN, device=x.device).view(3, 1, 1)
    ratio = torch.tensor([a / b for a, b in zip(IMAGENET_STD, REFERENCE_STD)], device=x.device).view(3, 1, 1)
    return m + (x - m) * ratio


def image_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """The one RNG stream of training image ``index`` in augmentation epoch ``epoch``."""
    return torch.Generator().manual_seed((int(seed) * 1_000_003 + int(epoch)) * 1_000_003 + int(index))


def _uniform(g: torch.Generator, lo: float, hi: float) -> float:
    """One float32 draw in [lo, hi), as torchvision draws its factors and box shares (``torch.empty(1).uniform_``)."""
    return float(torch.empty(1).uniform_(lo, hi, generator=g))


def crop_box(h: int, w: int, g: torch.Generator, scale=(0.5, 2.0), ratio=(3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """(top, left, height, width): torchvision's RandomResizedCrop box search (``views.random_resized_crop_box``),
    its area share and log-uniform aspect ratio, then the offsets, drawn from generator ``g``."""
    log_r = (math.log(ratio[0]), math.log(ratio[1]))

    def draw():
        return _uniform(g, *scale), math.exp(_uniform(g, *log_r))

    def place(dh: int, dw: int):
        return (int(torch.randint(0, dh + 1, (1,), generator=g)), int(torch.randint(0, dw + 1, (1,), generator=g)))
    return random_resized_crop_box(h, w, scale, ratio, draw, place)


JITTER_OPS = ("brightness", "contrast", "saturation", "hue")  # the reference's order, each its own RandomApply


@dataclass(frozen=True)
class ViewDraws:
    """The random choices of one training view: the jitter ops applied, in order, with their factors; the box."""
    jitter: tuple[tuple[str, float], ...]
    box: tuple[int, int, int, int]


def draw_view(h: int, w: int, g: torch.Generator, strength: float = 0.1, p: float = 0.5) -> ViewDraws:
    """The draws of ``hummingbird_view`` for an (h, w) image: each jitter op with probability p (factor in
    [1 - s, 1 + s], hue in [-s, s]), then the crop box."""
    ops = []
    for name in JITTER_OPS:
        if float(torch.rand(1, generator=g)) < p:
            ops.append((name, _uniform(g, -strength, strength) if name == "hue" else
                        _uniform(g, 1 - strength, 1 + strength)))
    return ViewDraws(tuple(ops), crop_box(h, w, g))


def colour_jitter(image: torch.Tensor, ops: Sequence[tuple[str, float]]) -> torch.Tensor:
    """uint8 (3, H, W) -> uint8: the jitter ops run by torchvision on the PIL image, as the reference's ColorJitter
    on its PIL input (every rounding, and hue's uint8 HSV round trip, are PIL's)."""
    if not ops:
        return image
    import torchvision.transforms.functional as TF
    pil = TF.to_pil_image(image)
    for name, factor in ops:
        pil = getattr(TF, f"adjust_{name}")(pil, factor)
    return TF.pil_to_tensor(pil)


def apply_view(image: torch.Tensor, mask: torch.Tensor, size: tuple[int, int],
               d: ViewDraws) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's training view with the draws ``d``: jitter on the whole image, then the box shared by image
    and mask, resized to ``size`` (h, w): the image bilinear (antialiased) as a float in [0, 1] (the reference
    resizes its float tensor: no rounding back to uint8), the mask nearest."""
    top, left, ch, cw = d.box
    crop = colour_jitter(image, d.jitter)[None, :, top:top + ch, left:left + cw].float() / 255.0
    view = F.interpolate(crop, size=tuple(size), mode="bilinear", align_corners=False, antialias=True)[0]
    return view, resize_target(mask[top:top + ch, left:left + cw].contiguous(), size)


def hummingbird_view(image: torch.Tensor, mask: torch.Tensor, size: tuple[int, int],
                     g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 (3, H, W) image and (H, W) mask -> the memory's training view at ``size``, its draws from ``g``."""
    return apply_view(image, mask, size, draw_view(image.shape[-2], image.shape[-1], g))


def patch_labels(mask: torch.Tensor, patch: int, num_classes: int) -> torch.Tensor:
    """(B, H, W) mask -> (B, h * w, C) class frequencies of each patch's pixels, patches in raster order; ignore
    (and any id >= C) counts as class 0, as in the reference's memory."""
    b, h, w = mask.shape
    m = mask.long().clone()
    m[(m < 0) | (m >= num_classes)] = 0
    m = m.reshape(b, h // patch, patch, w // patch, patch).permute(0, 1, 3, 2, 4).reshape(b, -1, patch * patch)
    return F.one_hot(m, num_classes).float().mean(dim=2)


def sample_patches(labels: torch.Tensor, n: int, g: torch.Generator) -> torch.Tensor:
    """Indices of the ``n`` patches of one image the memory keeps, (n,), best first. A patch scores the summed
    image frequency (patches containing it) of the classes it contains, times uniform noise; the lowest scores
    win, so rare classes are kept first. ``labels``: (N, C) patch label distributions."""
    present = (labels > 0).float()
    scores = present @ present.sum(0)
    scores = scores * torch.rand(scores.shape[0], generator=g)
    return scores.topk(min(n, scores.shape[0]), largest=False).indices


def per_image(memory_size: int, num_images: int, aug_epochs: int, num_patches: int) -> int:
    """Patches each augmented image gives to a memory of ``memory_size`` (the reference's integer division, at
    least 1, at most every patch)."""
    return min(num_patches, max(1, int(memory_size) // max(1, num_images * aug_epochs)))


def _chunk_rows(n_query: int, budget: int = 1 << 26) -> int:
    return max(1024, budget // max(1, n_query))


@torch.no_grad()
def nearest(queries: torch.Tensor, memory: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k cosine similarity of (Q, D) ``queries`` against L2-normalised (M, D) ``memory``, in memory
    chunks that bound the (Q, chunk) similarity matrix: (sims (Q, k), indices (Q, k)), most similar first."""
    q = F.normalize(queries.float(), dim=1)
    k = min(int(k), memory.shape[0])
    best_s = q.new_full((q.shape[0], 0), -float("inf"))
    best_i = torch.zeros(q.shape[0], 0, dtype=torch.long, device=q.device)
    step = _chunk_rows(q.shape[0])
    for start in range(0, memory.shape[0], step):
        s, i = (q @ memory[start:start + step].to(q.device).T).topk(min(k, memory.shape[0] - start), dim=1)
        best_s, pos = torch.cat([best_s, s], 1).topk(min(k, best_s.shape[1] + s.shape[1]), dim=1)
        best_i = torch.cat([best_i, i + start], 1).gather(1, pos)
    return best_s, best_i


@torch.no_grad()
def retrieve(queries: torch.Tensor, memory: torch.Tensor, labels: torch.Tensor, k: int = K_NEIGHBOURS,
             temperature: float = TEMPERATURE) -> torch.Tensor:
    """(Q, C) label distribution of each query: its k nearest memory patches' labels averaged with weights
    softmax(cos / temperature)."""
    sims, idx = nearest(queries, memory, k)
    attn = torch.softmax(sims / temperature, dim=1)
    return torch.einsum("qk,qkc->qc", attn, labels.to(attn.device)[idx].float())


def label_map(dist: torch.Tensor, grid: tuple[int, int], size: Sequence[int]) -> torch.Tensor:
    """(h * w, C) patch label distributions -> (H, W) predicted classes: bilinear upsampling, then argmax."""
    d = dist.T.reshape(1, dist.shape[1], *grid)
    return F.interpolate(d, size=tuple(size), mode="bilinear").argmax(dim=1)[0]


def memory_rows(feats: torch.Tensor, masks: torch.Tensor, gens: Sequence[torch.Generator], n_keep: int, patch: int,
                num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What V augmented views give the memory: (V, D, h, w) features and (V, H, W) masks, each view sampled with
    its generator -> (L2-normalised features (V, n, D), label distributions (V, n, C)), best-sampled first."""
    f = F.normalize(feats.flatten(2).transpose(1, 2), dim=2)
    lab = patch_labels(masks.cpu(), patch, num_classes)
    keep = [sample_patches(lab[i], n_keep, g) for i, g in enumerate(gens)]
    return (torch.stack([f[i, k.to(f.device)] for i, k in enumerate(keep)]),
            torch.stack([lab[i, k] for i, k in enumerate(keep)]).to(f.device))


def memory_bank(feats: torch.Tensor, labels: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N images, E epochs, n_keep, .) rows -> the memory of the first ``n`` rows per view, epoch-major (the
    reference's order): ((N * E * n, D), (N * E * n, C))."""
    return (feats[:, :, :n].transpose(0, 1).reshape(-1, feats.shape[-1]),
            labels[:, :, :n].transpose(0, 1).reshape(-1, labels.shape[-1]))


def confusion_of(feats: torch.Tensor, masks, memory: torch.Tensor, labels: torch.Tensor, num_classes: int,
                 k: int = K_NEIGHBOURS, temperature: float = TEMPERATURE, ignore_index: int = 255) -> torch.Tensor:
    """(C, C) confusion counts of the retrieval labelling of (B, D, h, w) validation features against masks
    (pixels labelled ``ignore_index`` skipped: 255, or 0 for ADE20K with "other" kept, as the reference)."""
    from probes.headfree.matching import confusion
    cm = torch.zeros(num_classes, num_classes, dtype=torch.long)
    for f, mask in zip(feats, masks):
        dist = retrieve(f.flatten(1).T, memory.to(f.device), labels, k, temperature)
        cm += confusion(mask, label_map(dist, tuple(f.shape[-2:]), mask.shape[-2:]), num_classes, num_classes,
                        ignore_index)
    return cm
