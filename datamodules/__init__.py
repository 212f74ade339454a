"""Datasets in their real on-disk layouts, protocol transforms and Lightning DataModules (docs/data.md).

``build_dataset(name, root, split, transform=None, **kw)`` opens any of ``DATASET_NAMES``. The names below load
on first use, so importing a light submodule such as ``datamodules.demo`` (whose generator workers start in fresh
processes) does not import torch and every layout.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the modules the names come from, for readers and static tools
    from . import errors, registry  # noqa: F401

_HOMES = {
    "registry": ("build_dataset", "resolve_data", "canonical_name", "DATASETS", "DATASET_NAMES", "ALIASES",
                 "SPLIT_ALIASES", "IGNORE_INDEX", "BaseDataset", "ImageNetDataset", "VOCDataset", "VOC07Dataset",
                 "VOCAugDataset", "ADE20KDataset", "CityscapesDataset", "NYUv2Dataset", "SUNRGBDDataset",
                 "KITTIDataset", "FolderDataset", "ImageFolderDataset", "CustomSegDataset", "CustomDepthDataset",
                 "DemoClsDataset", "DemoVOCDataset", "DemoNYUDataset"),
    "errors": ("DatasetError", "UnknownDatasetError", "MissingDataError", "SplitFileError", "EmptyDatasetError",
               "SampleError", "CorruptFileError", "LabelRangeError", "SizeMismatchError", "DepthFormatError"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}
__all__ = list(_HOME_OF)


def __getattr__(name: str):
    if name not in _HOME_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_HOME_OF[name]}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
