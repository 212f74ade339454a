"""What each kind of probe reads besides the backbone and the data: one typed options class per ``tasks.Kind``,
built once from the flags by ``probes.run`` (``make_config``) and handed to that kind alone (``ProbeContext.options``).

    >>> KnnOptions(ks=(10, 20), temperature=0.07).ks
    (10, 20)
    >>> SegOptions(Training(None, None, cache=True, cache_fp16=False), Head("linear4"), None, Solver.SGD, 1e-2).head
    <Head.LINEAR4: 'linear4'>

A new option: a field here, its flag in ``probes.core.flags.build_parser`` and one keyword in ``probes.run``'s builder of
that kind (``OPTIONS``).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional, Union

from probes.headfree.retrieval import Protocol


class Head(str, Enum):
    """--head: the dense heads read the last block (linear) or the last 4 blocks (linear4)."""
    LINEAR = "linear"
    LINEAR4 = "linear4"

    @property
    def blocks(self) -> int:
        """How many of the last blocks the head reads."""
        return 4 if self is Head.LINEAR4 else 1


class DepthHead(str, Enum):
    """--depth-head: DINOv2's depth bins, or a plain regression."""
    BINS = "bins"
    REGRESSION = "regression"


class BinNorm(str, Enum):
    """--bin-norm: bins -> probabilities, DINOv2's 'linear' (relu + 0.1, normalise) or softmax."""
    LINEAR = "linear"
    SOFTMAX = "softmax"


class Solver(str, Enum):
    """--solver: the trained BN + linear segmentation head (sgd, the protocol) or the closed-form ridge probe."""
    SGD = "sgd"
    RIDGE = "ridge"


@dataclass(frozen=True)
class Training:
    """What every trained head shares."""
    max_epochs: Optional[int]  # --max-epochs (None: the kind's default, ``KINDS[kind].epochs``)
    lr: Optional[float]        # --lr (None: the protocol's)
    cache: bool                # not --no-cache: frozen features computed once and reused every epoch
    cache_fp16: bool           # --cache-fp16


@dataclass(frozen=True)
class KnnOptions:
    ks: tuple[int, ...]  # --knn-k
    temperature: float   # --knn-t


@dataclass(frozen=True)
class LinearOptions:
    train: Training
    aug: bool  # not --no-aug: eval_linear's RandomResizedCrop + flip (then the features are not cached)


@dataclass(frozen=True)
class SegOptions:
    train: Training
    head: Head
    with_cls: Optional[bool]  # --cls / --no-cls (None: off for segmentation)
    solver: Solver
    ridge_lambda: float       # --ridge-lambda (x number of patches)


@dataclass(frozen=True)
class DepthOptions:
    train: Training
    head: Head
    with_cls: Optional[bool]  # --cls / --no-cls (None: on for depth, as DINOv2)
    depth_head: DepthHead
    bin_norm: BinNorm


@dataclass(frozen=True)
class RetrievalOptions:
    """Hummingbird dense retrieval (``probes.headfree.runners.run_retrieval``)."""
    memory: tuple[int, ...]  # --hb-memory: memory sizes in patches
    k: int                   # --hb-k: nearest neighbours per patch
    temperature: float       # --hb-temperature
    aug_epochs: int          # --hb-aug-epochs: augmented views of each training image
    seed: int                # --seed: the views' random draws
    protocol: Protocol = Protocol.PROJECT  # --protocol: whose settings fill the values not given (retrieval.PROTOCOLS)
    std_typo: bool = False   # --hb-std-typo: normalise with the reference's std (0.255 for blue)
    ade_other: bool = False  # ADE20K: "other" a class of its own, ignored when scoring (hummingbird)
    trainaug: bool = False   # VOC: the memory from trainaug (voc_aug) when its list is there (hummingbird)
    train_note: Optional[str] = None  # set when trainaug was asked for but the list is missing


@dataclass(frozen=True)
class OverclusterOptions:
    """Overclustering as Leopart / NeCo (``probes.headfree.runners.run_overcluster``, ``probes.headfree.overcluster``)."""
    ks: str     # --cluster-k: K values, 'Nx' = N x the number of classes (resolved against the task's classes)
    iters: int  # --cluster-iters: faiss k-means iterations (niter; the reference's 100)
    seeds: int  # --cluster-seeds: k-means runs with seeds 0 .. seeds - 1, averaged (the reference's 5)


from probes.instance.copy_detection import CopyDetectionConfig  # noqa: E402  the global-feature evaluations keep theirs beside
from probes.video.davis_probe import DavisSettings  # noqa: E402  DAVIS's options (its propagation settings: probes/video/propagation.py)
from probes.instance.image_retrieval import RetrievalConfig  # noqa: E402  their scoring

KindOptions = Union[KnnOptions, LinearOptions, SegOptions, DepthOptions, RetrievalOptions, OverclusterOptions,
                    DavisSettings, RetrievalConfig, CopyDetectionConfig]
