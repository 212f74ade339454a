"""``make analyze TASK=<pib|pca|norms|attention|corloc|votes> [VARIANT=... | CKPT=...] [DATA=... DATA_ROOT=...]``.

Loads the backbone (CKPT, else the latest pretraining checkpoint of VARIANT), runs one analysis and writes
``runs/<variant>/analysis/<task>/version_N/{*.png, results.json}`` plus TensorBoard events in the same folder.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import sys
from pathlib import Path

import torch

from tokenmix import paths

from .data import default_resize, iter_samples, open_dataset
from .output import AnalysisRun
from .shards import extract_sharded, resolve_world
from .tasks import RUNNERS, STAGES, TASKS, Options
from .votes import check_votes, run_votes

RUNNERS, TASKS = {**RUNNERS, "votes": run_votes}, (*TASKS, "votes")  # LaSt-ViT vote maps (analysis/votes.py)

# how many images each task uses by default: the protocols use every image with a box (pib, corloc); the
# descriptive analyses only need a sample
DEFAULT_MAX_IMAGES = {"pib": 0, "corloc": 0, "pca": 16, "norms": 64, "attention": 32, "votes": 0}
DEFAULT_SPLIT = {"pib": "val", "corloc": "trainval", "pca": "val", "norms": "val", "attention": "val", "votes": "val"}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m analysis.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="", help=f"one of {', '.join(TASKS)}")
    p.add_argument("--variant", default="", help="variant whose latest pretraining checkpoint to use (no --ckpt)")
    p.add_argument("--ckpt", default="", help="checkpoint path (tokenmix .ckpt, DINO file); 'random' = random init")
    p.add_argument("--arch", default="vit_demo_patch8", help="architecture for --ckpt random")
    p.add_argument("--name", default="", help="label of the run folder / report row (default: the variant)")
    p.add_argument("--which", default="teacher", choices=("teacher", "student"))
    p.add_argument("--data", default="demo", help="demo | voc | imagenet | any datamodules dataset name")
    p.add_argument("--data-root", default="")
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
    p.add_argument("--fg-threshold", type=float, default=0.5)
    p.add_argument("--lost-features", default="k", choices=("k", "patch"))
    p.add_argument("--k-patches", type=int, default=100)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--no-tensorboard", action="store_true")
    p.add_argument("--devices", default="1", help="processes per node (Lightning DDP; 'auto' = every GPU): the "
                   "backbone forward is sharded over them and gathered, rank 0 computes the metrics and writes")
    p.add_argument("--num-nodes", type=int, default=None, help="default: from SLURM / torchrun, else 1")
    p.add_argument("--dist-timeout", type=float, default=10.0, help="minutes DDP waits for the other processes")
    return p.parse_args(argv)


def load_backbone(args) -> tuple[torch.nn.Module, dict]:
    import backbones

    if args.ckpt == "random":
        model = backbones.create_vit(args.arch, args.variant or "softmax", seed=0)
        return model, {"ckpt": "random", "ckpt_sha256": None}
    if args.ckpt:
        path = Path(args.ckpt)
        if not path.is_file():
            raise FileNotFoundError(f"checkpoint {path} does not exist. Pass CKPT=<path to a .ckpt/.pth>, or "
                                    "VARIANT=<v> to use the latest `make pretrain VARIANT=<v>` run.")
    else:
        path = paths.latest_pretrain_checkpoint(args.variant or "softmax")
    model = backbones.backbone_from_checkpoint(path, which=args.which)
    return model, {"ckpt": str(path), "ckpt_sha256": sha256(path)}


def main(argv=None) -> dict:
    args = parse_args(argv)
    task = args.task.strip()
    if task not in RUNNERS:
        raise SystemExit(f"unknown or missing --task '{task}'. Valid tasks: {', '.join(TASKS)} "
                         "(e.g. make analyze TASK=pib VARIANT=entmax)")
    world = resolve_world(args)  # num_nodes > 1 without a cluster launcher is refused here, before any spawn
    model, ck = load_backbone(args)
    if task == "votes":
        check_votes(model)
    model.eval().to(args.device if world == 1 else "cpu")  # several processes: Lightning places each rank's copy
    # the run folder is named after what the checkpoint really is (a CKPT's recorded variant wins over VARIANT)
    label = args.name or (model.variant if args.ckpt != "random" else f"{model.variant}_random")
    crop = args.crop or int(model.patch_embed.img_size[0])
    opts = Options(crop=crop, resize=args.resize or default_resize(crop), batch_size=args.batch_size,
                   num_vis=args.num_vis, fg_threshold=args.fg_threshold, lost_features=args.lost_features,
                   k_patches=args.k_patches, device=args.device,
                   pib_subset=args.pib_subset or ("single_small" if args.data == "imagenet" else "all"))
    split = args.split or DEFAULT_SPLIT[task]
    kw = {}
    if args.image_set:
        kw["image_set"] = args.image_set
    elif task == "corloc" and args.data.startswith("voc"):
        kw["image_set"] = "Main"  # LOST protocol: VOC detection trainval lists, not the segmentation subset
    if args.boxes:
        kw["boxes"] = args.boxes
    need_boxes = task in ("pib", "corloc", "votes")
    dataset = open_dataset(args.data, args.data_root, split, boxes=need_boxes, **kw)
    max_images = DEFAULT_MAX_IMAGES[task] if args.max_images < 0 else args.max_images
    records = extract_sharded(STAGES[task][0], model, dataset, max_images, opts, args) if world > 1 else None
    if world > 1 and records is None:
        return {}  # not rank 0: it took part in the extraction; rank 0 computes and writes
    run = AnalysisRun(label, task, tensorboard=not args.no_tensorboard)
    try:
        numbers = (STAGES[task][1](model, records, run, opts) if records is not None
                   else RUNNERS[task](model, iter_samples(dataset, max_images), run, opts))
        results = {
            "task": task, "variant": label, "model": dict(model.config), **ck,
            "data": args.data or "demo", "data_root": args.data_root or None, "split": split,
            "crop": opts.crop, "resize": opts.resize,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "metrics": numbers,
        }
        out = run.write_results(results)
    finally:
        run.close()
    print(f"[analysis] {task} for {label}: {_headline(task, numbers)}")
    print(f"[analysis] wrote {out} and {len(run.figures)} figure(s) in {run.dir} (TensorBoard: make tensorboard)")
    return results


def _headline(task: str, m: dict) -> str:
    key = {"pib": "pib", "corloc": "corloc", "norms": "high_norm_share", "attention": "zero_share",
           "pca": "explained_variance_ratio", "votes": "share_of_votes_in_box"}[task]
    extra = f", pib_aggregated = {m['pib_aggregated']}" if m.get("pib_aggregated") is not None else ""
    return f"{key} = {m.get(key)}{extra} over {m.get('n_images')} images"


if __name__ == "__main__":
    try:
        main()
    except (FileNotFoundError, ValueError, RuntimeError) as e:  # LaunchError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
