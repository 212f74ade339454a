"""The dense probes' options (segmentation, depth) and what they read of the backbone.

    >>> SegOptions(Training(None, None, cache=True, cache_fp16=False), Head("linear4"), None, Solver.SGD, 1e-2).head
    <Head.LINEAR4: 'linear4'>
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional

from probes.core.features import FeatureSpec
from probes.core.options import Training


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
class SegOptions:
    train: Training
    head: Head = Head.LINEAR
    with_cls: Optional[bool] = None  # --cls / --no-cls (None: off for segmentation)
    solver: Solver = Solver.SGD
    ridge_lambda: float = 1e-2       # --ridge-lambda (x number of patches)


@dataclass(frozen=True)
class DepthOptions:
    train: Training
    head: Head = Head.LINEAR
    with_cls: Optional[bool] = None  # --cls / --no-cls (None: on for depth, as DINOv2)
    depth_head: DepthHead = DepthHead.BINS
    bin_norm: BinNorm = BinNorm.LINEAR


def dense_spec(options: "SegOptions | DepthOptions", depth: int, blocks, cls_default: bool = False) -> FeatureSpec:
    """The patch tokens of the head's blocks (``--head``), with [CLS] beside each when asked (depth: by default)."""
    with_cls = options.with_cls if options.with_cls is not None else cls_default
    return FeatureSpec(kind="dense", n_last_blocks=min(options.head.blocks, depth), blocks=blocks, with_cls=with_cls)
