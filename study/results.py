"""The study's one reader of results.json files: the one schema of ``tokenmix/results.py`` (``task``, ``data``,
``backbone.sha256``, ``metrics``; probe or analysis from the run folder). Files written before that schema
(probes: ``backbone.checkpoint_sha256`` + ``config.data``; analyses: ``ckpt_sha256`` + ``data``) are still read,
so a study begun earlier keeps its finished cells.

Everything else in the study goes through :func:`read_result`.

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
    folder = parts[-4] if len(parts) >= 4 else ""  # runs/<variant>/<probe|analysis>/<task>/version_N/
    source = folder if folder in ("probe", "analysis") else ("probe" if "checkpoint_sha256" in backbone else "analysis")
    task = str(_first(r.get("task"), parts[-3] if len(parts) >= 3 else ""))
    sha = _first(backbone.get("sha256"), r.get("ckpt_sha256"), backbone.get("checkpoint_sha256"))  # new, legacy
    data = str(_first(r.get("data"), config.get("data"), "demo"))
    return Result(Path(path), task, str(source), sha, data, r["metrics"], r)
