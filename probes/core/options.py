"""What every trained head shares (``Training``); each protocol's own options class sits beside it, named
``<Protocol>Options``: probes/linear/knn.py, linear/module_linear.py, dense/options.py, headfree/runners.py,
video/davis_probe.py, instance/image_retrieval.py, instance/copy_detection.py. ``probes.core.flags`` builds the
running kind's one from the command line (``kind_options``); a default is written in its dataclass alone.

    >>> Training(None, None, cache=True, cache_fp16=False).cache
    True
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Training:
    """What every trained head shares."""
    max_epochs: Optional[int]  # --max-epochs (None: the kind's default, ``KINDS[kind].epochs``)
    lr: Optional[float]        # --lr (None: the protocol's)
    cache: bool                # not --no-cache: frozen features computed once and reused every epoch
    cache_fp16: bool           # --cache-fp16
