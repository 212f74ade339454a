"""``make probe TASK=...``: one probe on one frozen backbone, results.json + TensorBoard in a fresh folder.

    python -m probes.run --task voc --variant entmax --ckpt '' --data demo --data-root '' --layer ''
    python -m probes.run --task knn --ckpt random      # baselines: random (untrained ViT), pixels (raw patches)
    python -m probes.run --task nyuv2 --layer all      # one probe per block
    python -m probes.run --task voc --kind retrieval    # head-free: Hummingbird retrieval (or --kind overcluster)

Output: runs/<variant | variant_random | pixels>/probe/<task>/version_N/{results.json, events.*, head*.pt};
results.json follows the one schema of tokenmix/results.py. How each kind of probe runs: probes/kinds.py.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional


from datamodules.demo import is_demo
from tokenmix import paths
from tokenmix.cli import eval_parent_parser, finish_eval_args
from tokenmix.io import CheckpointError
from tokenmix.knn import DEFAULT_KS
from tokenmix.launch import LaunchError, count_devices, global_rank, install_stop_handlers
from tokenmix.precision import device_line
from tokenmix.results import backbone_entry, write_results

from .backbone import checkpoint_path, resolve_backbone
from .data import probe_datamodule, resolve_data
from .kinds import KINDS, ProbeContext, summary
from .kinds import _device as kind_device
from .retrieval import K_NEIGHBOURS, PAPER_MEMORY, TEMPERATURE
from .tasks import ALT_KINDS, TASKS, Kind, get_task


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m probes.run", description=__doc__, parents=[eval_parent_parser()],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", required=True, help=f"one of: {', '.join(TASKS)}")
    p.add_argument("--kind", default="", help="'' = the task's own probe; segmentation tasks also take 'retrieval' "
                   "(Hummingbird dense retrieval) and 'overcluster' (k-means + matching), neither trains a head")
    p.add_argument("--config", default=None, help="YAML of defaults (configs/probe/*.yaml): top-level flags for "
                   "every task, 'tasks: {<task>: {...}}' per task; command-line flags win")
    p.add_argument("--layer", default="", help="'' = the protocol's blocks, k = block k, 'all' = every block, "
                   "'0,3' = a list")
    p.add_argument("--max-epochs", type=int, default=None, help="default: imagenet 100, dense probes 40")
    p.add_argument("--batch-size", type=int, default=None, help="default: 256 imagenet, 16 dense, 64 k-NN")
    p.add_argument("--lr", type=float, default=None, help="default: the protocol's")
    p.add_argument("--img-size", default=None, help="probe input size 'S' or 'H,W' (default: per task, see docs)")
    p.add_argument("--patch-size", type=int, default=None,
                   help="patch size of --ckpt pixels (default: demo 8, else 16)")
    p.add_argument("--head", choices=("linear", "linear4"), default="linear",
                   help="segmentation: last block (linear) or last 4 blocks (linear4)")
    p.add_argument("--cls", dest="with_cls", action="store_true", default=None,
                   help="concatenate [CLS] to the patch tokens (default: on for depth, off for segmentation)")
    p.add_argument("--no-cls", dest="with_cls", action="store_false")
    p.add_argument("--depth-head", choices=("bins", "regression"), default="bins")
    p.add_argument("--bin-norm", choices=("linear", "softmax"), default="linear",
                   help="bins -> probabilities: DINOv2's 'linear' (relu + 0.1, normalise) or softmax")
    p.add_argument("--solver", choices=("sgd", "ridge"), default="sgd",
                   help="segmentation: the trained BN + linear head (sgd, the protocol) or the closed-form ridge probe "
                   "of the pretraining's DenseProbeCheck (probes/ridge.py)")
    p.add_argument("--ridge-lambda", type=float, default=1e-2, help="--solver ridge: penalty (x number of patches)")
    p.add_argument("--no-cache", action="store_true", help="recompute frozen features every epoch")
    p.add_argument("--cache-fp16", action="store_true", help="store cached features as float16 (half the memory)")
    p.add_argument("--no-aug", action="store_true", help="imagenet: no RandomResizedCrop/flip (features cached)")
    p.add_argument("--train-split", default="train")
    p.add_argument("--val-split", default=None, help="default: val (depth datasets: test)")
    p.add_argument("--max-samples", type=int, default=None, help="use the first N samples of each split")
    p.add_argument("--knn-k", default=",".join(map(str, DEFAULT_KS)), help="k-NN: comma-separated k values")
    p.add_argument("--knn-t", type=float, default=0.07, help="k-NN temperature")
    p.add_argument("--hb-memory", default=",".join(map(str, PAPER_MEMORY)),
                   help="retrieval: memory sizes in patches (each capped at every patch of every view)")
    p.add_argument("--hb-k", type=int, default=K_NEIGHBOURS, help="retrieval: nearest neighbours per patch")
    p.add_argument("--hb-temperature", type=float, default=TEMPERATURE, help="retrieval: attention temperature")
    p.add_argument("--hb-aug-epochs", type=int, default=1, help="retrieval: augmented views of each training image")
    p.add_argument("--cluster-k", default="1x,2x,5x,10x",
                   help="overcluster: K values, 'Nx' = N x the number of classes (e.g. '1x,100,300')")
    p.add_argument("--cluster-iters", type=int, default=100, help="overcluster: at most this many k-means iterations")
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--accelerator", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs-dir", default=None, help="default: tokenmix.paths.RUNS (runs/)")
    p.add_argument("--quick", action="store_true", help="smoke test: 2 epochs, at most 16 samples per split")
    p.add_argument("--progress", action="store_true", help="show the Lightning progress bar")
    p.add_argument("--print-config", "--print_config", action="store_true",
                   help="print the resolved settings (config file + flags) as YAML and exit")
    return p


def parse_layers(layer: str, depth: int) -> list[Optional[list[int]]]:
    """'' -> [None] (protocol default); 'all' -> [[0], ..., [depth-1]]; 'k' / 'a,b' -> one probe per block."""
    layer = (layer or "").strip()
    if not layer:
        return [None]
    if layer == "all":
        return [[b] for b in range(depth)]
    try:
        blocks = [int(x) for x in layer.split(",")]
    except ValueError:
        raise ValueError(f"--layer {layer!r}: expected '', 'all', a block index or a comma-separated list") from None
    bad = [b for b in blocks if not -depth <= b < depth]
    if bad:
        raise ValueError(f"--layer {layer!r}: block {bad} out of range for a {depth}-block backbone (0..{depth - 1})")
    return [[b % depth] for b in blocks]


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.config:
        import yaml
        path = Path(args.config)
        if not path.is_file():
            raise FileNotFoundError(f"--config {path}: no such file (see configs/probe/)")
        cfg = yaml.safe_load(path.read_text()) or {}
        per_task = (cfg.pop("tasks", None) or {}).get(args.task.strip(), {}) or {}
        defaults = {k.replace("-", "_"): v for k, v in {**cfg, **per_task}.items()}
        known = {a.dest for a in parser._actions}
        unknown = sorted(set(defaults) - known)
        if unknown:
            raise ValueError(f"--config {path}: unknown keys {unknown}; valid: {sorted(known - {'help'})}")
        parser.set_defaults(**defaults)
        args = parser.parse_args(argv)  # command-line flags override the file
    return args


def resolve_kind(task, kind: str) -> Optional[Kind]:
    """--kind: '' or the task's own kind -> None; a head-free kind the task's data feeds (tasks.ALT_KINDS)."""
    kind = (kind or "").strip()
    if not kind or kind == task.kind.value:
        return None
    alts = ALT_KINDS.get(task.kind, ())
    if kind not in [k.value for k in alts]:
        ok = ", ".join(k.value for k in alts) or "none besides its own"
        raise ValueError(f"--kind {kind!r} does not apply to task {task.name!r} ({task.kind.value}); kinds it takes: "
                         f"{ok}. Retrieval and overclustering run on the segmentation tasks (voc, ade20k, "
                         "cityscapes, seg)")
    return Kind(kind)


def run_name(ctx: ProbeContext) -> str:
    """The task's folder and results.json name: voc, or voc_retrieval for a head-free kind on it."""
    return ctx.task.name if ctx.kind is None else f"{ctx.task.name}_{ctx.kind.value}"


def build_context(args) -> ProbeContext:
    """The backbone, the task's DataModule (both splits, subset by --max-samples) and the probe input size."""
    task = get_task(args.task.strip())
    kind = resolve_kind(task, args.kind)
    demo = is_demo(args.data)
    checkpoint_path(args.ckpt, args.variant)  # a wrong CKPT fails before the data is opened (or generated),
    name, root = resolve_data(task, args.data, args.data_root)  # and a wrong DATA_ROOT before weights are read
    info = resolve_backbone(args.ckpt, args.variant, args.arch, args.patch_size or (8 if demo else 16),
                            seed=args.seed, which=args.which)
    if args.img_size:
        size = tuple(int(v) for v in str(args.img_size).split(","))
        size = size * 2 if len(size) == 1 else size
    else:
        size = task.demo_img_size if demo else task.img_size
    dm = probe_datamodule(task, name, root, size, getattr(info.model, "patch_size", 16), num_workers=args.num_workers,
                          batch_size=args.batch_size or KINDS[kind or task.kind].batch_size, aug=not args.no_aug,
                          train_split=args.train_split, val_split=args.val_split, max_samples=args.max_samples)
    dm.setup("fit")
    return ProbeContext(args, task, info, dm, tuple(size), name, root, kind=kind)


def run_layers(ctx: ProbeContext, logger) -> tuple[dict[str, Any], Optional[dict]]:
    """One probe per block selection of --layer: (metrics, the last probe's feature spec)."""
    from lightning.pytorch.loggers import TensorBoardLogger
    kind = KINDS[ctx.probe_kind]
    layers = parse_layers(ctx.args.layer, ctx.depth)
    per_layer, spec = {}, None
    for blocks in layers:
        key = "default" if blocks is None else f"block_{blocks[0]}"
        sub = logger if len(layers) == 1 else TensorBoardLogger(save_dir=str(ctx.log_dir), name=key, version="",
                                                                default_hp_metric=False)
        spec = kind.features(ctx.args, ctx.depth, blocks)
        per_layer[key] = kind.run(ctx, spec, sub, key)
    metrics = per_layer["default"] if list(per_layer) == ["default"] else {"layers": per_layer}
    return metrics, None if spec is None else spec.describe()


def write_probe_results(ctx: ProbeContext, metrics: dict, features: Optional[dict]) -> Path:
    args, info = ctx.args, ctx.info
    config = {**vars(args), "dataset": ctx.dataset, "data_root": str(ctx.root), "img_size": list(ctx.size),
              "features": features, "val_split": args.val_split or ctx.task.val_split,
              "num_train": len(ctx.dm.train_set), "num_val": len(ctx.dm.val_set)}
    marker = ctx.root / ".demo_complete.json"
    if is_demo(ctx.dataset) and marker.is_file():  # which generation of the demo data was measured
        config["demo_data"] = json.loads(marker.read_text())
    return write_results(ctx.log_dir, task=run_name(ctx), variant=info.run_name, data=args.data, metrics=metrics,
                         config=config, backbone=backbone_entry(info.config, info.checkpoint, info.sha256,
                                                                info.source))


def main(argv: Optional[list[str]] = None) -> Optional[Path]:
    args = parse_args(argv)
    if args.print_config:
        get_task(args.task.strip())  # an unknown task is an error here too
        import yaml
        print(yaml.safe_dump({k: v for k, v in vars(args).items() if k != "print_config"}, sort_keys=False))
        return None
    finish_eval_args(args, demo=is_demo(args.data))
    resolve_kind(get_task(args.task.strip()), args.kind)
    if args.quick:
        args.max_epochs = args.max_epochs or 2
        args.max_samples = args.max_samples or 16
    import lightning as L
    from lightning.pytorch.loggers import TensorBoardLogger
    L.seed_everything(args.seed, verbose=False)
    ctx = build_context(args)
    if global_rank() == 0:
        print(f"[probe] {device_line(kind_device(args.accelerator))}", flush=True)  # GPU + bf16, or CPU fp32
    probe_dir = (Path(args.runs_dir) if args.runs_dir else paths.RUNS) / ctx.info.run_name / "probe"
    version = paths.run_version(probe_dir / run_name(ctx), count_devices(args.accelerator, args.devices) > 1)
    logger = TensorBoardLogger(save_dir=str(probe_dir), name=run_name(ctx), version=version,
                               default_hp_metric=False)
    ctx.log_dir = Path(logger.log_dir)
    try:
        metrics, features = run_layers(ctx, logger)
        if global_rank() != 0:  # the other processes of a multi-device run: rank 0 writes the results
            return ctx.log_dir / "results.json"
        path = write_probe_results(ctx, metrics, features)
        if "layers" in metrics and KINDS[ctx.probe_kind].profile is not None:
            from .profile import plot_depth_profile
            plot_depth_profile(metrics["layers"], KINDS[ctx.probe_kind].profile, ctx.log_dir / "depth_profile.png",
                               title=f"{run_name(ctx)} on {ctx.info.run_name}")
    finally:
        paths.release_version()  # a next run in this process claims its own folder
    print(f"[probe] {run_name(ctx)} on {ctx.info.run_name}: {summary(ctx.probe_kind, metrics)}\n"
          f"[probe] results: {path}")
    return path


def cli() -> None:
    install_stop_handlers()  # SIGTERM / SIGINT end every rank within seconds (tokenmix/launch.py)
    try:
        main()
    except (ValueError, FileNotFoundError, KeyError, CheckpointError, LaunchError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        print(f"probe error: {msg}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    cli()
