"""results.json: one per probe run, written atomically into the run's own (fresh) version folder."""
from __future__ import annotations

import datetime as _dt
import math
import platform
from pathlib import Path
from typing import Any

from tokenmix.io import atomic_json_dump


def _clean(x: Any) -> Any:
    """JSON-safe: NaN/inf -> None, tensors -> numbers, tuples -> lists, int dict keys -> str."""
    if hasattr(x, "tolist"):
        x = x.tolist()
    if isinstance(x, float):
        return None if (math.isnan(x) or math.isinf(x)) else x
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def write_results(log_dir: str | Path, *, task: str, metrics: dict, config: dict, backbone: dict,
                  extra: dict | None = None) -> Path:
    path = Path(log_dir) / "results.json"
    if path.exists():  # a version folder belongs to one run: never merge two runs' numbers
        raise FileExistsError(f"{path} already exists; each probe run writes into a fresh version folder")
    payload = {
        "task": task,
        "metrics": metrics,
        "backbone": backbone,
        "config": config,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        **(extra or {}),
    }
    atomic_json_dump(_clean(payload), path)
    return path
