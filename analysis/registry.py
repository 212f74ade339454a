"""The analyses behind ``make analyze TASK=...``: one ``Analysis`` per task in ``ANALYSES`` (its two stages,
default split and image budget, headline metric, whether it needs boxes, its VOC image set), in the style of dinov2's
eval registries. The stages live in ``analysis.tasks``, ``analysis.lost`` and ``analysis.votes``;
``extract`` is the backbone forward (sharded over ranks under ``--devices N``), ``finish`` the metrics and figures.

    >>> from analysis.registry import ANALYSES
    >>> a = ANALYSES["corloc"]
    >>> a.split, a.max_images, a.needs_boxes, a.voc_image_set
    ('trainval', 0, True, 'Main')
    >>> a.headline({"corloc": 61.5, "n_images": 200})
    'corloc = 61.5 over 200 images'
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from .calibration import run as calibration
from .lost import extract_corloc, finish_corloc
from .marker import extract_marker, finish_marker
from .shards import run_local
from .tasks import (extract_attention, extract_norms, extract_pca, extract_pib, finish_attention, finish_norms,
                    finish_pca, finish_pib)
from .votes import check_votes, extract_votes, finish_votes


def _no_stage(*_args, **_kw):
    raise RuntimeError("this analysis runs as one stage (Analysis.dense), not extract + finish")


@dataclass(frozen=True)
class Analysis:
    name: str
    extract: Callable  # (model, samples, Options) -> one record per image
    finish: Callable  # (model, records, AnalysisRun, Options) -> metrics
    metric: str  # the headline metric, printed at the end
    split: str = "val"  # default --split
    max_images: int = 0  # default --max-images (0 = all): the protocols use every image with a box
    needs_boxes: bool = False
    voc_image_set: Optional[str] = None  # VOC image set used unless --image-set (None: the loader's default)
    check: Optional[Callable] = None  # (model) -> None, raises before any process is spawned
    dense: Optional[Callable] = None  # (model, AnalysisConfig, AnalysisRun) -> metrics: one stage on the probes'
    # labelled data instead of extract + finish on open_dataset's samples (calibration), one process
    classifier: bool = False  # load the checkpoint's classifier head too (supervised runs), not the backbone only

    def runner(self, model, samples, run, opts) -> dict:
        """Both stages in this process."""
        return run_local(self.extract, self.finish, model, samples, run, opts)

    def headline(self, m: dict) -> str:
        extra = f", pib_aggregated = {m['pib_aggregated']}" if m.get("pib_aggregated") is not None else ""
        return f"{self.metric} = {m.get(self.metric)}{extra} over {m.get('n_images')} images"


ANALYSES: dict[str, Analysis] = {a.name: a for a in [
    Analysis("pib", extract_pib, finish_pib, "pib", needs_boxes=True),
    # the descriptive analyses only need a sample of images
    Analysis("pca", extract_pca, finish_pca, "explained_variance_ratio", max_images=16),
    Analysis("norms", extract_norms, finish_norms, "high_norm_share", max_images=64),
    Analysis("attention", extract_attention, finish_attention, "zero_share", max_images=32),
    # LOST protocol: VOC detection trainval lists (ImageSets/Main), not the segmentation subset
    Analysis("corloc", extract_corloc, finish_corloc, "corloc", split="trainval", needs_boxes=True,
             voc_image_set="Main"),
    Analysis("votes", extract_votes, finish_votes, "share_of_votes_in_box", needs_boxes=True,
             check=check_votes),  # LaSt-ViT vote maps
    # the marker positive control: cue-conflict scenes drawn in memory, one per index of the split (analysis/marker.py)
    Analysis("marker", extract_marker, finish_marker, "follows_marker", split="trainval", classifier=True),
    # the diffusion dial's doses against every dense measure (analysis/calibration.py)
    Analysis("calibration", _no_stage, _no_stage, "smallest_doses", split="train+val", dense=calibration),
]}
TASKS = tuple(ANALYSES)
