"""``make analyze TASK=<pib|pca|norms|attention|corloc|votes|marker|calibration> [VARIANT=... | CKPT=...]
[DATA=... DATA_ROOT=...] [DIAL=...]``.

Loads the backbone (CKPT, else the latest pretraining checkpoint of VARIANT; ``random`` = an untrained ViT),
runs one analysis (``analysis.registry``) and writes ``runs/<variant>/analysis/<task>/version_N/{*.png,
results.json}`` plus TensorBoard events in the same folder. results.json: the one schema of tokenmix/results.py.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from typing import Any, Optional

import torch

from backbones.diffusion_dial import Mode
from datamodules.demo import is_demo
from tokenmix.cli import BackboneFlags, EvalSettings, Launch, error_exit, parse_eval
from tokenmix.launch import global_rank
from tokenmix.precision import device_line
from tokenmix.results import backbone_entry

from .calibration import DOSES, CalibrationConfig, seed_sds
from .data import default_resize, iter_samples, open_dataset
from .marker import with_head
from .output import AnalysisRun
from .registry import ANALYSES, TASKS, Analysis
from .shards import Options, extract_sharded


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m analysis.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="", help=f"one of {', '.join(TASKS)}")
    p.add_argument("--name", default="", help="label of the run folder / report row (default: the variant)")
    p.add_argument("--seed", type=int, default=0, help="seed of the --ckpt random initialisation")
    p.add_argument("--split", default="", help="dataset split (default: val; trainval for corloc)")
    p.add_argument("--image-set", default="", help="VOC only: Main (detection lists) or Segmentation")
    p.add_argument("--boxes", default="", help="ImageNet only: LOC_val_solution.csv or folder of val XMLs")
    p.add_argument("--max-images", type=int, default=-1, help="0 = all (default depends on the task)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--crop", type=int, default=0, help="eval crop (default: the backbone's image size)")
    p.add_argument("--resize", type=int, default=0, help="resize before the crop (default crop*256/224)")
    p.add_argument("--num-vis", type=int, default=8, help="images shown in the figures")
    p.add_argument("--pib-subset", default="", choices=("", "all", "single_small"),
                   help="single_small = one object with box < 25%% of the image (default for ImageNet)")
    p.add_argument("--pib-rule", default="overlap", choices=("overlap", "reference"),
                   help="box -> patches: overlap = patches sharing area with the box after torchvision's exact "
                        "resize/crop; reference = LaSt-ViT's bbox_to_patch_set (README, deviations)")
    p.add_argument("--fg-threshold", type=float, default=0.5)
    p.add_argument("--lost-features", default="k", choices=("k", "patch"))
    p.add_argument("--k-patches", type=int, default=100)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--no-tensorboard", action="store_true")
    d, g = CalibrationConfig(), p.add_argument_group("calibration (--task calibration)")
    g.add_argument("--dial", default=d.mode.value, choices=[m.value for m in Mode], help="the dial's mechanism")
    g.add_argument("--doses", default=",".join(f"{a:g}" for a in DOSES), help="dial doses a in [0, 1] (0 included)")
    g.add_argument("--dial-blocks", type=int, default=None, help="last blocks dialed (default: the last third)")
    g.add_argument("--dial-k", type=int, default=d.k, help="lazy dial: planted patches")
    g.add_argument("--seg-task", default=d.task, help="segmentation task of the dense probes (voc, ade20k, ...)")
    g.add_argument("--img-size", type=int, default=None, help="segmentation probe input side (default: the task's)")
    for f in ("max_train", "max_val", "knn_train", "knn_val", "seeds", "bootstrap", "attn_images"):
        g.add_argument("--" + f.replace("_", "-"), type=int, default=getattr(d, f))
    g.add_argument("--knn-data", default="", help="classification data for the k-NN (default: the demo's with "
                   "DATA=demo, none otherwise); NAME:ROOT, e.g. imagefolder:/my/cls")
    g.add_argument("--seed-sd", default="", help="a study's training-seed sd: its study.csv (rows whose column is a "
                   "measure key: mean std over variants), KEY=SD[,KEY=SD], or one number for every %% measure")
    return p


@dataclass(frozen=True)
class AnalysisConfig:
    """Everything one ``make analyze`` reads, typed and resolved once from the flags (``make_config``)."""
    analysis: Analysis
    backbone: BackboneFlags
    seed: int
    data: str
    data_root: str
    split: str                  # --split, else the analysis' own
    dataset_kw: dict[str, str]  # image_set / boxes of the dataset (open_dataset)
    max_images: int             # 0 = all
    name: str                   # --name: the run folder / report row ('' = the backbone's run name)
    launch: Launch              # --device's accelerator x --devices x --num-nodes
    tensorboard: bool
    options: Options            # crop / resize 0: the backbone's (``options``)
    record: dict[str, Any]      # the resolved flags, as results.json's config records them
    calibration: Optional[CalibrationConfig] = None  # --task calibration's doses, dial and probes


def calibration_config(f: argparse.Namespace) -> CalibrationConfig:
    """--task calibration's doses, dial and probes (``analysis.calibration``), typed like the other analyses' flags."""
    doses = tuple(sorted({float(x) for x in str(f.doses).split(",") if x.strip()} | {0.0}))
    if len(doses) < 2 or not all(0.0 <= a <= 1.0 for a in doses):
        raise ValueError(f"--doses {f.doses!r}: dial doses in [0, 1], e.g. 0,0.05,0.1,0.2")
    return CalibrationConfig(doses, f.dial_blocks, Mode(f.dial), f.dial_k, f.seg_task, f.img_size, f.max_train,
                             f.max_val, f.knn_train, f.knn_val, f.knn_data, max(1, f.seeds), f.bootstrap,
                             f.attn_images, f.batch_size, f.device, seed_sds(f.seed_sd))


def dataset_kw(f: argparse.Namespace, a: Analysis, data: str) -> dict[str, str]:
    """--image-set / --boxes, else the analysis' VOC image set."""
    kw = {}
    if f.image_set:
        kw["image_set"] = f.image_set
    elif a.voc_image_set and data.startswith("voc"):
        kw["image_set"] = a.voc_image_set
    if f.boxes:
        kw["boxes"] = f.boxes
    return kw


def make_config(f: argparse.Namespace, ev: EvalSettings) -> AnalysisConfig:
    """The run's config from the parsed flags and the typed shared ones (``ev``: a multi-node run without a cluster
    launcher was refused there, before any spawn); an unknown task fails before anything loads."""
    a = ANALYSES.get(f.task.strip())
    if a is None:
        raise SystemExit(f"unknown or missing --task '{f.task.strip()}'. Valid tasks: {', '.join(TASKS)} "
                         "(e.g. make analyze TASK=pib VARIANT=entmax)")
    b = ev.backbone
    if b.ckpt == "pixels":
        raise ValueError("--ckpt pixels: the analyses need a ViT (tokens, attention); use a checkpoint or 'random'")
    if a.dense is not None and (str(ev.launch.devices).strip() != "1" or ev.launch.num_nodes != 1):
        raise ValueError(f"--task {a.name} runs in one process: leave --devices and --num-nodes at 1")
    opts = Options(crop=f.crop, resize=f.resize, batch_size=f.batch_size, num_vis=f.num_vis,
                   fg_threshold=f.fg_threshold, lost_features=f.lost_features, k_patches=f.k_patches, device=f.device,
                   pib_subset=f.pib_subset or ("single_small" if ev.data == "imagenet" else "all"),
                   pib_rule=f.pib_rule, interpolation="bilinear" if a.name == "pib" else "bicubic")
    record = {**vars(f), "variant": b.variant, "ckpt": b.ckpt, "data": ev.data, "arch": b.arch,
              "num_nodes": ev.launch.num_nodes}
    return AnalysisConfig(a, b, f.seed, ev.data, ev.data_root,
                          f.split or a.split, dataset_kw(f, a, ev.data),
                          a.max_images if f.max_images < 0 else f.max_images, f.name, ev.launch,
                          not f.no_tensorboard, opts, record, calibration_config(f) if a.dense is not None else None)


def parse_args(argv=None) -> AnalysisConfig:
    """The command line -> the run's ``AnalysisConfig``: parsed once, the shared flags typed in the same trip."""
    return make_config(*parse_eval(build_parser(), argv, is_demo))


def options(opts: Options, model) -> Options:
    """``opts`` with crop / resize 0 resolved: the backbone's image size, and crop * 256/224."""
    crop = opts.crop or int(model.patch_embed.img_size[0])
    return dataclasses.replace(opts, crop=crop, resize=opts.resize or default_resize(crop))


def main(argv=None) -> dict:
    from probes.core.trainer import lightning_console
    cfg = parse_args(argv)
    with lightning_console():  # Lightning's banner once, no advertisements
        return run(cfg)


def run(cfg: AnalysisConfig) -> dict:
    """One analysis of ``cfg``: results.json, figures and TensorBoard events in a fresh version folder."""
    from backbones.load import resolve_backbone
    a, b = cfg.analysis, cfg.backbone
    world = cfg.launch.world
    # the backbone in one call, before the data: a wrong CKPT fails before the data is opened (or generated)
    info = resolve_backbone(b.ckpt, b.variant, b.arch, 16, seed=cfg.seed, which=b.which.value)
    dataset = None if a.dense else open_dataset(cfg.data, cfg.data_root, cfg.split, boxes=a.needs_boxes,
                                                **cfg.dataset_kw)
    if a.check is not None:
        a.check(info.model)
    device = cfg.options.device
    model = with_head(info, b.which.value) if a.classifier else info.model
    model = model.eval().to(device if world == 1 else "cpu")  # DDP: Lightning places each rank's copy
    if global_rank() == 0:
        print(f"[analysis] {device_line(device)}", flush=True)  # GPU + bf16 autocast, or CPU fp32
    # the run folder is named after what the checkpoint really is (a CKPT's recorded variant wins over VARIANT)
    label = cfg.name or info.run_name
    opts = options(cfg.options, model)
    records = extract_sharded(a.extract, model, dataset, cfg.max_images, opts, cfg.launch) if world > 1 else None
    if world > 1 and records is None:
        return {}  # not rank 0: it took part in the extraction; rank 0 computes and writes
    run = AnalysisRun(label, a.name, tensorboard=cfg.tensorboard)
    try:
        numbers = (a.dense(model, cfg, run) if a.dense else a.finish(model, records, run, opts) if records is not None
                   else a.runner(model, iter_samples(dataset, cfg.max_images), run, opts))
        config = {**cfg.record, "split": cfg.split, "max_images": cfg.max_images, "crop": opts.crop,
                  "resize": opts.resize, "interpolation": opts.interpolation, "data_root": cfg.data_root or None}
        out = run.write_results(task=a.name, variant=label, data=cfg.data, metrics=numbers, config=config,
                                backbone=backbone_entry(info.config, info.checkpoint, info.sha256, info.source))
    finally:
        run.close()
    print(f"[analysis] {a.name} for {label}: {a.headline(numbers)}")
    print(f"[analysis] wrote {out} and {len(run.figures)} figure(s) in {run.dir} (TensorBoard: make tensorboard)")
    return json.loads(out.read_text())


if __name__ == "__main__":
    from tokenmix.launch import install_stop_handlers
    install_stop_handlers()  # SIGTERM / SIGINT end every rank within seconds (tokenmix/launch.py)
    try:
        main()
    except (FileNotFoundError, ValueError, RuntimeError) as e:  # LaunchError is a ValueError
        sys.exit(error_exit(e, 2))
