"""``make report``: every probe and analysis results.json under runs/ -> reports/report.md + report.csv + plots.
Reads only the one results schema (tokenmix/results.py); a file in another shape is skipped with a message.

One row per variant (and per data source: runs on the generated demo data are kept apart from real-data runs),
the paper columns, the difference to the softmax baseline of the same data source, and the published numbers as
reference rows labelled "paper". A cell nobody measured says "not run"; a paper cell the paper does not report
says "not reported". Nothing is ever filled in.

    python -m analysis.report [--runs runs] [--out reports] [--baseline softmax] [--variants entmax pixels ...]
"""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import io
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from datamodules.demo import is_demo
from tokenmix import paths
from tokenmix.io import atomic_write
from tokenmix.results import KEYS

from .report_plots import plots

NOT_RUN = "not run"
NOT_REPORTED = "not reported"


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    source: str  # "probe" | "analysis"
    task: str  # probe task / analysis task
    pick: Callable[[dict, dict], Optional[float]]  # (metrics, whole results.json) -> value
    lower_is_better: bool = False
    digits: int = 2
    datasets: tuple = ()  # analysis only: which data names feed this column
    delta: bool = True  # show the difference to the baseline


def _get(d: Any, *keys) -> Optional[float]:
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return float(d) if isinstance(d, (int, float)) and not isinstance(d, bool) else None


def _knn20(m, r):
    top = m.get("top1") if isinstance(m, dict) else None
    return _get(top, "20") if isinstance(top, dict) and "20" in top else (
        _get(top, str(min(top, key=lambda k: abs(int(k) - 20)))) if isinstance(top, dict) and top else None)


COLUMNS: list[Column] = [
    Column("imagenet_linear", "ImageNet linear top-1", "probe", "imagenet", lambda m, r: _get(m, "best_top1")),
    Column("imagenet_knn", "ImageNet k-NN top-1 (k=20)", "probe", "knn", _knn20),
    Column("voc_miou", "VOC mIoU", "probe", "voc", lambda m, r: _get(m, "mIoU")),
    Column("ade20k_miou", "ADE20K mIoU", "probe", "ade20k", lambda m, r: _get(m, "mIoU")),
    Column("cityscapes_miou", "Cityscapes mIoU", "probe", "cityscapes", lambda m, r: _get(m, "mIoU")),
    Column("nyuv2_rmse", "NYUv2 RMSE", "probe", "nyuv2", lambda m, r: _get(m, "rmse"), True, 4),
    Column("nyuv2_d1", "NYUv2 δ1", "probe", "nyuv2", lambda m, r: _get(m, "d1"), digits=4),
    Column("sunrgbd_rmse", "SUN RGB-D RMSE", "probe", "sunrgbd", lambda m, r: _get(m, "rmse"), True, 4),
    Column("kitti_rmse", "KITTI RMSE", "probe", "kitti", lambda m, r: _get(m, "rmse"), True, 4),
    Column("seg_miou", "own seg mIoU", "probe", "seg", lambda m, r: _get(m, "mIoU")),  # DATA=custom_seg
    Column("depth_rmse", "own depth RMSE", "probe", "depth", lambda m, r: _get(m, "rmse"), True, 4),  # custom_depth
    Column("davis_jf", "DAVIS-2017 J&F", "probe", "davis", lambda m, r: _get(m, "J&F-Mean")),  # label propagation
    Column("davis_j", "DAVIS-2017 J", "probe", "davis", lambda m, r: _get(m, "J-Mean")),
    Column("davis_f", "DAVIS-2017 F", "probe", "davis", lambda m, r: _get(m, "F-Mean")),
    Column("roxford5k_map_m", "ROxford mAP M", "probe", "roxford5k", lambda m, r: _get(m, "mAP", "M")),
    Column("roxford5k_map_h", "ROxford mAP H", "probe", "roxford5k", lambda m, r: _get(m, "mAP", "H")),
    Column("rparis6k_map_m", "RParis mAP M", "probe", "rparis6k", lambda m, r: _get(m, "mAP", "M")),
    Column("rparis6k_map_h", "RParis mAP H", "probe", "rparis6k", lambda m, r: _get(m, "mAP", "H")),
    Column("copydays_map", "Copydays strong mAP", "probe", "copydays", lambda m, r: _get(m, "mAP", "strong")),
    Column("pib_imagenet", "PiB ImageNet ([CLS])", "analysis", "pib", lambda m, r: _get(m, "pib"),
           datasets=("imagenet",)),
    Column("pib_voc", "PiB VOC ([CLS])", "analysis", "pib", lambda m, r: _get(m, "pib"), datasets=("voc", "demo")),
    Column("corloc_voc", "CorLoc VOC", "analysis", "corloc", lambda m, r: _get(m, "corloc"),
           datasets=("voc", "demo")),
]
EXTRA_COLUMNS: list[Column] = [
    # LaSt-ViT only: the same PiB scored against the aggregated token instead of the encoder's [CLS]
    Column("pib_aggregated_imagenet", "PiB ImageNet, aggregated token (LaSt-ViT)", "analysis", "pib",
           lambda m, r: _get(m, "pib_aggregated"), datasets=("imagenet",)),
    Column("pib_aggregated_voc", "PiB VOC, aggregated token (LaSt-ViT)", "analysis", "pib",
           lambda m, r: _get(m, "pib_aggregated"), datasets=("voc", "demo")),
    Column("score_contrast_voc", "Patch Score contrast, box - rest ([CLS], VOC)", "analysis", "pib",
           lambda m, r: _get(m, "patch_score_contrast"), datasets=("voc", "demo"), digits=4),
    Column("score_contrast_aggregated_voc", "Patch Score contrast, aggregated token (LaSt-ViT, VOC)", "analysis",
           "pib", lambda m, r: _get(m, "patch_score_contrast_aggregated"), datasets=("voc", "demo"), digits=4),
    Column("cls_patch_cos_voc", "cos(patch, [CLS]) (VOC)", "analysis", "pib", lambda m, r: _get(m, "cls_patch_cos"),
           datasets=("voc", "demo"), digits=4),
    Column("pib_chance", "PiB chance level (VOC/demo, %)", "analysis", "pib", lambda m, r: _get(m, "pib_chance"),
           datasets=("voc", "demo"), delta=False),
    Column("high_norm_share", "high-norm patch share (last block, %)", "analysis", "norms",
           lambda m, r: None if _get(m, "high_norm_share") is None else 100 * _get(m, "high_norm_share")),
    Column("attn_zero_share", "attention exact zeros (%)", "analysis", "attention",
           lambda m, r: None if _get(m, "zero_share") is None else 100 * _get(m, "zero_share")),
    Column("pca_top3_var", "PCA top-3 explained variance (%)", "analysis", "pca",
           lambda m, r: None if not m.get("explained_variance_ratio") else 100 * sum(m["explained_variance_ratio"])),
    Column("votes_in_box", "LaSt votes inside boxes (%)", "analysis", "votes",
           lambda m, r: _get(m, "share_of_votes_in_box")),
    Column("pib_chance_position", "PiB position-aware chance (VOC/demo, %)", "analysis", "pib",
           lambda m, r: _get(m, "pib_chance_position"), datasets=("voc", "demo")),
    Column("pib_average_patch", "PiB of the most average patch (VOC/demo, %)", "analysis", "pib",
           lambda m, r: _get(m, "pib_average_patch"), datasets=("voc", "demo")),
] + [Column(f"marker_{k.replace('.', '_')}", f"marker: {title}", "analysis", "marker",
            lambda m, r, k=k: _get(m, *k.split(".")), digits=d) for k, title, d in (  # analysis/marker.py
    ("follows_marker", "cue conflict, follows the marker (%)", 2), ("follows_object", "follows the object (%)", 2),
    ("pib_marker", "PiB on the marker ([CLS], %)", 2), ("pib_marker_aggregated", "PiB on the marker (aggregated, %)", 2),
    ("cls_attention_marker", "[CLS] attention on the marker", 4), ("patch_score_contrast", "contrast object - rest", 4),
    ("restricted.pib_object", "known positive: PiB on the object, [CLS] off it (%)", 2),
    ("pib_object", "PiB on the object (%)", 2),
    ("restricted.patch_score_contrast", "known positive: contrast, [CLS] off the object", 4))]

# Published numbers (docs/REFERENCE.md). Entmax paper: DINOv1 ViT-S/16, 200 epochs, ImageNet-1K; linear probes.
# LaSt-ViT: Point-in-Box on ImageNet val (single object, box < 25%).
PAPER_ROWS: list[dict[str, Any]] = [
    {"row": "paper: CLS baseline (entmax paper, DINO ViT-S/16 200 ep)", "group": "entmax",
     "imagenet_linear": 69.50, "voc_miou": 42.80, "ade20k_miou": 19.85, "cityscapes_miou": 36.79},
    {"row": "paper: Entmax-1.5 (entmax paper, DINO ViT-S/16 200 ep)", "group": "entmax",
     "imagenet_linear": 70.06, "voc_miou": 48.78, "ade20k_miou": 21.97, "cityscapes_miou": 37.87},
    {"row": "paper: DINO-v1 baseline (LaSt-ViT paper)", "group": "lastvit_dino", "pib_imagenet": 44.5},
    {"row": "paper: DINO-v1 + LaSt (LaSt-ViT paper)", "group": "lastvit_dino", "pib_imagenet": 69.7},
    {"row": "paper: ViT-B/16 supervised baseline (LaSt-ViT paper)", "group": "lastvit_b16", "pib_imagenet": 42.7},
    {"row": "paper: ViT-B/16 supervised + LaSt (LaSt-ViT paper)", "group": "lastvit_b16", "pib_imagenet": 55.1},
    {"row": "paper: DINO ViT-S/16, DAVIS-2017 val (DINO paper)", "group": "dino_davis", "davis_jf": 61.8,
     "davis_j": 60.2, "davis_f": 63.4},
]
PAPER_NOTES = [
    "Entmax paper, depth: NYUv2 / SUN RGB-D / KITTI RMSE 0.004-0.005 lower with entmax-1.5 than the CLS baseline "
    "(no absolute values given, so those cells say 'not reported').",
    "Paper rows compare with their own baseline (the first row of each paper pair), not with our softmax run.",
]


# --------------------------------------------------------------------------- collecting results

@dataclass
class Found:
    """One results.json (tokenmix/results.py schema) under runs/<folder>/<probe|analysis>/<task>/version_N/."""
    variant: str
    data: str  # "demo" or the dataset name
    kind: str  # "demo" | "real": the report keeps demo-data rows apart
    source: str  # "probe" | "analysis"
    task: str
    sweep: bool  # a probe layer sweep (metrics["layers"]): feeds the per-block plots, not the table
    created: str
    path: Path
    payload: dict = field(repr=False)

    @property
    def checkpoint(self) -> Optional[str]:
        """sha256 of the checkpoint the numbers were computed from (None: a baseline)."""
        return (self.payload.get("backbone") or {}).get("sha256")


def _load(path: Path) -> Optional[dict]:
    try:
        r = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:  # a half-written file cannot exist (atomic writes); a foreign one can
        print(f"[report] skipping unreadable {path}: {e}", file=sys.stderr)
        return None
    if not isinstance(r, dict) or any(k not in r for k in KEYS) or not isinstance(r["metrics"], dict):
        print(f"[report] skipping {path}: not the results schema of tokenmix/results.py (a run from an older "
              "version: run it again)", file=sys.stderr)
        return None
    return r


def _data_kind(data: str) -> str:
    return "demo" if is_demo(data) else "real"


def collect(runs: Path) -> list[Found]:
    """Every probe and analysis results.json under ``runs``."""
    out = []
    for source in ("probe", "analysis"):
        for path in sorted(runs.glob(f"*/{source}/*/version_*/results.json")):
            r = _load(path)
            if r is None:
                continue
            data = str(r["data"] or "demo")
            out.append(Found(str(r["variant"]), data, _data_kind(data), source, str(r["task"]),
                             "layers" in r["metrics"], str(r["created"]), path, r))
    return out


def newest(found: list[Found], variant: str, kind: str, col: Column, sweep: bool = False) -> Optional[Found]:
    """The newest result feeding ``col`` for one row (analysis columns: only from the data sets they apply to)."""
    best = None
    for f in found:
        if (f.variant, f.kind, f.source, f.task, f.sweep) != (variant, kind, col.source, col.task, sweep):
            continue
        if col.datasets and f.data not in col.datasets and not (kind == "demo" and "demo" in col.datasets):
            continue
        if best is None or (f.created, str(f.path)) > (best.created, str(best.path)):
            best = f
    return best


def build_table(found: list[Found], baseline: str = "softmax"):
    rows_keys = sorted({(f.variant, f.kind) for f in found},
                       key=lambda vk: (vk[1] != "real", vk[0] != baseline, vk))
    kinds = {k for _, k in rows_keys}
    table = []
    for variant, kind in rows_keys:
        label = variant if len(kinds) == 1 and kind == "real" else f"{variant} [{kind} data]"
        row = {"row": label, "variant": variant, "data": kind, "sources": {}}
        for col in COLUMNS + EXTRA_COLUMNS:
            f = newest(found, variant, kind, col)
            row[col.key] = None if f is None else col.pick(f.payload["metrics"], f.payload)
            if f is not None:
                row["sources"][col.key] = (str(f.path), f.checkpoint)
        # one row = one variant name; say so when its cells come from different checkpoints
        row["checkpoints"] = sorted({c for _, c in row["sources"].values() if c})
        table.append(row)
    for row in table:  # difference to the baseline of the same data source
        base = next((r for r in table if r["variant"] == baseline and r["data"] == row["data"]), None)
        for col in COLUMNS + EXTRA_COLUMNS:
            v, b = row[col.key], (base or {}).get(col.key)
            row[f"{col.key}_delta"] = None if v is None or b is None or row is base or not col.delta else v - b
    return table


def paper_table():
    rows = []
    for p in PAPER_ROWS:
        row = {"row": p["row"], "variant": "paper", "data": "paper", "sources": {}}
        base = next(q for q in PAPER_ROWS if q["group"] == p["group"])
        for col in COLUMNS:
            row[col.key] = p.get(col.key)
            row[f"{col.key}_delta"] = (p[col.key] - base[col.key]) if (p is not base and col.key in p
                                                                       and col.key in base) else None
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- writing

def _fmt(v: Optional[float], d: Optional[float], col: Column, paper: bool) -> str:
    if v is None:
        return NOT_REPORTED if paper else NOT_RUN
    s = f"{v:.{col.digits}f}"
    if d is not None:
        s += f" ({d:+.{col.digits}f})"
    return s


def markdown(table, papers, plots: list[str], runs: Path, baseline: str) -> str:
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    heads = [c.title + (" ↓" if c.lower_is_better else "") for c in COLUMNS]
    lines = [
        "# tokenmix comparison report", "",
        f"Generated {now} from every `results.json` under `{runs}` by `make report`. "
        f"Cells: value (difference to `{baseline}` of the same data source). ↓ = lower is better; "
        "mIoU / top-1 / PiB / CorLoc in %, RMSE in metres. "
        f"'{NOT_RUN}' = no result found; '{NOT_REPORTED}' = the paper gives no number.",
        "Rows marked [demo data] come from the generated demo datasets (their columns are the demo analogues: "
        "demo ImageFolder for ImageNet, demo VOC scenes for VOC/PiB/CorLoc, demo NYU rooms for NYUv2); "
        "never compare them with the paper rows.", "",
        "| variant | " + " | ".join(heads) + " |",
        "|---|" + "---|" * len(COLUMNS),
    ]
    for r in table:
        mixed = f" ({len(r['checkpoints'])} checkpoints, see Sources)" if len(r["checkpoints"]) > 1 else ""
        lines.append(f"| {r['row']}{mixed} | " + " | ".join(_fmt(r[c.key], r[f'{c.key}_delta'], c, False)
                                                            for c in COLUMNS) + " |")
    for r in papers:
        lines.append(f"| *{r['row']}* | " + " | ".join(_fmt(r[c.key], r[f'{c.key}_delta'], c, True)
                                                      for c in COLUMNS) + " |")
    lines += [""] + [f"- {n}" for n in PAPER_NOTES]
    lines += ["", "## Token statistics", "", "| variant | " + " | ".join(c.title for c in EXTRA_COLUMNS) + " |",
              "|---|" + "---|" * len(EXTRA_COLUMNS)]
    for r in table:
        lines.append(f"| {r['row']} | " + " | ".join(_fmt(r[c.key], r[f'{c.key}_delta'], c, False)
                                                    for c in EXTRA_COLUMNS) + " |")
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    lines += ["", "## Sources", "", "Each cell's results.json and the sha256 (first 12 hex digits) of the checkpoint "
              "it was computed from.", ""]
    for r in table:
        for k, (p, sha) in sorted(r["sources"].items()):
            lines.append(f"- {r['row']} / {k}: `{rel_path(p)}` (checkpoint {sha[:12] if sha else 'none: baseline'})")
    return "\n".join(lines) + "\n"


def rel_path(p: str) -> str:
    """``p`` relative to the working directory where it lies below it (shorter report lines)."""
    try:
        return str(Path(p).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return p


def write_csv(table, papers, path: Path) -> None:
    cols = [c.key for c in COLUMNS + EXTRA_COLUMNS]
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["row", "kind", "data"] + cols + [f"{c}_delta_vs_baseline" for c in cols] + ["checkpoints_sha256"])
    for r, kind in [(r, "measured") for r in table] + [(r, "paper") for r in papers]:
        empty = NOT_REPORTED if kind == "paper" else NOT_RUN
        vals = [empty if r.get(c) is None else f"{r[c]:.6g}" for c in cols]
        deltas = ["" if r.get(f"{c}_delta") is None else f"{r[f'{c}_delta']:.6g}" for c in cols]
        w.writerow([r["row"], kind, r["data"]] + vals + deltas + [" ".join(r.get("checkpoints", []))])
    with atomic_write(path, "w") as f:
        f.write(buf.getvalue())


def main(argv=None) -> Path:
    p = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default="", help="runs folder (default: tokenmix.paths.RUNS)")
    p.add_argument("--out", default="", help="output folder (default: <repo>/reports)")
    p.add_argument("--baseline", default="softmax", help="variant the differences are taken against")
    p.add_argument("--variants", nargs="+", default=None, metavar="FOLDER",
                   help="only these rows (run folders under runs/, e.g. entmax entmax_random pixels)")
    args = p.parse_args(argv)
    runs = Path(args.runs) if args.runs else paths.RUNS
    out = Path(args.out) if args.out else paths.REPO / "reports"
    out.mkdir(parents=True, exist_ok=True)
    found = collect(runs) if runs.is_dir() else []
    if not found:
        print(f"[report] no results.json under {runs}: every measured cell will say '{NOT_RUN}'. Run "
              "`make probe` / `make analyze` first.", file=sys.stderr)
    if args.variants:
        found = [f for f in found if f.variant in args.variants]
    table, papers = build_table(found, args.baseline), paper_table()
    written = plots(found, out, COLUMNS)
    md = markdown(table, papers, written, runs, args.baseline)
    from .report_supervised import supervised_section  # label-supervised runs + LAST-ViT reference rows
    md += "\n".join(supervised_section(runs)) + "\n"
    from .calibration import calibration_section  # the diffusion dial's responses, blind measures marked
    md += "\n".join(calibration_section(found)) + "\n"
    with atomic_write(out / "report.md", "w") as f:
        f.write(md)
    write_csv(table, papers, out / "report.csv")
    print(md)
    print(f"[report] wrote {out / 'report.md'}, {out / 'report.csv'} and {len(written)} plot(s)")
    return out / "report.md"


if __name__ == "__main__":
    main()
