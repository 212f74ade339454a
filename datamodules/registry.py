"""The dataset registry: every dataset by name (``DATASETS``, aliases, split aliases), ``build_dataset`` and
``resolve_data`` (a DATA / DATA_ROOT pair). Re-exported by ``datamodules``; see its docstring.
"""
from __future__ import annotations

from pathlib import Path

from .datasets.ade20k import ADE20KDataset
from .datasets.base import IGNORE_INDEX, BaseDataset
from .datasets.cityscapes import CityscapesDataset
from .datasets.custom_depth import CustomDepthDataset
from .datasets.custom_seg import CustomSegDataset
from .datasets.copydays import CopydaysDataset
from .datasets.davis import DAVISDataset
from .datasets.folder import FolderDataset
from .datasets.imagefolder import ImageFolderDataset
from .datasets.imagenet import ImageNetDataset
from .datasets.kitti import KITTIDataset
from .datasets.nyuv2 import NYUv2Dataset
from .datasets.revisitop import ROxford5kDataset, RParis6kDataset
from .datasets.sunrgbd import SUNRGBDDataset
from .datasets.voc import VOC07Dataset, VOCAugDataset, VOCDataset
from .demo.layouts import seg_palette
from .demo.names import DEMO_DATASETS, demo_dataset, is_demo
from .demo.scenes import SEG_CLASSES
from .errors import MissingDataError, UnknownDatasetError, needs_data_root


# --- the demo datasets: the real loaders pointed at the generated data (make demo-data) -------------------
class DemoClsDataset(ImageNetDataset):
    name = "demo_cls"
    OFFICIAL_COUNTS = {}


class DemoVOCDataset(VOCDataset):
    """VOC layout with the demo's own classes (0 background + 8 shapes), fixed by the demo generator's class
    table (``datamodules/demo/scenes.py``; ``classes.json`` next to VOCdevkit records the same)."""

    name = "demo_voc"
    OFFICIAL_COUNTS = {}
    METAINFO = {"classes": tuple(SEG_CLASSES), "palette": tuple(tuple(c) for c in seg_palette())}
    NUM_CLASSES = len(SEG_CLASSES)


class DemoNYUDataset(NYUv2Dataset):
    name = "demo_nyu"
    OFFICIAL_COUNTS = {}


DATASETS: dict[str, type[BaseDataset]] = {
    "imagenet": ImageNetDataset, "voc": VOCDataset, "voc07": VOC07Dataset, "voc_aug": VOCAugDataset,
    "ade20k": ADE20KDataset,
    "cityscapes": CityscapesDataset, "nyuv2": NYUv2Dataset, "sunrgbd": SUNRGBDDataset, "kitti": KITTIDataset,
    "demo_cls": DemoClsDataset, "demo_voc": DemoVOCDataset, "demo_nyu": DemoNYUDataset,
    # your own data (docs/data.md "Your own data")
    "folder": FolderDataset, "imagefolder": ImageFolderDataset, "custom_seg": CustomSegDataset,
    "custom_depth": CustomDepthDataset,
    "davis": DAVISDataset,  # DAVIS-2017 video object segmentation (one sample per sequence)
    # image-level evaluations: revisited Oxford / Paris retrieval, Copydays copy detection
    "roxford5k": ROxford5kDataset, "rparis6k": RParis6kDataset, "copydays": CopydaysDataset,
}
ALIASES = {"voc2007": "voc07", "nyu": "nyuv2", "ade": "ade20k", "sun": "sunrgbd", "in1k": "imagenet"}
DATASET_NAMES = tuple(DATASETS)
# depth benchmarks only have a test split: a probe asking for "val" gets it
SPLIT_ALIASES = {"nyuv2": {"val": "test"}, "demo_nyu": {"val": "test"}, "kitti": {"val": "test"},
                 "custom_depth": {"test": "val"}, "custom_seg": {"test": "val"}}


def canonical_name(name: str) -> str:
    key = (name or "").strip().lower()
    key = ALIASES.get(key, key)
    if key not in DATASETS:
        raise UnknownDatasetError(f"unknown dataset {name!r}; valid names: {', '.join(DATASET_NAMES)} "
                                  f"(aliases: {', '.join(f'{a}={b}' for a, b in ALIASES.items())})")
    return key


def _demo_root(name: str, root) -> Path:
    from tokenmix.paths import DEMO_ROOT
    base = Path(root) if root not in (None, "") else DEMO_ROOT
    sub = DEMO_DATASETS[name]
    if sub and (base / sub).is_dir():
        return base / sub
    if not base.exists():
        raise MissingDataError(f"demo dataset '{name}': {base} does not exist. Generate it with `make demo-data` "
                               "(python -m datamodules.demo).")
    return base


def resolve_data(data: str, data_root, demo: str) -> tuple[str, Path]:
    """(dataset name, root) that a DATA / DATA_ROOT pair names. DATA ``demo`` (or '', or a demo name such as
    "demo_nyu": ``is_demo``): the demo dataset in DATA_ROOT when given, else in data/demo (generated on first use).
    A real dataset needs DATA_ROOT (``MissingDataError`` otherwise)."""
    data = (data or "demo").strip()
    if is_demo(data):
        demo = demo_dataset(data, demo)
        if data_root:
            root = Path(data_root).expanduser()
            if not (root / "classes.json").is_file():
                raise MissingDataError(f"--data {data} --data-root {root}: not a demo data folder (no classes.json). "
                                       "Leave DATA_ROOT empty to use/generate data/demo (make demo-data).")
            return demo, root
        from .demo import ensure_demo_data
        return demo, Path(ensure_demo_data())
    if not data_root:
        raise needs_data_root(data)
    return data, Path(data_root).expanduser()  # a missing folder: build_dataset names the layout it expects


def build_dataset(name: str, root, split: str, transform=None, **kw) -> BaseDataset:
    """Open dataset ``name`` (see DATASET_NAMES) at ``root`` ('' / None: error, except demo_* -> data/demo)."""
    key = canonical_name(name)
    if is_demo(key):
        root = _demo_root(key, root)
    split = SPLIT_ALIASES.get(key, {}).get(split, split)
    return DATASETS[key](root, split, transform=transform, **kw)

