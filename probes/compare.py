"""Markdown table of the newest probe results per backbone folder: ``python -m probes.compare entmax
entmax_random pixels`` (folders under runs/). Used for the demo comparison in docs/probes.md."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokenmix.paths import RUNS

COLUMNS = [("knn", "k-NN top-1 (k=20)", lambda m: m["top1"]["20"]),
           ("voc", "VOC mIoU", lambda m: m["mIoU"]),
           ("nyuv2", "NYU RMSE (m, lower better)", lambda m: m["rmse"]),
           ("nyuv2", "NYU δ1", lambda m: m["d1"]),
           ("imagenet", "linear top-1", lambda m: m["best_top1"])]


def latest(folder: Path, task: str) -> dict | None:
    found = sorted((folder / "probe" / task).glob("version_*/results.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(found[-1].read_text()) if found else None


def table(names: list[str], runs: Path = RUNS) -> str:
    cols = [c for c in COLUMNS if any(latest(runs / n, c[0]) for n in names)]
    lines = ["| backbone | " + " | ".join(c[1] for c in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for n in names:
        cells = []
        for task, _, get in cols:
            res = latest(runs / n, task)
            cells.append("—" if res is None else f"{get(res['metrics']):.4g}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("names", nargs="+")
    ap.add_argument("--runs-dir", default=str(RUNS))
    a = ap.parse_args()
    print(table(a.names, Path(a.runs_dir)))
