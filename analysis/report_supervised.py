"""The label-supervised section of ``make report``: one row per supervised run (newest summary.json of each
variant and data source under runs/<variant>/pretrain/supervised*/), and LaSt-ViT's published figures as
reference rows. Cells nobody measured say "not run"; nothing is filled in.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from tokenmix.results import KEYS

# ChengShiest/LAST-ViT cls_pretrain/README.md (ViT_190k.pth, 100 epochs, ImageNet-1K val) and the paper's
# Point-in-Box on ImageNet val (single object, box < 25%): docs/REFERENCE.md, docs/supervised.md.
SUPERVISED_PAPER_ROWS: list[dict[str, Any]] = [
    {"row": "paper: ViT-B/16 supervised, [CLS] head (LaSt-ViT paper)", "pib": 42.7},
    {"row": "paper: ViT-B/16 supervised + LaSt K=1 (LAST-ViT release)", "val_top1": 67.4, "val_top5": 87.6,
     "pib": 55.1},
    {"row": "paper: ViT-B/16 supervised + LaSt K=7 (LAST-ViT release)", "val_top1": 67.6, "val_top5": 87.8},
]
COLS = [("val_top1", "val top-1"), ("val_top5", "val top-5"), ("val_top1_random_init", "top-1 at random init"),
        ("steps", "steps"), ("pib", "PiB (%)")]


def collect_supervised(runs: Path) -> list[dict[str, Any]]:
    """Newest label-supervised summary.json per (variant, data): its metrics, with the run folder."""
    best: dict[tuple[str, str], dict] = {}
    for path in sorted(runs.glob("*/pretrain/supervised*/version_*/summary.json")):
        try:
            s = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if not isinstance(s, dict) or any(k not in s for k in KEYS) or s["config"].get("objective") != "supervised":
            continue
        key = (str(s["variant"]), str(s["data"] or "demo"))
        if key not in best or (s["created"], str(path)) > (best[key]["_created"], best[key]["_path"]):
            best[key] = {**s["metrics"], "_variant": key[0], "_data": key[1], "_path": str(path),
                         "_created": s["created"]}
    return [best[k] for k in sorted(best)]


def _fmt(v: Optional[float], paper: bool) -> str:
    if v is None:
        return "not reported" if paper else "not run"
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def supervised_section(runs: Path) -> list[str]:
    rows = collect_supervised(runs) if runs.is_dir() else []
    lines = ["", "## Label-supervised training", "",
             "`make pretrain OBJECTIVE=supervised` runs (summary.json); top-1 / top-5 in % on the run's val split. "
             "Demo rows train the demo ViT on the 8-class demo ImageFolder (chance 12.5%): never compare them with "
             "the ViT-B/16 ImageNet reference rows. PiB: not part of a training run (`make analyze TASK=pib`).", "",
             "| run | " + " | ".join(t for _, t in COLS) + " |", "|---|" + "---|" * len(COLS)]
    for r in rows:
        lines.append(f"| {r['_variant']} [{r['_data']}] | " + " | ".join(_fmt(r.get(k), False) for k, _ in COLS) + " |")
    if not rows:
        lines.append("| (no supervised run found) | " + " | ".join("not run" for _ in COLS) + " |")
    for p in SUPERVISED_PAPER_ROWS:
        lines.append(f"| *{p['row']}* | " + " | ".join(_fmt(p.get(k), True) for k, _ in COLS) + " |")
    lines += [""] + [f"- {r['_variant']} [{r['_data']}]: `{r['_path']}`" for r in rows]
    return lines
