"""``make probe TASK=davis``: DAVIS-2017 semi-supervised video object segmentation with a frozen backbone, no head.

Per sequence: every frame resized by DINO's rule (480 px short side, the long side floored to a multiple of 64;
the position table interpolated by the backbone), the patch tokens of the last block (``LAYER=k``: block k) in
fp32, the first annotation propagated (``probes/video/propagation.py``), the masks written as indexed PNGs in
DINO's palette under ``<run>/masks/<sequence>/<frame>.png`` (frame 0: the annotation, as DINO writes it; score them
with davis2017-evaluation's ``evaluation_method.py --task semi-supervised --results_path <run>/masks``) and scored
(``probes/video/davis_metrics.py``). Sequences are sharded over the processes (every world-th, the one sharded
extraction) and the per-object scores gathered, then averaged in sequence order: any process count gives the same
figures.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from probes.video.propagation import (PropagationOptions, first_labels, input_size, label_maps, mask_palette,
                                      prepare_frame, propagate_video, write_indexed_png)
from probes.video.davis_metrics import MEASURES, ObjectScore, sequence_scores, summarize
from probes.core.features import gather_objects, sharded_predict


@dataclass(frozen=True)
class DavisOptions:
    """What one DAVIS run does besides the propagation itself (``--davis``: the propagation's own options)."""
    propagation: PropagationOptions = field(default_factory=PropagationOptions)
    batch_size: int = 8                        # frames per backbone forward
    blocks: Optional[tuple[int, ...]] = None   # None: the last block (DINO's get_intermediate_layers(n=1))
    strip_sequences: int = 2                   # TensorBoard strips: the first sequences of the split
    strip_frames: int = 6                      # frames per strip, evenly spaced
    strip_height: int = 96                     # pixels per strip row
    split: str = "val"                         # ImageSets/2017/<split>.txt
    max_sequences: Optional[int] = None        # the first N sequences of the split (--max-samples)


@dataclass
class SequenceResult:
    index: int
    name: str
    objects: list[ObjectScore]
    num_frames: int
    strip: Optional[torch.Tensor] = None  # (3, 2 * height, width) uint8: ground truth row, propagated row


@torch.no_grad()
def sequence_features(backbone, frames_bgr: np.ndarray, settings: DavisOptions,
                      device: torch.device) -> torch.Tensor:
    """(T, h, w, D) fp32 patch features of every frame at DINO's input size."""
    size = input_size(*frames_bgr.shape[1:3], settings.propagation.short_side)
    patch = int(getattr(backbone, "patch_size", 16))
    h, w = size[0] // patch, size[1] // patch
    out = []
    for start in range(0, len(frames_bgr), settings.batch_size):
        x = torch.stack([prepare_frame(f, size) for f in frames_bgr[start:start + settings.batch_size]])
        x = x[..., :h * patch, :w * patch].to(device)  # a size that is not a patch multiple: the conv's floor
        kw = {"blocks": list(settings.blocks)} if settings.blocks is not None else {"n_last_blocks": 1}
        tokens = backbone.extract(x, **kw)[-1]["patch"].float()
        out.append(tokens.reshape(len(x), h, w, -1))
    return torch.cat(out)


def segment_sequence(backbone, frames_bgr: np.ndarray, masks: np.ndarray, settings: DavisOptions,
                     device: torch.device) -> np.ndarray:
    """(T, H, W) uint8 object ids of every frame: frame 0 the annotation as given, frames 1.. propagated."""
    feats = sequence_features(backbone, frames_bgr, settings, device)
    patch = int(getattr(backbone, "patch_size", 16))
    first = first_labels(masks[0], tuple(feats.shape[1:3]), patch).to(device)
    soft = propagate_video(feats, first, settings.propagation)
    return np.concatenate([masks[:1], label_maps(soft, patch, masks.shape[1:3])])


def write_masks(folder: Path, frame_paths: Sequence[str], labels: np.ndarray) -> None:
    """One indexed PNG per frame, named as the frame (``00000.png`` ...), in DINO's palette."""
    folder.mkdir(parents=True, exist_ok=True)
    pal = mask_palette()
    for p, ids in zip(frame_paths, labels):
        write_indexed_png(folder / f"{Path(p).stem}.png", ids, pal)


def _overlay(rgb: torch.Tensor, ids: torch.Tensor, pal: torch.Tensor) -> torch.Tensor:
    colour = pal[ids.long()].permute(2, 0, 1).float()
    return torch.where(ids[None] > 0, 0.5 * rgb + 0.5 * colour, rgb)


def strip_image(frames_bgr: np.ndarray, gt: np.ndarray, pred: np.ndarray, settings: DavisOptions) -> torch.Tensor:
    """(3, 2h, n·w) uint8: evenly spaced frames with the annotation (top) and the propagated masks (bottom)."""
    T = len(frames_bgr)
    pick = np.unique(np.linspace(0, T - 1, min(settings.strip_frames, T)).round().astype(int))
    H, W = gt.shape[1:]
    h, w = settings.strip_height, max(1, round(settings.strip_height * W / H))
    pal = torch.from_numpy(mask_palette())
    cols = []
    for t in pick:
        rgb = torch.from_numpy(np.ascontiguousarray(frames_bgr[t][:, :, ::-1])).permute(2, 0, 1).float()
        rows = [_overlay(rgb, torch.from_numpy(m[t].astype(np.int64)), pal) for m in (gt, pred)]
        cols.append(torch.cat([F.interpolate(r[None], size=(h, w), mode="nearest")[0] for r in rows], dim=1))
    return torch.cat(cols, dim=2).round().clamp(0, 255).to(torch.uint8)


def run_sequence(backbone, dataset, index: int, settings: DavisOptions, device: torch.device,
                 mask_dir: Optional[Path]) -> SequenceResult:
    """Load, propagate, write the PNGs and score one sequence of a ``DAVISDataset``."""
    item = dataset.load(dataset.samples[index])
    labels = segment_sequence(backbone, item["frames"], item["masks"], settings, device)
    if mask_dir is not None:
        write_masks(mask_dir / item["id"], item["frame_paths"], labels)
    strip = None
    if index < settings.strip_sequences:
        gt = np.where(item["masks"] == 255, 0, item["masks"])
        strip = strip_image(item["frames"], gt, labels, settings)
    return SequenceResult(index, item["id"], sequence_scores(item["id"], item["masks"], labels),
                          len(labels), strip)


def metrics_of(results: list[SequenceResult], settings: DavisOptions, seconds: float) -> dict[str, Any]:
    """results.json's metrics: the tool's global table in percent (the paper's unit), per object and sequence."""
    results = sorted(results, key=lambda r: r.index)
    objects = [o for r in results for o in r.objects]
    table = summarize(objects)
    metrics: dict[str, Any] = {k: 100.0 * table[k] for k in MEASURES}
    metrics.update(per_object=[o.to_dict() for o in objects],
                   per_sequence={r.name: {"objects": len(r.objects), "frames": r.num_frames,
                                          "J-Mean": 100 * float(np.mean([o.j_stats[0] for o in r.objects])),
                                          "F-Mean": 100 * float(np.mean([o.f_stats[0] for o in r.objects]))}
                                 for r in results},
                   num_sequences=len(results), num_objects=len(objects),
                   num_frames=sum(r.num_frames for r in results), seconds=seconds,
                   propagation=asdict(settings.propagation))
    return metrics


def log_strips(logger, results: list[SequenceResult], metrics: dict) -> None:
    """TensorBoard: J&F and friends as scalars, a strip of frames with masks per chosen sequence."""
    if logger is None:
        return
    exp = logger.experiment
    for k in MEASURES:
        exp.add_scalar(f"davis/{k}", metrics[k], 0)
    for r in sorted(results, key=lambda r: r.index):
        if r.strip is not None:
            exp.add_image(f"davis/{r.name}", r.strip, 0)
    exp.flush()


def run_davis(backbone, root: Path, settings: DavisOptions, launch, log_dir: Optional[Path], logger=None,
              progress: bool = False) -> dict[str, Any]:
    """The whole task: every sequence of ``settings.split`` (the first ``max_sequences``) once, sharded over the
    processes of ``launch`` and gathered on every process (sequence order restored by ``metrics_of``), PNGs under
    ``log_dir/masks``, the global table (rank 0; other processes return {}), TensorBoard scalars and strips."""
    from datamodules import build_dataset
    from tokenmix.launch import global_rank
    dataset = build_dataset("davis", root, settings.split)
    if settings.max_sequences:
        dataset.samples = dataset.samples[:settings.max_sequences]
    mask_dir = None if log_dir is None else Path(log_dir) / "masks"

    def step(m, index):
        return run_sequence(m.net.eval(), dataset, int(index), settings, m.device, mask_dir)

    t0 = time.perf_counter()
    results = sharded_predict(launch, backbone, [list(range(len(dataset)))], step, batch_size=1,
                              collate_fn=lambda b: b[0], progress=progress, end=gather_objects)[0]
    if global_rank() != 0:
        return {}
    metrics = metrics_of(results, settings, time.perf_counter() - t0)
    metrics["split"], metrics["masks"] = settings.split, None if mask_dir is None else str(mask_dir)
    log_strips(logger, results, metrics)
    return metrics


def run_davis_kind(ctx, options: DavisOptions, spec, logger) -> dict[str, Any]:
    """``KINDS[Kind.DAVIS].runner``: the probe context's backbone and DATA_ROOT, its ``DavisOptions``, the
    blocks of ``spec`` (``LAYER=``); a layer sweep writes each block's masks under ``block_<k>/masks``."""
    from dataclasses import replace
    settings = replace(options, blocks=None if spec.blocks is None else tuple(spec.blocks))
    log_dir = ctx.log_dir
    if log_dir is not None and spec.blocks is not None:
        log_dir = Path(log_dir) / f"block_{spec.blocks[0]}"
    return run_davis(ctx.info.model, Path(ctx.root), settings, ctx.launch, log_dir, logger, ctx.progress)
