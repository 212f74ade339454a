"""``DATA=folder``: every image under a folder, recursively, in any format PIL opens; no labels, no splits.

The *index* (sorted relative paths, count, sha256) is built once per launch: rank 0 scans and writes it beside
the run before any other process exists; the other ranks and workers read it (``file_list``: one path per line
instead of the scan). Unreadable files are skipped, counted and listed (``data_report``); a share above
``max_corrupt`` (1 %) stops the run. ``boxes=True``: ``Annotations/<stem>.xml`` or a COCO ``instances.json``.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..errors import DatasetError, EmptyDatasetError, MissingDataError, SampleError, SplitFileError
from .base import BaseDataset, _open, image_tensor, load_rgb
from .custom_base import parallel_map

FORMAT = "tokenmix-folder-index/1"
LAYOUT = """  <any>/<nested>/<folders>/<image>.{jpg,png,webp,tif,...}   (any format PIL opens; no labels)
  optional --data.file_list: a text file, one image path per line (relative to DATA_ROOT, or absolute)
  optional boxes (CorLoc, PiB): Annotations/<image stem>.xml (VOC-style) or instances.json (COCO)"""
COCO_FILES = ("instances.json", "annotations/instances.json")


def image_extensions() -> tuple[str, ...]:
    """Lower-case file extensions of every format PIL can open."""
    from PIL import Image
    Image.init()
    return tuple(sorted(e for e, fmt in Image.registered_extensions().items() if fmt in Image.OPEN))


def scan_folder(root: Path) -> list[str]:
    """Relative posix paths of the image files under ``root`` (recursive, sorted, hidden entries skipped)."""
    exts, out = set(image_extensions()), []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        rel = os.path.relpath(dirpath, root)
        for f in filenames:
            if not f.startswith(".") and os.path.splitext(f)[1].lower() in exts:
                out.append(f if rel == "." else f"{Path(rel).as_posix()}/{f}")
    return sorted(out)


def read_file_list(path: Path) -> list[str]:
    if not Path(path).is_file():
        raise SplitFileError(f"--data.file_list {path}: no such file. It holds one image path per line (relative to "
                             "DATA_ROOT, or absolute).")
    lines = [ln.strip() for ln in Path(path).read_text().splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    if not lines:
        raise SplitFileError(f"--data.file_list {path} is empty: expected one image path per line.")
    return list(dict.fromkeys(lines))  # keep the order, once each


def _check_file(root: Path, rel: str, decode: bool) -> Optional[str]:
    """None when fine, else the reason (missing, or cannot be decoded)."""
    path = root / rel
    if not path.is_file():
        return f"{path}: missing (named by the file list)"
    if decode:
        try:
            _open(path, "image")
        except SampleError as e:
            return str(e).splitlines()[0]
    return None


def index_key(root, file_list=None, verify: bool = False) -> str:
    ident = [str(Path(root).resolve()), str(Path(file_list).resolve()) if file_list else "", bool(verify)]
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:12]


def build_index(root, file_list=None, verify: bool = False, jobs: Optional[int] = None) -> dict:
    """Scan (or read ``file_list``), check the files (exists; ``verify``: decodes) -> the index dict."""
    root = Path(root)
    if not root.is_dir():
        raise MissingDataError(f"DATA=folder: DATA_ROOT {root} does not exist or is not a folder.\nLayout:\n{LAYOUT}")
    files = read_file_list(Path(file_list)) if file_list else scan_folder(root)
    if not files:
        raise EmptyDatasetError(
            f"DATA=folder: no images found under {root} (searched recursively for {', '.join(image_extensions()[:12])}"
            f", ...). Point DATA_ROOT at the folder holding the images, or pass --data.file_list.")
    # a file list names files that may be gone: always check existence; decode only with verify
    check = file_list or verify
    reasons = parallel_map(lambda f: _check_file(root, f, verify), files, jobs) if check else [None] * len(files)
    corrupt = {str(root / f): r for f, r in zip(files, reasons) if r}  # keyed as the loaders name skipped files
    good = [f for f, r in zip(files, reasons) if not r]
    return {"format": FORMAT, "root": str(root.resolve()), "file_list": str(file_list or ""), "verified": bool(verify),
            "scanned": len(files), "count": len(good), "sha256": hashlib.sha256("\n".join(good).encode()).hexdigest(),
            "corrupt": corrupt, "launch": uuid.uuid4().hex[:12], "files": good}


def refuse_corrupt_share(index: dict, skipped: dict, max_corrupt: float) -> None:
    """Stop when more than ``max_corrupt`` of the scanned files are unreadable."""
    bad = {**index["corrupt"], **skipped}
    if len(bad) > max_corrupt * index["scanned"] or not index["count"]:
        listed = "\n".join(f"  {r if r.startswith(p) else f'{p}: {r}'}" for p, r in list(bad.items())[:20])
        raise DatasetError(
            f"DATA=folder {index['root']}: {len(bad)} of {index['scanned']} files are unreadable "
            f"({100 * len(bad) / max(1, index['scanned']):.2f} % > max_corrupt {100 * max_corrupt:g} %):\n{listed}"
            f"{chr(10) + '  ...' if len(bad) > 20 else ''}\nRemove or repair them (find all with --data.verify true), "
            "or raise --data.max_corrupt.")


def open_index(root, *, file_list=None, verify: bool = False, index_dir: str = "", max_corrupt: float = 0.01,
               rank: Optional[int] = None, wait_s: float = 600.0) -> tuple[dict, Optional[Path]]:
    """(index, its cache file): rank 0 scans and writes the cache, other ranks wait up to ``wait_s`` and read it;
    without ``index_dir`` every process scans (probes, analyses)."""
    if rank is None:
        from tokenmix.launch import global_rank
        rank = global_rank()
    if not index_dir:
        index = build_index(root, file_list, verify)
        refuse_corrupt_share(index, {}, max_corrupt)
        return index, None
    path = Path(index_dir) / f"folder-index-{index_key(root, file_list, verify)}.json"
    if rank == 0:
        index = build_index(root, file_list, verify)
        refuse_corrupt_share(index, {}, max_corrupt)
        from tokenmix.io import atomic_json_dump
        atomic_json_dump(index, path)
        return index, path
    return read_index(path, wait_s), path


def read_index(path: Path, wait_s: float = 0.0) -> dict:
    deadline = time.monotonic() + wait_s
    while not path.is_file() and time.monotonic() < deadline:
        time.sleep(1.0)
    try:
        index = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DatasetError(f"{path}: the folder index rank 0 writes is missing or unreadable ({e}); rank 0 should "
                           "have written it before the other processes start. Check that the runs folder is shared "
                           "by every node.") from e
    if index.get("format") != FORMAT:
        raise DatasetError(f"{path}: not a folder index of this version ({index.get('format')!r}); delete it.")
    return index


def skip_dir(index_path: Optional[Path], index: dict) -> Optional[Path]:
    """Where every process of one launch lists the files it skipped on reading (one file per process)."""
    return None if index_path is None else index_path.with_name(f"{index_path.stem}.skipped-{index['launch']}")


def read_skips(folder: Optional[Path]) -> dict[str, str]:
    out: dict[str, str] = {}
    if folder is not None and folder.is_dir():
        for f in sorted(folder.glob("*.tsv")):
            for line in f.read_text().splitlines():
                path, _, reason = line.partition("\t")
                out.setdefault(path, reason)
    return out


class FolderDataset(BaseDataset):
    """Items {"image" uint8 (3, H, W) RGB (grayscale, palette, RGBA, CMYK converted), "label": -1 (none),
    "path"} (+ "boxes", "box_labels" with ``boxes=True``). ``index``: a prebuilt index dict (no scan)."""

    name = "folder"
    LAYOUT = LAYOUT
    SOURCE = "your own images (docs/data.md 'Your own data')"

    def __init__(self, root, split="train", transform=None, skip_corrupt=True, *, file_list=None, verify=False,
                 index: Optional[dict] = None, index_path: Optional[Path] = None, max_corrupt: float = 0.01,
                 boxes=False):
        super().__init__(root, split, transform, skip_corrupt=True)  # a folder of images: skip and count
        self.index = index if index is not None else open_index(self.root, file_list=file_list, verify=verify,
                                                                max_corrupt=max_corrupt)[0]
        self.index_path, self.max_corrupt = index_path, float(max_corrupt)
        self.skip_log = skip_dir(index_path, self.index)
        self.samples = self.index["files"]  # relative paths: compact in every DataLoader worker
        self._finish()
        self.box_index = self._boxes(boxes) if boxes else None

    def files(self, rec: str) -> list[Path]:
        return [self.root / rec]

    def load(self, rec: str) -> dict:
        path = self.root / rec
        img = load_rgb(path)
        item = {"image": image_tensor(img), "label": -1, "path": str(path)}
        if self.box_index is not None:
            b, labels = self.box_index.get(rec, self.box_index.get(Path(rec).name, (np.zeros((0, 4), np.float32), [])))
            b = b.copy()
            h, w = img.shape[:2]
            b[:, 0::2], b[:, 1::2] = b[:, 0::2].clip(0, w), b[:, 1::2].clip(0, h)
            item["boxes"], item["box_labels"] = torch.from_numpy(b), torch.tensor(labels, dtype=torch.int64)
        return item

    def __getitem__(self, index: int) -> dict:
        before = set(self.skipped)
        item = super().__getitem__(index)
        new = {p: r for p, r in self.skipped.items() if p not in before}
        if new:
            self._record(new)
        return item

    def _record(self, new: dict[str, str]) -> None:
        """List the newly skipped files where every process of the run sees them; stop above ``max_corrupt``."""
        skipped = dict(self.skipped)
        if self.skip_log is not None:
            self.skip_log.mkdir(parents=True, exist_ok=True)
            with open(self.skip_log / f"{os.getpid()}.tsv", "a") as f:
                f.writelines(f"{p}\t{r}\n" for p, r in new.items())
            skipped = read_skips(self.skip_log)
        refuse_corrupt_share(self.index, skipped, self.max_corrupt)

    def report(self) -> dict:
        """Index file, count, sha256 and every unreadable file (scan and first reads, all processes)."""
        bad = {**self.index["corrupt"], **(read_skips(self.skip_log) if self.skip_log else {}), **self.skipped}
        return {"index": None if self.index_path is None else str(self.index_path), "root": self.index["root"],
                "scanned": self.index["scanned"], "count": self.index["count"], "sha256": self.index["sha256"],
                "verified": self.index["verified"], "num_skipped": len(bad), "skipped": bad}

    # ------------------------------------------------------------------ boxes
    def _boxes(self, boxes) -> dict:
        """{relative path or file name: (xyxy pixel-edge boxes, class ids)} from VOC-style XMLs or COCO json."""
        coco = Path(boxes) if isinstance(boxes, (str, Path)) and str(boxes).endswith(".json") else next(
            (self.root / c for c in COCO_FILES if (self.root / c).is_file()), None)
        if coco is not None:
            return _coco_boxes(coco)
        ann = self.root / "Annotations"
        if not ann.is_dir():
            raise MissingDataError(f"DATA=folder {self.root}: boxes asked for (CorLoc, PiB) but neither "
                                   f"{ann}/<image stem>.xml (VOC-style) nor {self.root / COCO_FILES[0]} (COCO) exists.")
        from .boxes import parse_xml_boxes
        xmls = {p.stem: p for p in ann.rglob("*.xml")}
        seen: dict[str, str] = {}
        for rec in self.samples:  # boxes are matched by file stem: one image per stem
            stem = Path(rec).stem
            if stem in xmls and seen.setdefault(stem, rec) != rec:
                raise DatasetError(f"DATA=folder {self.root}: {seen[stem]} and {rec} share the stem '{stem}' of "
                                   f"{xmls[stem]}; boxes are matched by stem, so keep one image per stem under "
                                   "DATA_ROOT (e.g. point DATA_ROOT at a folder holding only the images and "
                                   "Annotations/).")
        parsed = {rec: parse_xml_boxes(xmls[Path(rec).stem], one_based=True) for rec in self.samples
                  if Path(rec).stem in xmls}
        names = sorted({n for _, ns, _ in parsed.values() for n in ns})
        return {rec: (b, [names.index(n) for n in ns]) for rec, (b, ns, _) in parsed.items()}


def _coco_boxes(path: Path) -> dict:
    """COCO instances: bbox [x, y, w, h] (pixel edges, 0-based) -> xyxy; crowd regions left out."""
    try:
        data = json.loads(Path(path).read_text())
        cats = {c["id"]: k for k, c in enumerate(sorted(data["categories"], key=lambda c: c["id"]))}
        files = {im["id"]: im["file_name"] for im in data["images"]}
        per: dict[int, list] = {}
        for a in data["annotations"]:
            if not a.get("iscrowd", 0):
                per.setdefault(a["image_id"], []).append(a)
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise DatasetError(f"{path}: not a COCO instances file ({e}); expected 'images', 'annotations' (bbox "
                           "[x, y, w, h]) and 'categories'.") from e
    out = {}
    for iid, anns in per.items():
        b = np.asarray([[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in anns)], np.float32).reshape(-1, 4)
        out[Path(files[iid]).as_posix()] = (b, [cats[a["category_id"]] for a in anns])
        out.setdefault(Path(files[iid]).name, out[Path(files[iid]).as_posix()])
    return out
