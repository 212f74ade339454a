"""Bounding-box files: VOC / ILSVRC XML and Kaggle's LOC_val_solution.csv, read as float32 (K, 4) xyxy *pixel
edges*, 0-based (pixel columns c0..c1 inclusive give x0=c0, x1=c1+1: width = x1 - x0, resizing a plain scale).
"""
from __future__ import annotations

import csv
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from ..errors import CorruptFileError, SplitFileError


def parse_xml_boxes(path: Path, one_based: bool) -> tuple[np.ndarray, list[str], np.ndarray]:
    """(boxes, names, difficult) from a VOC-style annotation XML. ``one_based=True`` (PASCAL VOC's devkit: pixels
    from (1, 1), xmax/ymax inside the box): edges (xmin - 1, ymin - 1, xmax, ymax); False (ILSVRC, no documented
    origin): unchanged (at most 1 px off, far below a patch)."""
    try:
        tree = ET.parse(path)
    except FileNotFoundError as e:
        raise CorruptFileError(f"{path}: box annotation file is missing. Re-extract the annotation archive "
                               "(VOC: Annotations/, ImageNet: ILSVRC2012_bbox_val_v3.tgz).", str(path)) from e
    except ET.ParseError as e:
        raise CorruptFileError(f"{path}: not a valid annotation XML ({e}). Re-extract it from the archive.",
                               str(path)) from e
    boxes, names, difficult = [], [], []
    for obj in tree.getroot().iter("object"):
        bb = obj.find("bndbox")
        name = obj.findtext("name", "").strip()
        if bb is None or not name:
            raise CorruptFileError(f"{path}: <object> without <name> or <bndbox>; expected VOC annotation XML.",
                                   str(path))
        try:
            x0, y0, x1, y1 = (float(bb.findtext(k)) for k in ("xmin", "ymin", "xmax", "ymax"))
        except (TypeError, ValueError) as e:
            raise CorruptFileError(f"{path}: <bndbox> of '{name}' lacks numeric xmin/ymin/xmax/ymax.", str(path)) from e
        if one_based:
            x0, y0 = x0 - 1, y0 - 1
        boxes.append((x0, y0, x1, y1))
        names.append(name)
        difficult.append(obj.findtext("difficult", "0").strip() == "1")
    return (np.asarray(boxes, np.float32).reshape(-1, 4), names, np.asarray(difficult, bool))


def read_loc_csv(path: Path) -> dict[str, tuple[np.ndarray, list[str]]]:
    """Kaggle ILSVRC LOC_*_solution.csv: ``ImageId,PredictionString`` with 'wnid x0 y0 x1 y1 ...' groups."""
    out: dict[str, tuple[np.ndarray, list[str]]] = {}
    try:
        f = open(path, newline="")
    except FileNotFoundError as e:
        raise SplitFileError(f"box file {path} is missing (expected Kaggle LOC_val_solution.csv).") from e
    with f:
        reader = csv.reader(f)
        header = next(reader, None)
        if not header or header[0] != "ImageId":
            raise SplitFileError(f"{path}: expected a header 'ImageId,PredictionString' (Kaggle LOC_val_solution.csv).")
        for row in reader:
            if not row:
                continue
            toks = row[1].split() if len(row) > 1 else []
            if len(toks) % 5:
                raise SplitFileError(f"{path}: row '{row[0]}' has {len(toks)} tokens; expected groups of 5 "
                                     "'wnid xmin ymin xmax ymax'.")
            names = toks[0::5]
            boxes = np.asarray([[float(v) for v in toks[i + 1:i + 5]] for i in range(0, len(toks), 5)],
                               np.float32).reshape(-1, 4)
            out[row[0]] = (boxes, names)
    return out
