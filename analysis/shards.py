"""How the analyses batch images, and how ``make analyze ARGS="--devices N --num-nodes M"`` shards them.

Every analysis is two stages (named per task in ``analysis.registry``):

- ``extract(model, samples, opts)`` yields one *record* per image: a dict with the sample's ``index``, CPU
  tensors / numbers, and optionally ``vis`` (what the figures show of that image). This is the backbone forward
  over the dataset, the costly part;
- ``finish(model, records, run, opts)`` computes the metrics on all records (in dataset order) and draws the
  figures.

One process runs both in a loop (:func:`run_local`). Several run ``extract`` under Lightning DDP
(:func:`extract_sharded`, on the probes' one sharded extraction): rank r embeds images r, r + world, r + 2 world,
... (no padding, so no image is counted twice), the records are gathered on rank 0 by index (duplicates dropped),
and rank 0 alone runs ``finish`` and writes results.json, figures and TensorBoard. Only the first ``num_vis``
records of each process keep ``vis``.

    >>> merge([[{"index": 0}, {"index": 2}], [{"index": 1}, {"index": 2}]])
    [{'index': 0}, {'index': 1}, {'index': 2}]
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from tokenmix.cli import Launch
from tokenmix.precision import inference_autocast

from .data import Sample, eval_crop, iter_samples


@dataclass
class Options:
    crop: int = 224
    resize: int = 256
    batch_size: int = 16
    num_vis: int = 8
    pib_subset: str = "all"  # "all" images with boxes | "single_small" (LAST-ViT ImageNet filter)
    pib_rule: str = "overlap"  # box -> patches: "overlap" (boxes_to_patch_mask) | "reference" (LaSt-ViT's)
    interpolation: str = "bicubic"  # of the eval view's resize; PiB: "bilinear", as LaSt-ViT's T.Resize(256)
    fg_threshold: float = 0.5
    lost_features: str = "k"  # "k" (last-block keys, LOST default) | "patch" (last-block outputs)
    k_patches: int = 100
    device: str = "cpu"


def batches(samples: Iterable[Sample], opts: Options, need_boxes: bool = False):
    """Yield (samples, normalised crops (B, 3, crop, crop), geometries) batches of the eval view."""
    buf = []
    for s in samples:
        if need_boxes and (s.boxes is None or s.boxes.shape[0] == 0):
            continue
        buf.append(s)
        if len(buf) == opts.batch_size:
            yield _stack(buf, opts)
            buf = []
    if buf:
        yield _stack(buf, opts)


def _stack(buf, opts):
    xs, rcs = zip(*(eval_crop(s.image, opts.resize, opts.crop, opts.interpolation) for s in buf))
    return buf, torch.stack(xs).to(opts.device), list(rcs)


def pct(hits: torch.Tensor) -> float | None:
    return None if hits.numel() == 0 else round(100.0 * hits.float().mean().item(), 3)


def collect(records: Iterable[dict], num_vis: int, out: list | None = None) -> list[dict]:
    """Append ``records`` to ``out``, keeping ``vis`` on the first ``num_vis`` that have one (bounded memory)."""
    out = [] if out is None else out
    shown = sum("vis" in r for r in out)
    for r in records:
        if "vis" in r and shown >= num_vis:
            r = {k: v for k, v in r.items() if k != "vis"}
        shown += "vis" in r
        out.append(r)
    return out


def merge(parts: Iterable[list[dict]]) -> list[dict]:
    """Records of every rank -> one list in dataset order, each index once."""
    seen: dict[int, dict] = {}
    for part in parts:
        for r in part:
            seen.setdefault(int(r["index"]), r)
    return [seen[i] for i in sorted(seen)]


def vis_lists(records: list[dict], num_vis: int) -> dict[str, list]:
    """The ``vis`` entries of the first ``num_vis`` records that have one, as lists per key."""
    shown = [r["vis"] for r in records if "vis" in r][:num_vis]
    return {k: [v[k] for v in shown] for k in (shown[0] if shown else {})}


def run_local(extract: Callable, finish: Callable, model, samples: Iterable[Sample], run, opts: Options) -> dict:
    """Both stages in this process: the single-device ``make analyze``."""
    with inference_autocast(opts.device):  # bf16 on CUDA (tokenmix/precision.py); records kept in fp32
        records = collect((as_float(r) for r in extract(model, samples, opts)), opts.num_vis)
    return finish(model, records, run, opts)


def as_float(record):
    """16-bit tensors of a record (bf16 under CUDA autocast) as fp32, nested dicts and lists included."""
    if torch.is_tensor(record):
        return record.float() if record.dtype in (torch.float16, torch.bfloat16) else record
    if isinstance(record, dict):
        return {k: as_float(v) for k, v in record.items()}
    if isinstance(record, (list, tuple)):
        return type(record)(as_float(v) for v in record)
    return record


# --------------------------------------------------------------------------- several processes

def _sample(dataset, i: int) -> Sample | None:
    """Dataset item ``i`` as a ``Sample`` (None for a dropped corrupt file), the way ``iter_samples`` reads it."""
    from torch.utils.data import Subset
    s = next(iter_samples(Subset(dataset, [i])), None)
    return None if s is None else dataclasses.replace(s, index=i)


def extract_sharded(extract: Callable, model, dataset, max_images: int, opts: Options,
                    launch: Launch) -> list[dict] | None:
    """``extract`` over the first ``max_images`` (0 = all) images of ``dataset`` with the probes' one sharded
    extraction (``probes.core.features.sharded_predict``) on ``launch.devices`` x ``launch.num_nodes`` processes:
    the records gathered and merged on rank 0, None on the other ranks."""
    import warnings

    from probes.core.features import gather_objects, sharded_predict

    n = len(dataset) if not max_images else min(len(dataset), int(max_images))
    shown = [0]  # records with ``vis`` kept so far on this process (``collect``: bounded memory)

    def step(m, indices):
        with inference_autocast(m.device):
            samples = [s for i in indices if (s := _sample(dataset, i)) is not None]
            records = collect((as_float(r) for r in extract(m.net, samples, dataclasses.replace(
                opts, device=str(m.device)))), max(0, opts.num_vis - shown[0]))
        shown[0] += sum("vis" in r for r in records)
        return records

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(module\\(s\\) in eval mode|does not have many workers).*")
        parts = sharded_predict(launch, model, [list(range(n))], step, batch_size=opts.batch_size,
                                collate_fn=list, move_batch=False, end=lambda m: gather_objects(m, dst=0))[0]
    return None if parts is None else merge(parts)
