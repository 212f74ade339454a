"""The one results schema: every probe, analysis and pretraining run writes a JSON file with the top-level
keys ``KEYS``: ``task`` (knn, voc, pib, ..., ``pretrain``), ``variant`` (the run folder: the report's row),
``data`` (``demo`` or the ``--data`` name), ``backbone`` (``{source, config, checkpoint, sha256}``, source
checkpoint | random | pixels | training), ``metrics`` (layer sweeps under ``"layers"``, PNGs under
``"figures"``), ``config``, ``created`` (UTC, ISO 8601) and ``host``.
"""
from __future__ import annotations

import datetime as _dt
import math
import platform
from pathlib import Path
from typing import Any, Optional

from .io import atomic_json_dump

KEYS = ("task", "variant", "data", "backbone", "metrics", "config", "created", "host")
BACKBONE_KEYS = ("source", "config", "checkpoint", "sha256")


def clean(x: Any) -> Any:
    """Plain JSON types, for the results files and for the hyper-parameters a checkpoint holds (it must load with
    ``weights_only=True``): NaN/inf -> None, tensors -> numbers, tuples -> lists, int dict keys -> str, paths -> str."""
    if hasattr(x, "tolist"):
        x = x.tolist()
    if isinstance(x, float):
        return None if (math.isnan(x) or math.isinf(x)) else x
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    return x


def backbone_entry(config: dict, checkpoint: Optional[str] = None, sha256: Optional[str] = None,
                   source: str = "checkpoint") -> dict[str, Any]:
    """The ``backbone`` entry: architecture config, checkpoint file and its sha256 (None for random / pixels)."""
    return {"source": source, "config": dict(config or {}), "checkpoint": None if checkpoint is None
            else str(checkpoint), "sha256": sha256}


def results_payload(*, task: str, variant: str, data: str, backbone: dict, metrics: dict,
                    config: dict) -> dict[str, Any]:
    """The schema's dict (JSON-safe), stamped with the time and host."""
    missing = [k for k in BACKBONE_KEYS if k not in backbone]
    if missing:
        raise ValueError(f"backbone entry lacks {missing}; build it with tokenmix.results.backbone_entry")
    return clean({"task": str(task), "variant": str(variant), "data": str(data or "demo"), "backbone": backbone,
                  "metrics": metrics, "config": config,
                  "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                  "host": platform.node()})


def write_results(log_dir: str | Path, *, name: str = "results.json", overwrite: bool = False,
                  **fields: Any) -> Path:
    """``results_payload(**fields)`` written atomically to ``log_dir/name``. A run folder belongs to one run, so
    an existing file is an error unless ``overwrite`` (a resumed pretraining rewrites its summary)."""
    path = Path(log_dir) / name
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists; each run writes into a fresh version folder")
    atomic_json_dump(results_payload(**fields), path)
    return path


def write_summary(log_dir: str | Path, *, objective: str, variant: str, data: Optional[str], backbone_config: dict,
                  metrics: dict, config: Optional[dict] = None, checkpoint: Optional[str] = None) -> Path:
    """A pretraining run's ``summary.json`` in the same schema (task ``pretrain``, ``backbone.source``
    ``training``, no sha256: its last.ckpt is rewritten while the run goes on); a resumed run rewrites it."""
    return write_results(log_dir, name="summary.json", overwrite=True, task="pretrain", variant=variant, data=data,
                         backbone=backbone_entry(backbone_config, checkpoint or None, None, "training"),
                         metrics=metrics, config={"objective": objective, **(config or {})})
