"""``make probe TASK=...``: one probe on one frozen backbone, results.json + TensorBoard in a fresh folder.

    python -m probes.run --task voc --variant entmax --ckpt '' --data demo --data-root '' --layer ''
    python -m probes.run --task knn --ckpt random      # baselines: random (untrained ViT), pixels (raw patches)
    python -m probes.run --task nyuv2 --layer all      # one probe per block

Output: runs/<variant | variant_random | pixels>/probe/<task>/version_N/{results.json, events.*, head*.pt}.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

import torch

from tokenmix.io import CheckpointError
from tokenmix.launch import (LaunchError, cluster_num_nodes, count_devices, ddp_strategy, global_rank,
                             refuse_unlaunched_multinode, wants_sync_batchnorm)

from .backbone import BackboneInfo, resolve_backbone
from .data import probe_datamodule, resolve_data
from .features import FeatureSpec, FrozenFeatures, extraction_module
from tokenmix.knn import DEFAULT_KS, knn_top1_topk
from .results import write_results
from .tasks import TASKS, TaskSpec, get_task


DEFAULT_EPOCHS = {"linear": 100, "seg": 40, "depth": 40}
DEMO_ARCH = "vit_demo_patch8"
VERSION_ENV = "TOKENMIX_PROBE_VERSION"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m probes.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", required=True, help=f"one of: {', '.join(TASKS)}")
    p.add_argument("--config", default=None, help="YAML of defaults (configs/probe/*.yaml): top-level flags for "
                   "every task, 'tasks: {<task>: {...}}' per task; command-line flags win")
    p.add_argument("--variant", default="softmax", help="variant whose latest pretraining checkpoint is used "
                   "when --ckpt is empty; also the variant of --ckpt random")
    p.add_argument("--ckpt", default="", help="checkpoint file, or 'random' / 'pixels' baselines; '' = latest "
                   "pretraining run of --variant")
    p.add_argument("--data", default="demo", help="'demo' (generated data) or the dataset name (with --data-root)")
    p.add_argument("--data-root", default="", help="folder of the real dataset")
    p.add_argument("--layer", default="", help="'' = the protocol's blocks, k = block k, 'all' = every block, "
                   "'0,3' = a list")
    p.add_argument("--max-epochs", type=int, default=None, help="default: imagenet 100, dense probes 40")
    p.add_argument("--batch-size", type=int, default=None, help="default: 256 imagenet, 16 dense, 64 k-NN")
    p.add_argument("--lr", type=float, default=None, help="default: the protocol's")
    p.add_argument("--img-size", default=None, help="probe input size 'S' or 'H,W' (default: per task, see docs)")
    p.add_argument("--arch", default=None, help=f"arch of --ckpt random (default: {DEMO_ARCH} on demo data, "
                   "vit_small_patch16 otherwise)")
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
    p.add_argument("--no-cache", action="store_true", help="recompute frozen features every epoch")
    p.add_argument("--cache-fp16", action="store_true", help="store cached features as float16 (half the memory)")
    p.add_argument("--no-aug", action="store_true", help="imagenet: no RandomResizedCrop/flip (features cached)")
    p.add_argument("--train-split", default="train")
    p.add_argument("--val-split", default=None, help="default: val (depth datasets: test)")
    p.add_argument("--max-samples", type=int, default=None, help="use the first N samples of each split")
    p.add_argument("--knn-k", default=",".join(map(str, DEFAULT_KS)), help="k-NN: comma-separated k values")
    p.add_argument("--knn-t", type=float, default=0.07, help="k-NN temperature")
    p.add_argument("--which", choices=("teacher", "student"), default="teacher")
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--accelerator", default="auto")
    p.add_argument("--devices", default="1", help="devices per node through Lightning DDP ('auto' = all "
                   "present); batch size is per device, features are sharded over the processes and gathered")
    p.add_argument("--num-nodes", type=int, default=None, help="default: from SLURM / torchrun, else 1")
    p.add_argument("--dist-timeout", type=float, default=10.0, help="minutes DDP waits for the other processes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs-dir", default=None, help="default: tokenmix.paths.RUNS (runs/)")
    p.add_argument("--quick", action="store_true", help="smoke test: 2 epochs, at most 16 samples per split")
    p.add_argument("--progress", action="store_true", help="show the Lightning progress bar")
    p.add_argument("--print-config", "--print_config", action="store_true",
                   help="print the resolved settings (config file + flags) as YAML and exit")
    return p


def claim_version_dir(root: Path) -> str:
    """Create the next free ``version_N`` under ``root`` atomically (mkdir fails if another run took it),
    so each run, even concurrent ones, owns a fresh folder and results never mix."""
    root.mkdir(parents=True, exist_ok=True)
    taken = [int(p.name.split("_", 1)[1]) for p in root.glob("version_*") if p.name.split("_", 1)[1].isdigit()]
    n = max(taken, default=-1) + 1
    while True:
        try:
            (root / f"version_{n}").mkdir()
            return f"version_{n}"
        except FileExistsError:
            n += 1


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


def make_trainer(args, **kw):
    """A Lightning Trainer on ``--accelerator`` x ``--devices`` x ``--num-nodes`` (DDP with a process-group
    timeout when more than one process); our modules shard their own data (use_distributed_sampler=False)."""
    import lightning as L
    strategy = ddp_strategy("auto", args.accelerator, args.devices, args.num_nodes, args.dist_timeout)
    return L.Trainer(accelerator=args.accelerator, devices=args.devices, num_nodes=args.num_nodes,
                     strategy=strategy, use_distributed_sampler=False,
                     sync_batchnorm=wants_sync_batchnorm(strategy, args.accelerator, "the probe head's BatchNorm"),
                     enable_model_summary=False, enable_progress_bar=args.progress, **kw)


def extract_all(args, features: FrozenFeatures, dm) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(features, labels) of each split of ``dm``, sharded over the processes and gathered on every rank."""
    import warnings
    module = extraction_module(features)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(module\\(s\\) in eval mode|does not have many workers).*")
        make_trainer(args, logger=False, enable_checkpointing=False).predict(module, datamodule=dm,
                                                                             return_predictions=False)
    return module.results


def _device(accelerator: str) -> torch.device:
    if accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def run_knn(args, task, info: BackboneInfo, dm, blocks, logger) -> dict[str, Any]:
    spec = FeatureSpec(kind="cls", n_last_blocks=1, blocks=blocks)  # DINO eval_knn: last-block [CLS]
    features = FrozenFeatures(info.model, spec)
    dev = _device(args.accelerator)
    t0 = time.perf_counter()  # DINO eval_knn: Resize 256 + CenterCrop 224 for both splits (the DataModule's views)
    (ftr, ytr), (fva, yva) = extract_all(args, features, dm)
    if global_rank() != 0:  # every rank took part in the extraction; rank 0 votes and reports
        return {}
    ks = [int(k) for k in str(args.knn_k).split(",") if k.strip()]
    if dev.type == "cuda":  # similarity matrix on the GPU (DINO keeps the features there too)
        ftr, fva = ftr.to(dev), fva.to(dev)
    res = knn_top1_topk(ftr, ytr, fva, yva, dm.num_classes, ks=ks, T=args.knn_t)
    metrics = {"top1": {k: v["top1"] for k, v in res.items()}, "top5": {k: v["top5"] for k, v in res.items()},
               "num_train": len(ytr), "num_val": len(yva), "seconds": time.perf_counter() - t0}
    if logger is not None:
        for k, v in res.items():
            logger.experiment.add_scalar(f"knn/top1_k{k}", v["top1"], 0)
        logger.experiment.flush()
    return metrics


def build_probe(args, task, info: BackboneInfo, dm, blocks, dataset: str):
    kw = dict(cache_dtype=torch.float16 if args.cache_fp16 else torch.float32)
    if task.kind == "linear":
        from .module_linear import LinearClassificationProbe
        aug = not args.no_aug
        spec = FeatureSpec(kind="cls", n_last_blocks=min(4, getattr(info.model, "depth", 1)), blocks=blocks)
        features = FrozenFeatures(info.model, spec)
        return LinearClassificationProbe(features, dm, dm.num_classes, lr=args.lr,
                                         cache=not aug and not args.no_cache, **kw), spec
    with_cls = args.with_cls if args.with_cls is not None else task.kind == "depth"
    n_last = 4 if args.head == "linear4" else 1
    spec = FeatureSpec(kind="dense", n_last_blocks=min(n_last, getattr(info.model, "depth", 1)), blocks=blocks,
                       with_cls=with_cls)
    features = FrozenFeatures(info.model, spec)
    cache = not args.no_cache
    if task.kind == "seg":
        from .module_seg import SegmentationProbe
        return SegmentationProbe(features, dm, dm.num_classes, cache=cache,
                                 **({"lr": args.lr} if args.lr else {}), **kw), spec
    from .module_depth import DepthProbe
    from .tasks import depth_eval_settings
    lo, hi, crop, clip = depth_eval_settings(dataset)
    return DepthProbe(features, dm, min_depth=lo, max_depth=hi, crop=crop, clip=clip,
                      classify=args.depth_head == "bins", norm=args.bin_norm, cache=cache,
                      **({"lr": args.lr} if args.lr else {}), **kw), spec


def fit_probe(args, module, logger, max_epochs: int) -> dict[str, Any]:
    import warnings

    trainer = make_trainer(args, max_epochs=max_epochs, logger=logger, enable_checkpointing=False,
                           num_sanity_val_steps=0, log_every_n_steps=1, reload_dataloaders_every_n_epochs=1)
    t0 = time.perf_counter()
    with warnings.catch_warnings():  # the frozen backbone is in eval mode on purpose
        warnings.filterwarnings("ignore", message=".*module\\(s\\) in eval mode.*")
        trainer.fit(module)
    metrics = dict(module.last_metrics)
    metrics["history"] = module.history
    metrics["seconds"] = time.perf_counter() - t0
    return metrics


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


def run_version(root: Path, spawns: bool) -> str:
    """The run's ``version_N``: claimed by rank 0 (the launching process), handed to the processes Lightning
    starts through the environment. Other ranks (e.g. started by srun) write nothing and claim nothing."""
    if os.environ.get(VERSION_ENV):
        return os.environ[VERSION_ENV]
    if global_rank() != 0:
        return f"version_rank{global_rank()}"
    version = claim_version_dir(root)
    if spawns:
        os.environ[VERSION_ENV] = version  # inherited by the processes the DDP launcher starts
    return version


def main(argv: Optional[list[str]] = None) -> Optional[Path]:
    args = parse_args(argv)
    if args.print_config:
        import yaml
        get_task(args.task.strip())  # an unknown task is an error here too
        print(yaml.safe_dump({k: v for k, v in vars(args).items() if k != "print_config"}, sort_keys=False))
        return None
    if args.num_nodes is None:
        args.num_nodes = cluster_num_nodes() or 1
    refuse_unlaunched_multinode(args.num_nodes)
    if str(args.devices).strip() not in ("auto", "-1") and not str(args.devices).replace(",", "").isdigit():
        raise ValueError(f"--devices {args.devices!r}: expected a number, a list like '0,1', or 'auto'")
    task = get_task(args.task.strip())
    demo = (args.data or "demo").strip() == "demo"
    if args.quick:
        args.max_epochs = args.max_epochs or 2
        args.max_samples = args.max_samples or 16
    import lightning as L
    L.seed_everything(args.seed, verbose=False)

    arch = args.arch or (DEMO_ARCH if demo else "vit_small_patch16")
    info = resolve_backbone(args.ckpt, args.variant, arch, args.patch_size or (8 if demo else 16), seed=args.seed,
                            which=args.which)
    name, root = resolve_data(task, args.data, args.data_root)
    if args.img_size:
        size = tuple(int(v) for v in str(args.img_size).split(","))
        size = size * 2 if len(size) == 1 else size
    else:
        size = task.demo_img_size if demo else task.img_size
    dm = probe_datamodule(task, name, root, size, getattr(info.model, "patch_size", 16), num_workers=args.num_workers,
                          batch_size=args.batch_size or {"knn": 64, "linear": 256}.get(task.kind, 16),
                          aug=not args.no_aug, train_split=args.train_split, val_split=args.val_split,
                          max_samples=args.max_samples)
    dm.setup("fit")

    from lightning.pytorch.loggers import TensorBoardLogger
    from tokenmix.paths import RUNS
    runs = Path(args.runs_dir) if args.runs_dir else RUNS
    version = run_version(runs / info.run_name / "probe" / task.name, count_devices(args.accelerator, args.devices) > 1)
    logger = TensorBoardLogger(save_dir=str(runs / info.run_name / "probe"), name=task.name, version=version,
                               default_hp_metric=False)
    log_dir = Path(logger.log_dir)

    layers = parse_layers(args.layer, int(getattr(info.model, "depth", 1)))
    per_layer: dict[str, Any] = {}
    spec_desc = None
    for blocks in layers:
        key = "default" if blocks is None else f"block_{blocks[0]}"
        sub = logger if len(layers) == 1 else TensorBoardLogger(save_dir=str(log_dir), name=key, version="",
                                                                default_hp_metric=False)
        if task.kind == "knn":
            per_layer[key] = run_knn(args, task, info, dm, blocks, sub)
            spec_desc = FeatureSpec(kind="cls", blocks=blocks).describe()
            continue
        module, spec = build_probe(args, task, info, dm, blocks, name)
        spec_desc = spec.describe()
        per_layer[key] = fit_probe(args, module, sub, args.max_epochs or DEFAULT_EPOCHS[task.kind])
        if global_rank() == 0:
            from tokenmix.io import atomic_torch_save
            atomic_torch_save(module.head.state_dict(), log_dir / f"head_{key}.pt")

    if global_rank() != 0:  # the other processes of a multi-device run: rank 0 writes the results
        os.environ.pop(VERSION_ENV, None)
        return log_dir / "results.json"
    metrics = per_layer["default"] if list(per_layer) == ["default"] else {"layers": per_layer}
    config = {k: v for k, v in vars(args).items()}
    config.update(dataset=name, data_root=str(root), img_size=list(size), features=spec_desc,
                  val_split=args.val_split or task.val_split, num_train=len(dm.train_set), num_val=len(dm.val_set))
    marker = root / ".demo_complete.json"
    if name.startswith("demo_") and marker.is_file():  # which generation of the demo data was measured
        config["demo_data"] = json.loads(marker.read_text())
    path = write_results(log_dir, task=task.name, metrics=metrics, config=config, backbone=info.describe())
    print(f"[probe] {task.name} on {info.run_name}: {summary(task, metrics)}\n[probe] results: {path}")
    os.environ.pop(VERSION_ENV, None)  # a next run in this process claims its own folder
    return path


def summary(task: TaskSpec, metrics: dict) -> str:
    def one(m):
        if task.kind == "knn":
            return "k-NN top-1 " + ", ".join(f"k={k}: {v:.2f}" for k, v in m["top1"].items())
        if task.kind == "linear":
            return f"best top-1 {m['best_top1']:.2f}"
        if task.kind == "seg":
            return f"mIoU {m['mIoU']:.2f}, aAcc {m['aAcc']:.2f}"
        return f"RMSE {m['rmse']:.4f}, AbsRel {m['abs_rel']:.4f}, d1 {m['d1']:.4f}"
    if "layers" in metrics:
        return "; ".join(f"{k}: {one(v)}" for k, v in metrics["layers"].items())
    return one(metrics)


def cli() -> None:
    try:
        main()
    except (ValueError, FileNotFoundError, KeyError, CheckpointError, LaunchError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        print(f"probe error: {msg}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    cli()
