"""``make probe``'s command line: the parser and the --config file's defaults under it. Only ``probes/run.py``
reads the result, and turns it into one typed ``ProbeConfig`` (``make_config``)."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from tokenmix.cli import eval_parent_parser
from tokenmix.knn import DEFAULT_KS

from probes.core.options import BinNorm, DepthHead, Head, Solver
from probes.headfree.retrieval import K_NEIGHBOURS, TEMPERATURE, Protocol
from probes.core.task_table import TASKS


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
    p.add_argument("--head", choices=[h.value for h in Head], default="linear",
                   help="segmentation: last block (linear) or last 4 blocks (linear4)")
    p.add_argument("--cls", dest="with_cls", action="store_true", default=None,
                   help="concatenate [CLS] to the patch tokens (default: on for depth, off for segmentation)")
    p.add_argument("--no-cls", dest="with_cls", action="store_false")
    p.add_argument("--depth-head", choices=[h.value for h in DepthHead], default="bins")
    p.add_argument("--bin-norm", choices=[n.value for n in BinNorm], default="linear",
                   help="bins -> probabilities: DINOv2's 'linear' (relu + 0.1, normalise) or softmax")
    p.add_argument("--solver", choices=[v.value for v in Solver], default="sgd",
                   help="segmentation: the trained BN + linear head (sgd, the protocol) or the closed-form ridge probe "
                   "of the pretraining's DenseProbeCheck (probes/dense/ridge.py)")
    p.add_argument("--ridge-lambda", type=float, default=1e-2, help="--solver ridge: penalty (x number of patches)")
    p.add_argument("--no-cache", action="store_true", help="recompute frozen features every epoch")
    p.add_argument("--cache-fp16", action="store_true", help="store cached features as float16 (half the memory)")
    p.add_argument("--no-aug", action="store_true", help="imagenet: no RandomResizedCrop/flip (features cached)")
    p.add_argument("--train-split", default="train")
    p.add_argument("--val-split", default=None, help="default: val (depth datasets: test)")
    p.add_argument("--max-samples", type=int, default=None, help="use the first N samples of each split")
    p.add_argument("--knn-k", default=",".join(map(str, DEFAULT_KS)), help="k-NN: comma-separated k values")
    p.add_argument("--knn-t", type=float, default=0.07, help="k-NN temperature")
    headless_flags(p)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--accelerator", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs-dir", default=None, help="default: tokenmix.paths.RUNS (runs/)")
    p.add_argument("--quick", action="store_true", help="smoke test: 2 epochs, at most 16 samples per split")
    p.add_argument("--progress", action="store_true", help="show the Lightning progress bar")
    p.add_argument("--print-config", "--print_config", action="store_true",
                   help="print the resolved settings (config file + flags) as YAML and exit")
    return image_level_flags(p)


def headless_flags(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The head-free dense kinds' flags: dense retrieval (``--kind retrieval``), overclustering, DAVIS."""
    p.add_argument("--protocol", choices=[v.value for v in Protocol], default=Protocol.PROJECT.value, help="retrieval:"
                   " 'hummingbird' = the reference's published setting (docs/probes.md); explicit flags win")
    p.add_argument("--hb-memory", default=None, help="retrieval: memory sizes in patches (default 1024 x 10^2, "
                   "10^3, 10^4; each capped at every patch of every view, with a warning)")
    p.add_argument("--hb-k", type=int, default=K_NEIGHBOURS, help="retrieval: nearest neighbours per patch")
    p.add_argument("--hb-temperature", type=float, default=TEMPERATURE, help="retrieval: attention temperature")
    p.add_argument("--hb-aug-epochs", type=int, default=None, help="retrieval: views of each training image (1 or 2)")
    p.add_argument("--hb-std-typo", action=argparse.BooleanOptionalAction, default=None,
                   help="retrieval: normalise with the reference's std (0.229, 0.224, 0.255) (default: hummingbird)")
    p.add_argument("--cluster-k", default="1x,2x,5x,10x",
                   help="overcluster: K values, 'Nx' = N x the number of classes (e.g. '1x,100,300')")
    p.add_argument("--cluster-iters", type=int, default=100, help="overcluster: faiss k-means iterations (niter)")
    p.add_argument("--cluster-seeds", type=int, default=5,
                   help="overcluster: k-means runs (seeds 0..N-1), reported as mean and std (Leopart / NeCo: 5)")
    p.add_argument("--davis", default="", help="davis: 'key=value,...' of probes.video.propagation.PropagationConfig")
    return p


def image_level_flags(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The image-level tasks' flags (``probes.run`` turns them into ``RetrievalConfig`` / ``CopyDetectionConfig``)."""
    p.add_argument("--multiscale", action=argparse.BooleanOptionalAction, default=None,
                   help="roxford5k / rparis6k: [CLS] averaged over scales 1, 1/sqrt2, 1/2 (default: rparis6k on)")
    p.add_argument("--whole-queries", action="store_true", help="roxford5k / rparis6k: queries not cropped to "
                   "their box, as DINO's script reads them (revisitop's protocol crops them)")
    p.add_argument("--whitening-root", default="", help="copydays: whitening images (default <DATA_ROOT>/whitening)")
    p.add_argument("--distractors-root", default="", help="copydays: distractors (default <DATA_ROOT>/distractors)")
    return p


def parse_flags(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """The command line over the --config file's defaults (top level, then its ``tasks: {<task>: ...}``)."""
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
