"""Exceptions for bad data; every message names the file, what was expected and how to fix it. ``DatasetError``
is a ``ValueError``; ``SampleError`` marks one sample's problem (what ``skip_corrupt=True`` skips).
"""
from __future__ import annotations


class DatasetError(ValueError):
    """Any problem with a dataset on disk or its configuration."""


class UnknownDatasetError(DatasetError, KeyError):
    """A dataset name that ``build_dataset`` does not know."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.args[0] if self.args else ""


class MissingDataError(DatasetError, FileNotFoundError):
    """DATA_ROOT not given, or the expected layout is not under it."""


def needs_data_root(data: str) -> MissingDataError:
    """The one error for a real dataset named without its folder (every CLI that takes DATA / DATA_ROOT)."""
    return MissingDataError(
        f"DATA={data} needs --data-root (DATA_ROOT=<folder>): the folder that holds the '{data}' dataset in its "
        "standard layout (imagenet: the ImageFolder root with train/<wnid>/*.JPEG and val/<wnid>/*.JPEG; folder: any "
        "folder of images; see docs/data.md, check it with `make check-data`), or use DATA=demo for the built-in "
        "generated data.")


class SplitFileError(DatasetError):
    """A split list that is missing, empty or malformed."""


class SplitAbsentError(MissingDataError):
    """A split's folder (or split list) does not exist at all: a partial copy, not a broken one (``make
    check-data`` notes it for a split nobody asked for; every other refusal of a split is a problem)."""


class MissingSplitFileError(SplitFileError, SplitAbsentError):
    """A split list file that does not exist."""


class EmptyDatasetError(DatasetError):
    """A split that resolves to zero samples."""


class SampleError(DatasetError):
    """One sample is unusable. ``path`` is the offending file."""

    def __init__(self, message: str, path: str | None = None):
        super().__init__(message)
        self.path = path


class CorruptFileError(SampleError):
    """A file that is missing, truncated or cannot be decoded."""


class LabelRangeError(SampleError):
    """A mask holding class ids outside [0, num_classes) other than the ignore index."""


class SizeMismatchError(SampleError):
    """Image and mask/depth of different sizes."""


class DepthFormatError(SampleError):
    """A depth map of the wrong bit depth / encoding."""
