"""Dense nearest-neighbour retrieval, the "Hummingbird" protocol (Balažević et al., NeurIPS 2023, *Towards
In-context Scene Understanding*), as open-hummingbird-eval (vpariza, v2.0.0) evaluates it; written here from the
paper and that code's behaviour, not copied.

- Memory bank: every training image, augmented ``aug_epochs`` times (``hummingbird_view``: RandomResizedCrop with
  scale (0.5, 2) shared by image and mask, then brightness / contrast / saturation / hue jitter 0.1, each with
  p = 0.5), gives ``memory_size // (num_images * aug_epochs)`` patches (``sample_patches``: patches whose classes are
  rare in the image first, ties broken by uniform noise), each stored as its L2-normalised feature and its label
  distribution (the class frequencies of its pixels; ignore pixels count as class 0, as in the reference).
- A validation patch gets the labels of its k = 30 nearest memory patches (cosine similarity, exact search)
  averaged with the attention weights softmax(cos / 0.02); the label map is upsampled bilinearly to the mask, its
  argmax scored by ``probes.matching`` (Hungarian matching, as the reference's ``PredsmIoU``).

Every random draw of an image comes from its own generator (seed, augmentation epoch, image index), so the memory
is the same however the images are sharded over processes.

>>> mem = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
>>> lab = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
>>> retrieve(torch.tensor([[2.0, 0.1]]), mem, lab, k=1).tolist()   # nearest patch: the first, class 0
[[1.0, 0.0]]
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

from datamodules.transforms.dense import resize_image, resize_target

K_NEIGHBOURS = 30      # the reference's n_neighbours
TEMPERATURE = 0.02     # the reference's cross-attention beta
PAPER_MEMORY = (1024 * 10 ** 2, 1024 * 10 ** 3, 1024 * 10 ** 4)  # the memory sizes open-hummingbird-eval reports


def image_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """The one RNG stream of training image ``index`` in augmentation epoch ``epoch``."""
    return torch.Generator().manual_seed((int(seed) * 1_000_003 + int(epoch)) * 1_000_003 + int(index))


def _uniform(g: torch.Generator, lo: float, hi: float) -> float:
    return lo + (hi - lo) * float(torch.rand(1, generator=g))


def crop_box(h: int, w: int, g: torch.Generator, scale=(0.5, 2.0), ratio=(3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """(top, left, height, width) of torchvision's RandomResizedCrop box sampling, from generator ``g``: ten tries
    at an area in ``scale`` x image area and a log-uniform aspect ratio, else the whole image at the clamped ratio."""
    area = h * w
    log_r = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * _uniform(g, *scale)
        r = math.exp(_uniform(g, *log_r))
        cw, ch = int(round(math.sqrt(target * r))), int(round(math.sqrt(target / r)))
        if 0 < cw <= w and 0 < ch <= h:
            top = int(torch.randint(0, h - ch + 1, (1,), generator=g))
            left = int(torch.randint(0, w - cw + 1, (1,), generator=g))
            return top, left, ch, cw
    in_ratio = w / h
    if in_ratio < ratio[0]:
        cw, ch = w, int(round(w / ratio[0]))
    elif in_ratio > ratio[1]:
        ch, cw = h, int(round(h * ratio[1]))
    else:
        cw, ch = w, h
    return (h - ch) // 2, (w - cw) // 2, ch, cw


def _jitter(img: torch.Tensor, g: torch.Generator, strength: float = 0.1, p: float = 0.5) -> torch.Tensor:
    """The reference's colour block: brightness, contrast, saturation, hue, each applied with probability p."""
    import torchvision.transforms.functional as TF
    ops = (TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue)
    for i, op in enumerate(ops):
        if float(torch.rand(1, generator=g)) < p:
            factor = _uniform(g, -strength, strength) if i == 3 else _uniform(g, 1 - strength, 1 + strength)
            img = op(img, factor)
    return img


def hummingbird_view(image: torch.Tensor, mask: torch.Tensor, size: tuple[int, int],
                     g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 (3, H, W) image and (H, W) mask -> the memory's training view at ``size`` (h, w). Deviation: on uint8
    tensors, not PIL images (jitter rounding differs by at most one grey level)."""
    top, left, ch, cw = crop_box(image.shape[-2], image.shape[-1], g)
    img = resize_image(image[:, top:top + ch, left:left + cw].contiguous(), size)
    m = resize_target(mask[top:top + ch, left:left + cw].contiguous(), size)
    return _jitter(img, g), m


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
                 k: int = K_NEIGHBOURS, temperature: float = TEMPERATURE) -> torch.Tensor:
    """(C, C) confusion counts of the retrieval labelling of (B, D, h, w) validation features against masks."""
    from .matching import confusion
    cm = torch.zeros(num_classes, num_classes, dtype=torch.long)
    for f, mask in zip(feats, masks):
        dist = retrieve(f.flatten(1).T, memory.to(f.device), labels, k, temperature)
        cm += confusion(mask, label_map(dist, tuple(f.shape[-2:]), mask.shape[-2:]), num_classes, num_classes)
    return cm
