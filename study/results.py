"""The study's one reader of results.json files, tolerant of both schemas in use:

- probes (``probes/results.py``): ``task``, ``metrics``, ``backbone.checkpoint_sha256``, ``config.data``;
- analyses (``analysis/run.py``): ``task``, ``metrics``, ``ckpt_sha256``, ``data``.

Everything else in the study goes through :func:`read_result`, so a later unified schema changes this file only.

    >>> r = read_result(Path("runs/study/demo/seed0/entmax/probe/knn/version_0/results.json"))  # doctest: +SKIP
    >>> r.task, r.source, r.checkpoint_sha256[:12], r.data
    ('knn', 'probe', '3f0c...', 'demo_cls')
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional


@dataclass(frozen=True)
class Result:
    path: Path
    task: str
    source: str  # probe | analysis
    checkpoint_sha256: Optional[str]
    data: str
    metrics: dict = field(repr=False)
    payload: dict = field(repr=False)


def _first(*values) -> Any:
    return next((v for v in values if v not in (None, "")), None)


def read_result(path: Path) -> Optional[Result]:
    """A results.json as a :class:`Result`; None when the file is missing, unreadable or has no metrics."""
    try:
        r = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError, TypeError):
        return None
    if not isinstance(r, dict) or not isinstance(r.get("metrics"), dict):
        return None
    backbone = r.get("backbone") if isinstance(r.get("backbone"), dict) else {}
    config = r.get("config") if isinstance(r.get("config"), dict) else {}
    parts = Path(path).parts
    source = _first(r.get("source"), "probe" if backbone or "probe" in parts[-5:-2] else "analysis")
    task = str(_first(r.get("task"), parts[-3] if len(parts) >= 3 else ""))
    sha = _first(r.get("ckpt_sha256"), backbone.get("checkpoint_sha256"), r.get("checkpoint_sha256"))
    data = str(_first(config.get("data"), r.get("data"), "demo"))
    return Result(Path(path), task, str(source), sha, data, r["metrics"], r)
