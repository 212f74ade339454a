"""Shared parts of the depth datasets: split files in the BTS format and the item layout."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..depth_protocol import EvalSettings, eval_settings
from ..errors import SplitFileError
from .base import BaseDataset, check_same_size, image_tensor, load_depth_u16, load_rgb, read_split_file


def read_bts_split(path: Path, min_tokens: int = 2) -> list[tuple[str, str | None, float | None]]:
    """Lines 'rgb depth [focal]' (BTS / depth-toolbox format) -> (rgb, depth or None, focal or None); a depth of
    'None' (KITTI frames without ground truth) gives None; a leading '/' (BTS NYU train lists) is dropped."""
    out = []
    for n, line in enumerate(read_split_file(path, "depth split file"), 1):
        toks = line.split()
        if len(toks) < min_tokens:
            raise SplitFileError(f"{path}:{n}: expected 'rgb_path depth_path [focal]' per line, got {line!r}.")
        focal = None
        if len(toks) > 2:
            try:
                focal = float(toks[2])
            except ValueError as e:
                raise SplitFileError(f"{path}:{n}: third field (focal length) is not a number: {line!r}.") from e
        depth = None if toks[1] == "None" else toks[1].lstrip("/")
        out.append((toks[0].lstrip("/"), depth, focal))
    return out


class DepthDataset(BaseDataset):
    """Records {"image": Path, "depth": Path, ["focal": float]}; subclasses give ``decode(raw_u16) -> metres``."""

    DEPTH_SCALE = 1000.0  # raw value per metre

    def decode(self, raw: np.ndarray) -> np.ndarray:
        return raw.astype(np.float32) / self.DEPTH_SCALE

    def eval_settings(self) -> EvalSettings:
        """(min_depth, max_depth, crop(H, W) -> bool mask or None, clip) that its metrics count: the benchmark's
        protocol (``datamodules.depth_protocol``); a dataset with its own options overrides this."""
        return eval_settings(self.name)

    def load(self, rec: dict) -> dict:
        img = load_rgb(rec["image"])
        raw = load_depth_u16(rec["depth"])
        check_same_size(img, raw, rec["image"], rec["depth"], "depth map")
        item = {"image": image_tensor(img), "depth": torch.from_numpy(self.decode(raw)), "path": str(rec["image"])}
        if rec.get("focal") is not None:
            item["focal"] = float(rec["focal"])
        return item
