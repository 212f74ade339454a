"""``make analyze TASK=calibration [VARIANT=... | CKPT=...]``: a positive control for every dense measure.

The diffusion dial (``backbones.diffusion_dial``; default ``--dial-mode tokens``: each token entering the last blocks
mixed with the mean token, ``x' = (1 - a) x + a mean(x)``; ``attention``: each attention row with the uniform row,
``P' = (1 - a) P + a / N``, which changes little where the attention is near-uniform already, as in the demo and tiny
runs: docs/calibration.md) is swept over ``a`` in {0, 0.25, 0.5, 0.75, 1} on a fixed backbone. At each ``a`` every
dense measure that runs head-free on a CPU is evaluated (``analysis.calibration_measures``): ridge segmentation,
dense retrieval and overclustering mIoU, Point-in-Box and the Patch Score spread, cos(patch, [CLS]), effective rank,
attention entropy and share of exact zeros, with the [CLS] k-NN beside them. At ``a = 0`` the same evaluation is
repeated over probe seeds and bootstrapped over images: each measure's noise band (``tokenmix.noise``, the rule of
the study's "inside seed noise" verdict). A measure whose response from ``a = 0`` to ``a = 1`` stays inside its band
is *blind* at this scale; one that moves against its expected direction is flagged *wrong way*.

Writes ``runs/<variant>/analysis/calibration/version_N/``: ``results.json`` (``tokenmix.results`` schema;
``metrics.measures.<name>``: expected direction, value per level, response, noise band, verdict), ``calibration.png``
(each measure against ``a`` with its band) and TensorBoard scalars. Depth is not swept: its probe trains a head.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from typing import Optional

import torch

from backbones.diffusion_dial import Mode, Rows, default_blocks, dialed_blocks, diffusion_dial
from tokenmix.cli import error_exit
from tokenmix.noise import Direction, NoiseBand, Verdict, bootstrap, combine, noise_band, verdict

from .calibration_measures import EvalSettings, Evaluation, knn_evaluation, measures, n_resampled, seg_evaluation

LEVELS = (0.0, 0.25, 0.5, 0.75, 1.0)
FORMULAS = {Mode.ATTENTION: "P' = (1 - a) P + a / N", Mode.TOKENS: "x' = (1 - a) x + a mean(x) at each block input"}


@dataclass(frozen=True)
class Measure:
    key: str
    label: str
    direction: Direction  # expected as a -> 1 (more diffusion)
    noise: str            # what its band is made of
    why: str


MEASURES: tuple[Measure, ...] = (
    Measure("ridge_mIoU", "ridge seg. mIoU (%)", Direction.DOWN, "bootstrap", "local evidence diluted"),
    Measure("retrieval_mIoU", "retrieval mIoU (%)", Direction.DOWN, "seeds+bootstrap", "neighbours less local"),
    Measure("overcluster_mIoU", "overcluster mIoU (%)", Direction.DOWN, "seeds", "clusters mix classes"),
    Measure("pib", "Point-in-Box (%)", Direction.DOWN, "bootstrap", "top patch drifts off the object"),
    Measure("patch_score_spread", "Patch Score spread", Direction.DOWN, "bootstrap",
            "std over patches of cos([CLS], patch): the map flattens"),
    Measure("cls_patch_cosine", "cos(patch, [CLS])", Direction.UP, "bootstrap", "patches share a global vector"),
    Measure("effective_rank", "effective rank", Direction.DOWN, "bootstrap", "patch features collapse"),
    Measure("attn_entropy", "attention entropy (nats)", Direction.UP, "bootstrap", "rows approach uniform"),
    Measure("attn_zero_share", "attention exact zeros", Direction.DOWN, "bootstrap",
            "the uniform share leaves no zero (0 throughout for softmax)"),
    Measure("knn_top1", "[CLS] k-NN top-1 (%)", Direction.NONE, "bootstrap", "global token, reported beside"),
)


@dataclass(frozen=True)
class CalibrationConfig:
    levels: tuple[float, ...] = LEVELS
    blocks: Optional[int] = None   # dialed last blocks (None: the last third)
    rows: Rows = Rows.ALL
    mode: Mode = Mode.TOKENS       # attention-row mixing cannot flatten the near-uniform attention of CPU-scale runs
    task: str = "voc"              # segmentation task of the dense probes
    img_size: Optional[int] = None  # probe input side (None: the task's, e.g. 128 on the demo VOC)
    max_train: int = 300           # evenly spaced images of each split (the demo VOC has 300 / 100)
    max_val: int = 100
    knn_train: int = 2000          # classification images for the [CLS] k-NN (0: no k-NN)
    knn_val: int = 800
    seeds: int = 5
    bootstrap: int = 200
    attn_images: int = 32
    batch_size: int = 16
    device: str = "cpu"


def _band(m: Measure, ev: Evaluation, seeds: int, reps: int) -> NoiseBand:
    """The noise band of ``m`` from the a = 0 evaluation: probe seeds and / or a bootstrap over images."""
    parts = []
    if "seeds" in m.noise:
        parts.append(noise_band([measures(ev, [m.key], seed=s)[m.key] for s in range(seeds)], "seeds"))
    if "bootstrap" in m.noise:
        parts.append(noise_band(bootstrap(n_resampled(ev, m.key), lambda i: measures(ev, [m.key], idx=i)[m.key],
                                          reps), "bootstrap"))
    return combine(*parts) if len(parts) > 1 else parts[0]


def summarize(values: dict[float, dict], ev0: Evaluation, cfg: CalibrationConfig) -> dict:
    """Per measure: direction, value per level, response (a = max - a = 0), noise band, verdict, and the levels in
    between where it went against its direction beyond the band (``wrong_way_at``: not monotone)."""
    lo, hi = min(cfg.levels), max(cfg.levels)
    out = {}
    for m in MEASURES:
        if m.key not in values[lo]:
            continue
        band = _band(m, ev0, cfg.seeds, cfg.bootstrap)
        delta = values[hi][m.key] - values[lo][m.key]
        v = verdict(delta, band, m.direction)
        # levels on the way where the measure went against its direction beyond the band (not monotone)
        against = [a for a in cfg.levels[1:-1] if verdict(values[a][m.key] - values[lo][m.key], band, m.direction)
                   is Verdict.WRONG_WAY]
        out[m.key] = {"label": m.label, "expected": m.direction.value, "why": m.why,
                      "values": [values[a][m.key] for a in cfg.levels], "response": delta,
                      "noise": band.as_dict(), "verdict": v.value, "blind": v is Verdict.BLIND,
                      "wrong_way_at": against}
    return out


def sweep(model, seg_dm, knn_dm, cfg: CalibrationConfig, log=print) -> tuple[dict, Evaluation]:
    """The measures at every level (``{a: {measure: value}}``) and the a = 0 evaluation (for the bands)."""
    idx = dialed_blocks(model.depth, cfg.blocks)
    s = EvalSettings(seg_dm.num_classes, seeds=cfg.seeds, attn_images=cfg.attn_images, batch_size=cfg.batch_size,
                     device=cfg.device)
    values, ev0 = {}, None
    for a in cfg.levels:
        t0 = time.perf_counter()
        with torch.no_grad(), diffusion_dial(model, a, blocks=len(idx), rows=cfg.rows, mode=cfg.mode):
            ev = seg_evaluation(model, seg_dm, s, idx)
            if knn_dm is not None:
                ev.knn_correct = knn_evaluation(model, knn_dm, s)
        values[a] = measures(ev)
        ev0 = ev if a == min(cfg.levels) else ev0
        log(f"[calibration] a = {a:g}: " + ", ".join(f"{k} {v:.4g}" for k, v in values[a].items())
            + f" ({time.perf_counter() - t0:.1f} s)")
    return values, ev0


def figure(result: dict, levels, title: str):
    """One panel per measure: value against a, the a = 0 noise band shaded, the verdict in the title."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    items = list(result.items())
    cols = 5
    rows = (len(items) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.7 * rows), squeeze=False)
    for ax, (key, r) in zip(axes.flat, items):
        ax.plot(levels, r["values"], "o-", color="tab:blue")
        hw = r["noise"]["half_width"]
        if hw is not None:
            ax.axhspan(r["values"][0] - hw, r["values"][0] + hw, color="tab:grey", alpha=0.25)
        note = f", wrong way at a = {', '.join(f'{a:g}' for a in r['wrong_way_at'])}" if r["wrong_way_at"] else ""
        ax.set_title(f"{r['label']}\nexpected {r['expected']}: {r['verdict']}{note}", fontsize=8)
        ax.set_xlabel("dial a", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(items):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def calibration_section(found) -> list[str]:
    """``make report``'s calibration table: the newest calibration per (variant, data), each measure's response
    from the lowest to the highest a with its noise band; blind measures marked (``analysis.report.Found`` rows)."""
    newest = {}
    for f in found:
        if f.task == "calibration" and f.created >= newest.get((f.variant, f.data), f).created:
            newest[(f.variant, f.data)] = f
    if not newest:
        return []
    keys = [m.key for m in MEASURES]
    lines = ["", "## Calibration (diffusion dial)", "",
             "Response of each measure from the lowest to the highest dial value a (`make analyze TASK=calibration`), "
             "± its noise band (2 sd of one evaluation at a = 0: probe seeds / bootstrap over images); **blind**: "
             "inside the band, *wrong way*: against the expected direction (docs/calibration.md).", "",
             "| variant | data | dial | " + " | ".join(f"{m.label} ({m.direction.value})" for m in MEASURES) + " |",
             "|---|---|---|" + "---|" * len(keys)]
    for (variant, data), f in sorted(newest.items()):
        ms, dial = f.payload["metrics"].get("measures", {}), f.payload["metrics"].get("dial", {})
        cells = []
        for k in keys:
            r = ms.get(k)
            hw = None if r is None else r["noise"]["half_width"]
            cell = "not run" if r is None else f"{r['response']:+.3g} ± {float('nan') if hw is None else hw:.2g}"
            flag = " **blind**" if r and r["blind"] else " *wrong way*" if r and r["verdict"] == "wrong way" else ""
            cells.append(cell + flag + (" (not monotone)" if r and r.get("wrong_way_at") else ""))
        lines.append(f"| {variant} | {data} | {dial.get('mode', '')} {dial.get('blocks', '')} | " + " | ".join(cells)
                     + " |")
    return lines


# --------------------------------------------------------------------------- data and command line

def _datamodule(task_name: str, data: str, data_root: str, patch_size: int, bs: int, n_train: int, n_val: int,
                img_size: Optional[int] = None):
    """The probe protocol's DataModule of ``task_name`` (``probes.core.data``), ``n_train`` / ``n_val`` evenly spaced
    images of its two splits (0: all), input ``img_size`` (None: the task's)."""
    from datamodules.datamodule_base import SplitView, evenly_spaced
    from datamodules.demo import is_demo
    from probes.core.data import probe_datamodule, probe_dataset
    from probes.core.task_table import get_task
    task = get_task(task_name)
    name, root = probe_dataset(task, data, data_root)
    size = (img_size,) * 2 if img_size else task.demo_img_size if is_demo(data) else task.img_size
    dm = probe_datamodule(task, name, root, size, patch_size, batch_size=bs)
    dm.setup("fit")
    dm.train_set = SplitView(evenly_spaced(dm.train_set.dataset, n_train or None), dm.train_set.transform)
    dm.val_set = SplitView(evenly_spaced(dm.val_set.dataset, n_val or None), dm.val_set.transform)
    return dm


def open_data(data: str, data_root: str, knn_data: str, cfg: "CalibrationConfig", patch_size: int):
    """(segmentation DataModule, classification DataModule or None) of the sweep."""
    from datamodules.demo import is_demo
    seg = _datamodule(cfg.task, data, data_root, patch_size, cfg.batch_size, cfg.max_train, cfg.max_val,
                      cfg.img_size)
    if not cfg.knn_train or not (knn_data or is_demo(data)):
        return seg, None
    name, _, root = (knn_data or "demo:").partition(":")
    if not is_demo(name) and not root:
        raise ValueError(f"--knn-data {knn_data!r}: expected NAME:ROOT (e.g. imagefolder:/my/cls) or demo")
    return seg, _datamodule("knn", name, root if not is_demo(name) else (data_root if is_demo(data) else ""),
                            patch_size, cfg.batch_size, cfg.knn_train, cfg.knn_val)



def build_parser() -> argparse.ArgumentParser:
    from tokenmix.cli import eval_parent_parser
    p = argparse.ArgumentParser(prog="python -m analysis.calibration", description=__doc__,
                                parents=[eval_parent_parser()], formatter_class=argparse.RawDescriptionHelpFormatter)
    d = CalibrationConfig()
    p.add_argument("--task", default="calibration", help="calibration (so `make analyze TASK=calibration` works)")
    p.add_argument("--name", default="", help="label of the run folder (default: the variant)")
    p.add_argument("--seed", type=int, default=0, help="seed of the --ckpt random initialisation")
    p.add_argument("--levels", default=",".join(f"{a:g}" for a in LEVELS), help="dial values a, in [0, 1]")
    p.add_argument("--dial-blocks", type=int, default=None, help="last blocks dialed (default: the last third)")
    p.add_argument("--dial-rows", default=d.rows.value, choices=[r.value for r in Rows])
    p.add_argument("--dial-mode", default=d.mode.value, choices=[m.value for m in Mode],
                   help="attention: P' = (1 - a) P + a / N; tokens: x' = (1 - a) x + a mean(x) at each block input")
    p.add_argument("--seg-task", default=d.task, help="segmentation task of the dense probes (voc, ade20k, ...)")
    p.add_argument("--img-size", type=int, default=None, help="segmentation probe input side (default: the task's)")
    for f in ("max_train", "max_val", "knn_train", "knn_val", "seeds", "bootstrap", "attn_images", "batch_size"):
        p.add_argument("--" + f.replace("_", "-"), type=int, default=getattr(d, f))
    p.add_argument("--knn-data", default="", help="classification data for the k-NN (default: the demo's with "
                   "DATA=demo, none otherwise); NAME:ROOT, e.g. imagefolder:/my/cls")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--no-tensorboard", action="store_true")
    return p


def config_from(args: argparse.Namespace) -> CalibrationConfig:
    levels = tuple(sorted({float(x) for x in str(args.levels).split(",") if x.strip()}))
    if len(levels) < 2 or not all(0.0 <= a <= 1.0 for a in levels):
        raise ValueError(f"--levels {args.levels!r}: at least two dial values in [0, 1], e.g. 0,0.5,1")
    return CalibrationConfig(levels=levels, blocks=args.dial_blocks, rows=Rows(args.dial_rows), mode=Mode(args.dial_mode),
                             task=args.seg_task,
                             img_size=args.img_size,
                             max_train=args.max_train, max_val=args.max_val, knn_train=args.knn_train,
                             knn_val=args.knn_val, seeds=max(1, args.seeds), bootstrap=args.bootstrap,
                             attn_images=args.attn_images, batch_size=args.batch_size, device=args.device)


def main(argv=None) -> dict:
    from datamodules.demo import is_demo
    from tokenmix.cli import finish_eval_args
    from backbones.load import checkpoint_path, resolve_backbone
    args = build_parser().parse_args(argv)
    ev = finish_eval_args(args, demo=is_demo(args.data), accelerator="cpu" if args.device == "cpu" else "gpu")
    b = ev.backbone
    if b.ckpt == "pixels":
        raise ValueError("--ckpt pixels: the diffusion dial needs a ViT (its attention); use a checkpoint or 'random'")
    if str(ev.launch.devices).strip() != "1" or ev.launch.num_nodes != 1:
        raise ValueError("the calibration runs in one process: leave --devices and --num-nodes at 1")
    cfg = config_from(args)
    checkpoint_path(b.ckpt, b.variant)  # a wrong CKPT fails before any data is opened
    info = resolve_backbone(b.ckpt, b.variant, b.arch, 16, seed=args.seed, which=b.which.value)
    model = info.model.eval().to(cfg.device)
    seg_dm, knn_dm = open_data(ev.data, ev.data_root, args.knn_data, cfg, model.patch_size)
    flags = {**vars(args), "data": ev.data, "variant": b.variant, "arch": b.arch}
    return run(model, info, seg_dm, knn_dm, cfg, args.name or info.run_name, flags, not args.no_tensorboard)


def run(model, info, seg_dm, knn_dm, cfg: CalibrationConfig, label: str, flags: dict, tensorboard: bool) -> dict:
    """Sweep, bands, figure and results.json in a fresh run folder; returns the results."""
    from tokenmix.results import backbone_entry
    from .output import AnalysisRun
    values, ev0 = sweep(model, seg_dm, knn_dm, cfg)
    result = summarize(values, ev0, cfg)
    blocks = dialed_blocks(model.depth, cfg.blocks)
    run_ = AnalysisRun(label, "calibration", tensorboard=tensorboard)
    try:
        run_.save_figure("calibration", figure(result, list(cfg.levels), f"{label}: diffusion dial ({cfg.mode.value}, "
                                               f"{FORMULAS[cfg.mode]}) on blocks {blocks}, {cfg.rows.value} rows; "
                                               "grey: noise band ±2 sd at a = 0"))
        for key, r in result.items():
            for a, v in zip(cfg.levels, r["values"]):
                run_.log_scalar(f"calibration/{key}", v, int(round(100 * a)))
        metrics = {"levels": list(cfg.levels), "dial": {"blocks": blocks, "rows": cfg.rows.value, "mode": cfg.mode.value,
                                                        "formula": FORMULAS[cfg.mode]},
                   "measures": result, "blind": [k for k, r in result.items() if r["blind"]],
                   "wrong_way": [k for k, r in result.items() if r["verdict"] == "wrong way"],
                   "n_images": {"seg_train": len(seg_dm.train_set), "seg_val": len(seg_dm.val_set),
                                "knn_train": 0 if knn_dm is None else len(knn_dm.train_set),
                                "knn_val": 0 if knn_dm is None else len(knn_dm.val_set)}}
        config = {**{k: v for k, v in flags.items()}, **asdict(cfg), "rows": cfg.rows.value, "mode": cfg.mode.value,
                  "default_blocks": default_blocks(model.depth)}
        out = run_.write_results(task="calibration", variant=label, data=flags.get("data", "demo"), metrics=metrics,
                                 config=config, backbone=backbone_entry(info.config, info.checkpoint, info.sha256,
                                                                        info.source))
    finally:
        run_.close()
    for key, r in result.items():
        hw = r["noise"]["half_width"]
        print(f"[calibration] {key:20s} expected {r['expected']:5s} response {r['response']:+.4g} "
              f"band ±{float('nan') if hw is None else hw:.3g}: {r['verdict']}")
    print(f"[calibration] wrote {out} and {len(run_.figures)} figure(s) in {run_.dir}")
    return json.loads(out.read_text())


if __name__ == "__main__":
    try:
        main()
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        sys.exit(error_exit(e, 2))
