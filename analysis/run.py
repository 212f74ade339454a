"""``make analyze TASK=<pib|pca|norms|attention|corloc|votes> [VARIANT=... | CKPT=...] [DATA=... DATA_ROOT=...]``.

Loads the backbone (CKPT, else the latest pretraining checkpoint of VARIANT; ``random`` = an untrained ViT),
runs one analysis (``analysis.registry``) and writes ``runs/<variant>/analysis/<task>/version_N/{*.png,
results.json}`` plus TensorBoard events in the same folder. results.json: the one schema of tokenmix/results.py.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from datamodules.demo import is_demo
from tokenmix.cli import eval_parent_parser, finish_eval_args
from tokenmix.launch import global_rank
from tokenmix.precision import device_line
from tokenmix.results import backbone_entry

from .data import default_resize, iter_samples, open_dataset
from .output import AnalysisRun
from .registry import TASKS, Analysis, get_analysis
from .shards import Options, extract_sharded, world_size


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m analysis.run", description=__doc__, parents=[eval_parent_parser()],
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
    return p


def parse_args(argv=None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    get_analysis(args.task.strip())  # an unknown task fails before anything loads
    # num_nodes > 1 without a cluster launcher is refused here, before any spawn
    finish_eval_args(args, demo=is_demo(args.data))
    if args.ckpt == "pixels":
        raise ValueError("--ckpt pixels: the analyses need a ViT (tokens, attention); use a checkpoint or 'random'")
    return args


def open_data(args, a: Analysis):
    """The dataset of the analysis: --split / --image-set / --boxes, else the analysis' defaults."""
    kw = {}
    if args.image_set:
        kw["image_set"] = args.image_set
    elif a.voc_image_set and args.data.startswith("voc"):
        kw["image_set"] = a.voc_image_set
    if args.boxes:
        kw["boxes"] = args.boxes
    return open_dataset(args.data, args.data_root, args.split or a.split, boxes=a.needs_boxes, **kw)


def options(args, model) -> Options:
    crop = args.crop or int(model.patch_embed.img_size[0])
    return Options(crop=crop, resize=args.resize or default_resize(crop), batch_size=args.batch_size,
                   num_vis=args.num_vis, fg_threshold=args.fg_threshold, lost_features=args.lost_features,
                   k_patches=args.k_patches, device=args.device,
                   pib_subset=args.pib_subset or ("single_small" if args.data == "imagenet" else "all"),
                   pib_rule=args.pib_rule, interpolation="bilinear" if args.task.strip() == "pib" else "bicubic")


def main(argv=None) -> dict:
    from probes.backbone import checkpoint_path, resolve_backbone
    args = parse_args(argv)
    a = get_analysis(args.task.strip())
    world = world_size(args)
    checkpoint_path(args.ckpt, args.variant)  # a wrong CKPT fails before the data is opened (or generated),
    dataset = open_data(args, a)  # and a wrong DATA_ROOT before a large checkpoint is read
    info = resolve_backbone(args.ckpt, args.variant, args.arch, 16, seed=args.seed, which=args.which)
    if a.check is not None:
        a.check(info.model)
    model = info.model.eval().to(args.device if world == 1 else "cpu")  # DDP: Lightning places each rank's copy
    if global_rank() == 0:
        print(f"[analysis] {device_line(args.device)}", flush=True)  # GPU + bf16 autocast, or CPU fp32
    # the run folder is named after what the checkpoint really is (a CKPT's recorded variant wins over VARIANT)
    label = args.name or info.run_name
    opts = options(args, model)
    max_images = a.max_images if args.max_images < 0 else args.max_images
    records = extract_sharded(a.extract, model, dataset, max_images, opts, args) if world > 1 else None
    if world > 1 and records is None:
        return {}  # not rank 0: it took part in the extraction; rank 0 computes and writes
    run = AnalysisRun(label, a.name, tensorboard=not args.no_tensorboard)
    try:
        numbers = (a.finish(model, records, run, opts) if records is not None
                   else a.runner(model, iter_samples(dataset, max_images), run, opts))
        config = {**vars(args), "split": args.split or a.split, "max_images": max_images, "crop": opts.crop,
                  "resize": opts.resize, "interpolation": opts.interpolation, "data_root": args.data_root or None}
        out = run.write_results(task=a.name, variant=label, data=args.data, metrics=numbers, config=config,
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
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
