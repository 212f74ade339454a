"""The one rule for "is this the demo data", and the names it knows.

A DATA value names the demo data in two ways: ``demo`` (also '' / None, DATA's default), which each consumer
resolves to its own demo dataset (pretraining and k-NN: ``demo_cls``, VOC: ``demo_voc``, NYUv2: ``demo_nyu``), or
one of those dataset names directly (``build_dataset``'s registry, and the ``data`` recorded in results). Nothing
else is: the rule is membership, not a prefix, so a dataset of your own called ``demos`` is not the demo data.

>>> [is_demo(n) for n in ("demo", "", None, " Demo ", "demo_voc", "demo_nyu", "demo_cls")]
[True, True, True, True, True, True, True]
>>> [is_demo(n) for n in ("voc", "imagenet", "folder", "demos", "demo_seg", "my_demo")]
[False, False, False, False, False, False]
>>> demo_dataset("demo", "demo_voc"), demo_dataset("", "demo_voc"), demo_dataset("demo_nyu", "demo_voc")
('demo_voc', 'demo_voc', 'demo_nyu')
"""
from __future__ import annotations

from typing import Optional

DEMO = "demo"
# the generated datasets -> their folder under the demo root ("": the root itself holds VOCdevkit/)
DEMO_DATASETS = {"demo_cls": "imagefolder", "demo_voc": "", "demo_nyu": "nyu"}


def is_demo(name: Optional[str]) -> bool:
    """True when ``name`` (a DATA value or a dataset name) is the generated demo data."""
    key = (name or DEMO).strip().lower()
    return key == DEMO or key in DEMO_DATASETS


def demo_dataset(name: Optional[str], default: str) -> Optional[str]:
    """The dataset a DATA value means to a consumer whose own demo dataset is ``default`` (a probe task's
    ``demo_voc``, pretraining's ``demo_cls``): ``demo`` / '' -> ``default``; any other name (``demo_nyu``, ``voc``)
    is itself."""
    return default if (name or DEMO).strip().lower() == DEMO else name
