"""The analyses behind ``make analyze TASK=...``: one ``Analysis`` per task in ``ANALYSES`` (its runner, default
split and image budget, headline metric, whether it needs boxes, its VOC image set), in the style of dinov2's
eval registries. The runners themselves live in ``analysis.tasks`` and ``analysis.votes``.

    >>> from analysis.registry import ANALYSES, get_analysis
    >>> a = get_analysis("corloc")
    >>> a.split, a.max_images, a.needs_boxes, a.voc_image_set
    ('trainval', 0, True, 'Main')
    >>> a.headline({"corloc": 61.5, "n_images": 200})
    'corloc = 61.5 over 200 images'
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from .tasks import run_attention, run_corloc, run_norms, run_pca, run_pib
from .votes import run_votes


@dataclass(frozen=True)
class Analysis:
    name: str
    runner: Callable  # (model, samples, AnalysisRun, Options) -> metrics
    metric: str  # the headline metric, printed at the end
    split: str = "val"  # default --split
    max_images: int = 0  # default --max-images (0 = all): the protocols use every image with a box
    needs_boxes: bool = False
    voc_image_set: Optional[str] = None  # VOC image set used unless --image-set (None: the loader's default)

    def headline(self, m: dict) -> str:
        extra = f", pib_aggregated = {m['pib_aggregated']}" if m.get("pib_aggregated") is not None else ""
        return f"{self.metric} = {m.get(self.metric)}{extra} over {m.get('n_images')} images"


ANALYSES: dict[str, Analysis] = {a.name: a for a in [
    Analysis("pib", run_pib, "pib", needs_boxes=True),
    # the descriptive analyses only need a sample of images
    Analysis("pca", run_pca, "explained_variance_ratio", max_images=16),
    Analysis("norms", run_norms, "high_norm_share", max_images=64),
    Analysis("attention", run_attention, "zero_share", max_images=32),
    # LOST protocol: VOC detection trainval lists (ImageSets/Main), not the segmentation subset
    Analysis("corloc", run_corloc, "corloc", split="trainval", needs_boxes=True, voc_image_set="Main"),
    Analysis("votes", run_votes, "share_of_votes_in_box", needs_boxes=True),  # LaSt-ViT vote maps
]}
TASKS = tuple(ANALYSES)


def get_analysis(name: str) -> Analysis:
    if name not in ANALYSES:
        raise SystemExit(f"unknown or missing --task '{name}'. Valid tasks: {', '.join(TASKS)} "
                         "(e.g. make analyze TASK=pib VARIANT=entmax)")
    return ANALYSES[name]
