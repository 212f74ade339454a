"""``make analyze TASK=calibration DIAL=<semantic|lazy|tokens> [VARIANT=... | CKPT=...]``: what each dense measure
can detect, in its own units, at a known dose of each paper's mechanism.

The diffusion dial (``backbones.diffusion_dial``: ``semantic`` = the entmax paper's semantic diffusion, ``lazy`` =
LaSt-ViT's lazy aggregation, ``tokens`` = a deletion) is set to each dose ``a`` in ``--doses`` (default 0, 0.02,
0.05, 0.1, 0.2, 0.4) on a fixed backbone, and every dense measure of the registry (``tokenmix.dense_measures``) is
evaluated on the same images (``analysis.calibration_measures``). Per measure and dose: Δ(a) = value(a) - value(0)
with a 95 % paired bootstrap interval over images (and probe seeds where the probe draws; widened by a study's
training-seed sd with ``--seed-sd``; ``tokenmix.noise``). Then:

- the *smallest detectable dose* a*: the smallest a whose interval excludes 0 on the expected side, the change
  Δ(a*) there, and the *detectable change*: the interval's half-width at a* (a smaller change would stay inside),
  at the evaluated image count and at a full validation set (VOC val, 1,449 images; ImageNet val, 50,000, for
  the k-NN: se ∝ 1/√n);
- beside it the papers' effect (``PAPER_EFFECTS``): a measure whose detectable change exceeds it is labelled
  "cannot see the papers' effect at this size"; one that never detects, "not detected";
- doses where the interval excludes 0 on the wrong side, and whether the values are monotone in a (either way);
- a measure that cannot respond (exact zeros when the undosed backbone has none, as softmax) is "not applicable";
- the dial's manipulation check at each dose (``Dial.check``).

Writes ``runs/<variant>/analysis/calibration/version_N/``: ``results.json`` (``metrics.measures.<key>``),
``calibration.png`` (Δ(a) with its intervals, the papers' effect dashed) and TensorBoard scalars.
"""
from __future__ import annotations

import csv
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import torch

from backbones.diffusion_dial import LAZY_K, Mode, dialed_blocks, diffusion_dial
from tokenmix.dense_measures import BY_KEY
from tokenmix.noise import PairedDelta, paired_bootstrap, seed_delta
from tokenmix.stats import PAPER_EFFECTS

from .calibration_measures import (Evaluation, ProbeSettings, images_of, keys_of, knn_evaluation, seeds_of,
                                   seg_evaluation, value)

DOSES = (0.0, 0.02, 0.05, 0.1, 0.2, 0.4)
# the full validation sets the detectable change is scaled to: VOC 2012 val (segmentation images), ImageNet val (k-NN)
FULL_VAL = {"val": 1449, "attn": 1449, "knn": 50000}
BLIND = "cannot see the papers' effect at this size"


@dataclass(frozen=True)
class CalibrationConfig:
    doses: tuple[float, ...] = DOSES
    blocks: Optional[int] = None   # dialed last blocks (None: the last third)
    mode: Mode = Mode.SEMANTIC
    k: int = LAZY_K                # lazy dial: planted patches
    task: str = "voc"              # segmentation task of the dense probes
    img_size: Optional[int] = None  # probe input side (None: the task's, e.g. 128 on the demo VOC)
    max_train: int = 300           # evenly spaced images of each split (the demo VOC has 300 / 100)
    max_val: int = 100
    knn_train: int = 2000          # classification images for the [CLS] k-NN (0: no k-NN)
    knn_val: int = 800
    knn_data: str = ""
    seeds: int = 5
    bootstrap: int = 200
    attn_images: int = 32
    batch_size: int = 16
    device: str = "cpu"
    seed_sd: dict = field(default_factory=dict)  # measure key -> a study's training-seed sd


def delta(evs: dict[float, Evaluation], a: float, key: str, cfg: CalibrationConfig) -> PairedDelta:
    """Δ(a) of ``key`` against a = 0 on the same images (``tokenmix.noise``)."""
    e0, ea, sd = evs[0.0], evs[a], cfg.seed_sd.get(key)
    n, S = images_of(e0, key), seeds_of(e0, key)
    if n == 0:
        return seed_delta([value(ea, key, None, s) for s in range(S)], [value(e0, key, None, s) for s in range(S)], sd)
    return paired_bootstrap(n, lambda i, s: value(ea, key, i, s), lambda i, s: value(e0, key, i, s), S,
                            cfg.bootstrap, seed_sd=sd)


def response(evs: dict[float, Evaluation], key: str, cfg: CalibrationConfig) -> dict:
    """One measure's dose-response (module docstring)."""
    m, doses = BY_KEY[key], [a for a in cfg.doses if a > 0]
    direction = m.direction.value
    values = [sum(value(evs[a], key, None, s) for s in range(seeds_of(evs[a], key))) / seeds_of(evs[a], key)
              for a in cfg.doses]
    deltas = {a: delta(evs, a, key, cfg) for a in doses}
    star = next((a for a in doses if deltas[a].detected(direction)), None)
    at = deltas[star if star is not None else doses[-1]]
    n = images_of(evs[0.0], key)
    full = at.half_width_at(FULL_VAL[m.images]) if n else at.half_width
    paper = PAPER_EFFECTS.get(m.paper) if m.paper else None
    applicable = not (key == "diffusion_attn_zero_share" and values[0] == 0.0)  # no exact zeros to lose (softmax)
    steps = [b - a for a, b in zip(values, values[1:])]
    blind = paper is not None and at.half_width is not None and at.half_width > abs(paper)
    flag = ("not applicable: no exact zeros at a = 0" if not applicable else
            "not detected" + (f"; {BLIND}" if blind else "") if star is None else BLIND if blind else "")
    return {"label": m.label, "unit": m.unit, "expected": direction, "paper_measure": m.paper, "paper_effect": paper,
            "values": values, "deltas": [{"a": a, **deltas[a].as_dict()} for a in doses],
            "smallest_dose": star, "change_at": None if star is None else at.delta, "detectable_change": at.half_width,
            "detectable_change_full": full, "n_images": n, "n_full": FULL_VAL[m.images],
            "seeds": seeds_of(evs[0.0], key),
            "sees_papers_effect": None if paper is None or at.half_width is None else at.half_width <= abs(paper),
            "sees_papers_effect_full": None if paper is None or full is None else full <= abs(paper),
            "flag": flag, "applicable": applicable, "wrong_way_at": [a for a in doses if deltas[a].against(direction)],
            "monotone": all(d >= 0 for d in steps) or all(d <= 0 for d in steps),
            "noise": one_evaluation_noise(evs[0.0], key, cfg)}


def one_evaluation_noise(ev: Evaluation, key: str, cfg: CalibrationConfig) -> dict:
    """The spread of one evaluation at a = 0 (bootstrap over images / probe seeds): the band a drop between two
    checkpoints of one run must exceed (``analysis.training_curves``)."""
    n, S = images_of(ev, key), seeds_of(ev, key)
    d = (paired_bootstrap(n, lambda i, s: value(ev, key, i, s), lambda i, s: 0.0, S, cfg.bootstrap) if n else
         seed_delta([value(ev, key, None, s) for s in range(S)], [0.0] * S))
    return {"sd": d.se, "half_width": d.half_width, "replicates": d.replicates}


def sweep(model, seg_dm, knn_dm, cfg: CalibrationConfig, log=print) -> tuple[dict, list]:
    """The evaluation at every dose (``{a: Evaluation}``) and the dial's manipulation check at each."""
    idx = dialed_blocks(model.depth, cfg.blocks)
    s = ProbeSettings(seg_dm.num_classes, seeds=cfg.seeds, attn_images=cfg.attn_images, batch_size=cfg.batch_size,
                      device=cfg.device)
    evs, checks = {}, []
    for a in cfg.doses:
        t0 = time.perf_counter()
        with torch.no_grad(), diffusion_dial(model, a, blocks=len(idx), mode=cfg.mode, k=cfg.k) as dial:
            evs[a] = seg_evaluation(model, seg_dm, s)
            if knn_dm is not None:
                evs[a].knn_correct = knn_evaluation(model, knn_dm, s)
        checks.append(dial.check())
        log(f"[calibration] a = {a:g}: check {checks[-1]['without']:.4g} -> {checks[-1]['with']:.4g} "
            f"({time.perf_counter() - t0:.1f} s)")
    return evs, checks


def figure(result: dict, title: str):
    """One panel per measure: Δ(a) with its 95 % paired intervals, 0 and the papers' effect (dashed, signed as the
    dial pushes), a* marked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    items = list(result.items())
    cols = 4
    fig, axes = plt.subplots((len(items) + cols - 1) // cols, cols, figsize=(3.6 * cols, 2.9 * ((len(items) + 3) // 4)),
                             squeeze=False)
    for ax, (key, r) in zip(axes.flat, items):
        a = [d["a"] for d in r["deltas"]]
        y = [d["delta"] for d in r["deltas"]]
        err = [0.0 if d["half_width"] is None else d["half_width"] for d in r["deltas"]]
        ax.errorbar(a, y, yerr=err, fmt="o-", color="tab:blue", capsize=3)
        ax.axhline(0.0, color="k", lw=0.6)
        if r["paper_effect"] is not None and r["expected"] != "none":
            ax.axhline(abs(r["paper_effect"]) * (1 if r["expected"] == "up" else -1), color="tab:red", ls="--", lw=1)
        if r["smallest_dose"] is not None:
            ax.axvline(r["smallest_dose"], color="tab:green", ls=":", lw=1)
        star = "none" if r["smallest_dose"] is None else f"{r['smallest_dose']:g}"
        note = f" ({r['flag']})" if r["flag"] else ""
        ax.set_title(f"{r['label']} ({r['unit']}), expected {r['expected']}\na* = {star}{note}", fontsize=7)
        ax.set_xlim(0, 1.05 * max(a))
        ax.set_xlabel("dose a", fontsize=7)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(items):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    return fig


def _cell(r: Optional[dict]) -> str:
    if r is None:
        return "not run"
    if not r["applicable"] or r["smallest_dose"] is None:
        return r["flag"]
    return f"a* {r['smallest_dose']:g}: {r['change_at']:+.3g} (±{r['detectable_change']:.2g})" + (
        f" **{r['flag']}**" if r["flag"] else "")


def calibration_section(found) -> list[str]:
    """``make report``'s calibration table: the newest calibration per (variant, data, dial), each measure's
    smallest detectable dose, its change there ± the detectable change (``analysis.report.Found`` rows)."""
    newest = {}
    for f in found:
        key = (f.variant, f.data, f.payload["metrics"].get("dial", {}).get("mode", ""))
        if f.task == "calibration" and f.created >= newest.get(key, f).created:
            newest[key] = f
    if not newest:
        return []
    keys = list(BY_KEY)
    lines = ["", "## Calibration (diffusion dial)", "",
             "Each measure's smallest detectable dose a* of the dial (`make analyze TASK=calibration DIAL=...`), its "
             "change there ± the interval's half-width (the smallest change the run can detect); **bold**: larger "
             "than the papers' effect (docs/calibration.md).", "",
             "| variant | data | dial | " + " | ".join(BY_KEY[k].label for k in keys) + " |",
             "|---|---|---|" + "---|" * len(keys)]
    for (variant, data, mode), f in sorted(newest.items()):
        ms = f.payload["metrics"].get("measures", {})
        lines.append(f"| {variant} | {data} | {mode} | " + " | ".join(_cell(ms.get(k)) for k in keys) + " |")
    return lines


# --------------------------------------------------------------------------- data

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


def open_data(data: str, data_root: str, cfg: CalibrationConfig, patch_size: int):
    """(segmentation DataModule, classification DataModule or None) of the sweep."""
    from datamodules.demo import is_demo
    seg = _datamodule(cfg.task, data, data_root, patch_size, cfg.batch_size, cfg.max_train, cfg.max_val,
                      cfg.img_size)
    if not cfg.knn_train or not (cfg.knn_data or is_demo(data)):
        return seg, None
    name, _, root = (cfg.knn_data or "demo:").partition(":")
    if not is_demo(name) and not root:
        raise ValueError(f"--knn-data {cfg.knn_data!r}: expected NAME:ROOT (e.g. imagefolder:/my/cls) or demo")
    return seg, _datamodule("knn", name, root if not is_demo(name) else (data_root if is_demo(data) else ""),
                            patch_size, cfg.batch_size, cfg.knn_train, cfg.knn_val)


def seed_sds(spec: str) -> dict:
    """--seed-sd -> {measure key: sd}."""
    spec = spec.strip()
    if not spec:
        return {}
    if Path(spec).is_file():
        rows = [r for r in csv.DictReader(Path(spec).open()) if r.get("kind") == "measured" and r.get("std")
                and r.get("column") in BY_KEY]
        by = {}
        for r in rows:
            by.setdefault(r["column"], []).append(float(r["std"]))
        return {k: sum(v) / len(v) for k, v in by.items()}
    try:
        if "=" not in spec:
            return {k: float(spec) for k, m in BY_KEY.items() if m.unit == "%"}
        return {k.strip(): float(v) for k, v in (kv.split("=") for kv in spec.split(","))}
    except ValueError:
        raise ValueError(f"--seed-sd {spec!r}: a study CSV, KEY=SD[,KEY=SD] or a number") from None


def run(model, cfg, run_) -> dict:
    """``analysis.run``'s calibration stage: sweep, responses, figure and TensorBoard scalars; returns the
    metrics. ``cfg``: the run's ``AnalysisConfig`` (its ``calibration`` part)."""
    c: CalibrationConfig = cfg.calibration
    seg_dm, knn_dm = open_data(cfg.data, cfg.data_root, c, model.patch_size)
    evs, checks = sweep(model, seg_dm, knn_dm, c)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # thousands of small eigen / matching calls: on a busy 2-core host a 128² eigvalsh
    try:                      # takes 3 ms on one thread, 1.6 s on the default pool
        result = {k: response(evs, k, c) for k in keys_of(evs[0.0])}
    finally:
        torch.set_num_threads(threads)
    blocks = dialed_blocks(model.depth, c.blocks)
    run_.save_figure("calibration", figure(result, f"{c.mode.value} dial on blocks {blocks}: Δ(a) vs a = 0, 95 % "
                                           "paired intervals; red dashed: the papers' effect; green: a*"))
    for key, r in result.items():
        for d in r["deltas"]:
            run_.log_scalar(f"calibration/{key}", d["delta"], int(round(1000 * d["a"])))
        g = lambda x: "-" if x is None else f"{x:.3g}"  # noqa: E731
        print(f"[calibration] {key:28s} a* {g(r['smallest_dose'])}, Δ {g(r['change_at'])}, detectable "
              f"{g(r['detectable_change'])} ({r['n_images']} images) / {g(r['detectable_change_full'])} "
              f"({r['n_full']}); "
              f"paper {g(r['paper_effect'])} {r['flag']}")
    return {"doses": list(c.doses), "dial": {"mode": c.mode.value, "blocks": blocks, "k": c.k, "checks": checks},
            "measures": result, "smallest_doses": {k: r["smallest_dose"] for k, r in result.items()},
            "full_validation_images": FULL_VAL, "config": {**asdict(c), "mode": c.mode.value},
            "n_images": {"seg_train": len(seg_dm.train_set), "seg_val": len(seg_dm.val_set),
                         "knn_train": 0 if knn_dm is None else len(knn_dm.train_set),
                         "knn_val": 0 if knn_dm is None else len(knn_dm.val_set)}}
