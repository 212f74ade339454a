"""Dense quality and k-NN over training, read from pretraining runs' TensorBoard scalars (what ``DenseProbeCheck``
and ``KNNCheck`` log), side by side: one panel per measure, one line per run, and a table of where each measure
peaked and how far it fell by the end. This is the entmax paper's curve (dense measures peak and decline while
the k-NN keeps rising), looked for on any set of runs.

    python -m analysis.training_curves runs/degradation/lazy1/softmax/pretrain/demo_long/version_0 ... \\
        --labels "p = 1,small data" --out docs/examples/calibration-demo/degradation.png

A measure *declined* in a run when its drop from its best value to its last is beyond its evaluation noise:
``--band-json`` (a calibration results.json) gives each measure's noise sd σ over ``replicates`` evaluations of one
checkpoint; the drop of two evaluations has sd σ√2, so t = drop / (σ√2) on replicates − 1 df, one-sided p
(scipy), Benjamini–Hochberg adjusted over the table; declined = adjusted p ≤ 0.05. The best point is picked on the
same curve, so a drop is biased upwards. Without ``--band-json`` any drop is listed with no verdict.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from tokenmix.dense_measures import BY_KEY, Direction

# tag -> (title, lower is better, the calibration measure whose noise band applies): the dense measures' registry
# keys (tokenmix.dense_measures), which are their TensorBoard tags too, and KNNCheck's tag
MEASURES = {"knn/top1": ("k-NN top-1 (%)", False, "knn_top1"),
            **{k: (BY_KEY[k].label + (" (%)" if BY_KEY[k].unit == "%" else "")
                   + (" ↓" if BY_KEY[k].direction is Direction.UP else ""), BY_KEY[k].direction is Direction.UP, k)
               for k in ("dense_mIoU", "dense_retrieval_mIoU", "diffusion_effective_rank",
                         "diffusion_cls_patch_cosine", "diffusion_pib_cls")}}


@dataclass(frozen=True)
class Curve:
    steps: tuple[int, ...]
    values: tuple[float, ...]

    def peak(self, lower_is_better: bool) -> tuple[int, float]:
        i = min(range(len(self.values)), key=lambda j: (self.values[j] if lower_is_better else -self.values[j]))
        return self.steps[i], self.values[i]

    def drop(self, lower_is_better: bool) -> float:
        """best − last, signed so that positive = got worse after the peak."""
        _, best = self.peak(lower_is_better)
        return (self.values[-1] - best) if lower_is_better else (best - self.values[-1])


def read_curves(run: Path) -> dict[str, Curve]:
    """tag -> Curve from the run folder's event files (the k-NN at step 0 is its ``top1_random_init``)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    if not any(Path(run).glob("events.out.tfevents.*")):
        raise FileNotFoundError(f"{run}: no TensorBoard event file (a pretraining run's version_N folder)")
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    out = {}
    for tag in MEASURES:
        if tag not in tags:
            continue
        pts = {e.step: e.value for e in acc.Scalars(tag)}
        if tag == "knn/top1" and "knn/top1_random_init" in tags:
            pts.setdefault(0, acc.Scalars("knn/top1_random_init")[0].value)
        steps = tuple(sorted(pts))
        out[tag] = Curve(steps, tuple(float(pts[s]) for s in steps))
    return out


def bands_from(path: Optional[str]) -> dict[str, tuple[float, int]]:
    """Measure name -> (noise sd, replicates) of one evaluation, from a calibration results.json."""
    if not path:
        return {}
    measures = json.loads(Path(path).read_text())["metrics"]["measures"]
    return {k: (float(m["noise"]["sd"]), int(m["noise"]["replicates"])) for k, m in measures.items()
            if (m.get("noise") or {}).get("sd") and m["noise"].get("replicates", 0) > 1}


def table(runs: dict[str, dict[str, Curve]], bands: dict[str, tuple[float, int]]) -> str:
    from scipy import stats as st
    L = ["| run | measure | start | peak (step) | end | peak → end | declined (p, adj.) |", "|---" * 7 + "|"]
    rows = [(label, title, c, c.drop(lower), bands.get(key), c.peak(lower)) for label, curves in runs.items()
            for tag, (title, lower, key) in MEASURES.items() for c in [curves.get(tag)] if c is not None]
    ps = [st.t.sf(drop / (b[0] * 2 ** 0.5), b[1] - 1) if b else None for _, _, _, drop, b, _ in rows]
    adj = iter(st.false_discovery_control([p for p in ps if p is not None]) if any(p is not None for p in ps) else [])
    for (label, title, c, drop, b, (step, best)), p in zip(rows, ps):
        q = None if p is None else float(next(adj))
        verdict = "—" if q is None else f"{'yes' if q <= 0.05 else 'no'} (p = {p:.2g}, adj. {q:.2g}; sd {b[0]:.3g})"
        L.append(f"| {label} | {title} | {c.values[0]:.4g} | {best:.4g} ({step}) | {c.values[-1]:.4g} | "
                 f"{-drop + 0.0:+.3g} | {verdict} |")
    return "\n".join(L) + "\n"


def figure(runs: dict[str, dict[str, Curve]], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from .report_plots import save_png
    tags = [t for t in MEASURES if any(t in c for c in runs.values())]
    cols = 3
    rows = (len(tags) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, tag in zip(axes.flat, tags):
        for label, curves in runs.items():
            if tag in curves:
                ax.plot(curves[tag].steps, curves[tag].values, marker="o", ms=3, label=label)
        ax.set_title(MEASURES[tag][0], fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(tags):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.training_curves", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="pretraining run folders (…/pretrain/<preset>/version_N)")
    ap.add_argument("--labels", default="", help="one name per run, comma-separated (default: the folders)")
    ap.add_argument("--out", default="", help="PNG of the curves (and FILE.md beside it with the table)")
    ap.add_argument("--band-json", default="", help="calibration results.json whose noise sd decides 'declined'")
    args = ap.parse_args(argv)
    labels = [x.strip() for x in args.labels.split(",")] if args.labels else [str(r) for r in args.runs]
    if len(labels) != len(args.runs):
        ap.error(f"--labels names {len(labels)} runs, {len(args.runs)} given")
    try:
        runs = {lab: read_curves(Path(r)) for lab, r in zip(labels, args.runs)}
        md = table(runs, bands_from(args.band_json))
    except (FileNotFoundError, KeyError, json.JSONDecodeError) as e:
        print(f"training_curves error: {e}", file=sys.stderr)
        return 2
    print(md, end="")
    if args.out:
        figure(runs, Path(args.out))
        Path(args.out).with_suffix(".md").write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
