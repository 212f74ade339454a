"""``make probe``'s command line: the parser, the --config file's defaults under it, each kind's typed options
built from the flags (``OPTIONS``), and the run's one typed ``ProbeConfig`` (``make_config``), built here once;
below this file nothing reads the command line. Only ``probes/run.py`` reads the result.

A flag of one protocol defaults to None: its default is written once, in that protocol's options class, and
``kind_options`` passes only the flags given. A new option: a field there, its flag here, one keyword in its
builder (``OPTIONS``).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from backbones.load import checkpoint_path
from datamodules.demo import is_demo
from tokenmix import paths
from tokenmix.cli import BackboneFlags, Launch, eval_parent_parser, finish_eval_args

from probes.core.kinds import KINDS, KindOptions
from probes.core.options import Training
from probes.core.task_table import ALT_KINDS, TASKS, Kind, TaskSpec, get_task
from probes.dense.options import BinNorm, DepthHead, DepthOptions, Head, SegOptions, Solver
from probes.headfree.retrieval import DenseRetrievalProtocol, resolve_settings
from probes.headfree.runners import OverclusterOptions, RetrievalOptions
from probes.instance.copy_detection import CopyDetectionOptions
from probes.instance.image_retrieval import DINO_MULTISCALE, ImageRetrievalOptions
from probes.linear.knn import KnnOptions
from probes.linear.module_linear import LinearOptions
from probes.video.davis_probe import DavisOptions
from probes.video.propagation import PropagationOptions


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m probes.run", description=__doc__, parents=[eval_parent_parser()],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", required=True, help=f"one of: {', '.join(TASKS)}")
    p.set_defaults(data="")  # --data not given: the demo data, or with --data-root the task's own dataset
    p.add_argument("--kind", default="", help="'' = the task's own probe; segmentation tasks also take 'retrieval' "
                   "(Hummingbird dense retrieval) and 'overcluster' (k-means + matching), neither trains a head")
    p.add_argument("--config", default=None, help="YAML of defaults (configs/probe/*.yaml): top-level flags for "
                   "every task, 'tasks: {<task>: {...}}' per task; command-line flags win")
    p.add_argument("--layer", default="", help="'' = the protocol's blocks, k = block k, 'all' = every block, "
                   "'0,3' = a list")
    p.add_argument("--max-epochs", type=int, default=None, help="default: the kind's (probes.core.kinds.KINDS)")
    p.add_argument("--batch-size", type=int, default=None, help="per device; default: the kind's (KINDS; DAVIS, "
                   "copy detection: their options')")
    p.add_argument("--lr", type=float, default=None, help="default: the protocol's")
    p.add_argument("--img-size", default=None, help="probe input size 'S' or 'H,W' (default: per task, see docs)")
    p.add_argument("--patch-size", type=int, default=None,
                   help="patch size of --ckpt pixels (default: demo 8, else 16)")
    p.add_argument("--head", choices=[h.value for h in Head], default=None,
                   help="dense: last block (linear, default) or last 4 blocks (linear4)")
    p.add_argument("--cls", dest="with_cls", action="store_true", default=None,
                   help="concatenate [CLS] to the patch tokens (default: on for depth, off for segmentation)")
    p.add_argument("--no-cls", dest="with_cls", action="store_false")
    p.add_argument("--depth-head", choices=[h.value for h in DepthHead], default=None, help="default: bins")
    p.add_argument("--bin-norm", choices=[n.value for n in BinNorm], default=None,
                   help="bins -> probabilities: DINOv2's 'linear' (default; relu + 0.1, normalise) or softmax")
    p.add_argument("--solver", choices=[v.value for v in Solver], default=None,
                   help="segmentation: the trained BN + linear head (sgd, the protocol) or the closed-form ridge probe "
                   "of the pretraining's DenseProbeCheck (probes/dense/ridge.py)")
    p.add_argument("--ridge-lambda", type=float, default=None, help="--solver ridge: penalty (x number of patches)")
    p.add_argument("--no-cache", action="store_true", help="recompute frozen features every epoch")
    p.add_argument("--cache-fp16", action="store_true", help="store cached features as float16 (half the memory)")
    p.add_argument("--no-aug", action="store_true", help="imagenet: no RandomResizedCrop/flip (features cached)")
    p.add_argument("--train-split", default="train")
    p.add_argument("--val-split", default=None, help="default: val (depth datasets: test)")
    p.add_argument("--max-samples", type=int, default=None, help="use the first N samples of each split")
    p.add_argument("--knn-k", default=None, help="k-NN: comma-separated k values (default: DINO's 10,20,100,200)")
    p.add_argument("--knn-t", type=float, default=None, help="k-NN temperature (default: DINO's 0.07)")
    p.add_argument("--bf16", action="store_true", help="DINO's protocols (k-NN, linear, roxford5k / rparis6k, "
                   "copydays) in bf16 autocast on CUDA instead of DINO's fp32 (docs/probes/core.md: the deviation)")
    headfree_flags(p)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--accelerator", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs-dir", default=None, help="default: tokenmix.paths.RUNS (runs/)")
    p.add_argument("--quick", action="store_true", help="smoke test: 2 epochs, at most 16 samples per split")
    p.add_argument("--progress", action="store_true", help="show the Lightning progress bar")
    p.add_argument("--print-config", "--print_config", action="store_true",
                   help="print the resolved settings (config file + flags) as YAML and exit")
    return image_level_flags(p)


def headfree_flags(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The head-free dense kinds' flags: dense retrieval (``--kind retrieval``), overclustering, DAVIS."""
    p.add_argument("--protocol", choices=[v.value for v in DenseRetrievalProtocol],
                   default=DenseRetrievalProtocol.PROJECT.value, help="retrieval: 'hummingbird' = the reference's "
                   "published setting (docs/probes/headfree.md); explicit flags win")
    p.add_argument("--hb-memory", default=None, help="retrieval: memory sizes in patches (default 1024 x 10^2, "
                   "10^3, 10^4; each capped at every patch of every view, with a warning)")
    p.add_argument("--hb-k", type=int, default=None, help="retrieval: nearest neighbours per patch (default 30)")
    p.add_argument("--hb-temperature", type=float, default=None, help="retrieval: attention temperature (0.02)")
    p.add_argument("--hb-aug-epochs", type=int, default=None, help="retrieval: views of each training image (1 or 2)")
    p.add_argument("--hb-std-typo", action=argparse.BooleanOptionalAction, default=None,
                   help="retrieval: normalise with the reference's std (0.229, 0.224, 0.255) (default: hummingbird)")
    p.add_argument("--cluster-k", default=None, help="overcluster: K values, 'Nx' = N x the number of classes "
                   "(e.g. '1x,100,300'; default 1x,2x,5x,10x)")
    p.add_argument("--cluster-iters", type=int, default=None, help="overcluster: faiss k-means iterations (100)")
    p.add_argument("--cluster-seeds", type=int, default=None,
                   help="overcluster: k-means runs (seeds 0..N-1), reported as mean and std (Leopart / NeCo: 5)")
    p.add_argument("--davis", default="", help="davis: 'key=value,...' of probes.video.propagation.PropagationOptions")
    return p


def image_level_flags(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The image-level tasks' flags (``ImageRetrievalOptions`` / ``CopyDetectionOptions``)."""
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


# --------------------------------------------------------------------------- each kind's options from the flags

def given(**kw) -> dict[str, Any]:
    """The keywords whose flag was given (not None): the others keep their options class's default."""
    return {k: v for k, v in kw.items() if v is not None}


def memory_sizes(spec: str) -> tuple[int, ...]:
    """--hb-memory '102400,1024000' -> (102400, 1024000)."""
    try:
        sizes = [int(float(s)) for s in str(spec).split(",") if s.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--hb-memory {spec!r}: expected comma-separated patch counts, e.g. 102400,1024000")
    return tuple(sizes)


def _training(f: argparse.Namespace) -> Training:
    return Training(max_epochs=f.max_epochs, lr=f.lr, cache=not f.no_cache, cache_fp16=f.cache_fp16)


def _knn(f: argparse.Namespace) -> KnnOptions:
    ks = None if f.knn_k is None else tuple(int(k) for k in str(f.knn_k).split(",") if k.strip())
    return KnnOptions(**given(ks=ks, temperature=f.knn_t), bf16=f.bf16)


def _dense(f: argparse.Namespace, cls: type) -> "SegOptions | DepthOptions":
    enums = {"head": Head, "solver": Solver, "depth_head": DepthHead, "bin_norm": BinNorm}
    fields = {k: getattr(f, k) for k in ("head", "solver", "ridge_lambda", "depth_head", "bin_norm")
              if k in cls.__dataclass_fields__}
    return cls(_training(f), with_cls=f.with_cls, **{k: enums[k](v) if k in enums else v
                                                       for k, v in given(**fields).items()})


def _retrieval(f: argparse.Namespace) -> RetrievalOptions:
    protocol = DenseRetrievalProtocol(f.protocol)
    s = resolve_settings(protocol, f.hb_aug_epochs, memory_sizes(f.hb_memory) if f.hb_memory else None,
                         f.hb_std_typo)
    return RetrievalOptions(memory=s.memory, aug_epochs=s.aug_epochs, seed=f.seed, protocol=protocol,
                            std_typo=s.std_typo, ade_other=s.ade_other, trainaug=s.trainaug,
                            **given(k=f.hb_k, temperature=f.hb_temperature))


def _davis(f: argparse.Namespace) -> DavisOptions:
    return DavisOptions(PropagationOptions.parse(f.davis), max_sequences=f.max_samples,
                        **given(batch_size=f.batch_size, split=f.val_split))


def _image_retrieval(f: argparse.Namespace, task: TaskSpec, side: int) -> ImageRetrievalOptions:
    ms = DINO_MULTISCALE.get(task.name, False) if f.multiscale is None else bool(f.multiscale)
    return ImageRetrievalOptions(imsize=side, multiscale=ms, crop_queries=not f.whole_queries, bf16=f.bf16)


def _copy_detection(f: argparse.Namespace, task: TaskSpec, side: int) -> CopyDetectionOptions:
    """'' roots: ``<DATA_ROOT>/whitening`` / ``distractors`` when present."""
    roots = {k: Path(v).expanduser() for k, v in (("whitening_root", f.whitening_root),
                                                   ("distractors_root", f.distractors_root)) if v}
    return CopyDetectionOptions(imsize=side, bf16=f.bf16, **roots, **given(batch_size=f.batch_size))


# each kind's options from the flags (f), the task and the image-level tasks' side (the probe size's first value)
OPTIONS: dict[Kind, Callable[[argparse.Namespace, TaskSpec, int], Any]] = {
    Kind.KNN: lambda f, task, side: _knn(f),
    Kind.LINEAR: lambda f, task, side: LinearOptions(_training(f), aug=not f.no_aug, bf16=f.bf16),
    Kind.SEG: lambda f, task, side: _dense(f, SegOptions),
    Kind.DEPTH: lambda f, task, side: _dense(f, DepthOptions),
    Kind.RETRIEVAL: lambda f, task, side: _retrieval(f),
    Kind.OVERCLUSTER: lambda f, task, side: OverclusterOptions(**given(ks=f.cluster_k, iters=f.cluster_iters,
                                                                       seeds=f.cluster_seeds)),
    Kind.DAVIS: lambda f, task, side: _davis(f),
    Kind.IMAGE_RETRIEVAL: _image_retrieval,
    Kind.COPY_DETECTION: _copy_detection,
}


def protocol_img_size(f: argparse.Namespace, kind: Kind) -> Optional[str]:
    """--img-size, else the dense retrieval protocol's input size (hummingbird: 512), else None (the task's)."""
    if f.img_size or kind != Kind.RETRIEVAL:
        return f.img_size
    size = resolve_settings(DenseRetrievalProtocol(f.protocol)).img_size
    return str(size) if size else None

def probe_size(img_size: Optional[str], task: TaskSpec, demo: bool) -> tuple[int, int]:
    """The probe input (H, W), the one rule: --img-size 'S' (square) or 'H,W', else the task's (demo data: its demo
    size). The image-level tasks read its first value (retrieval: the longer side)."""
    if not img_size:
        return tuple(task.demo_img_size if demo else task.img_size)
    try:
        size = tuple(int(v) for v in str(img_size).split(","))
    except ValueError:
        size = ()
    if len(size) not in (1, 2) or min(size) < 1:
        raise ValueError(f"--img-size {img_size!r}: 'S' or 'H,W', positive numbers of pixels")
    return size * 2 if len(size) == 1 else size


# --------------------------------------------------------------------------- the run's one typed config

def resolve_kind(task: TaskSpec, kind: str) -> Optional[Kind]:
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


@dataclass(frozen=True)
class ProbeData:
    """The task's data: which dataset, the probe input, the loaders."""
    data: str        # --data ('demo', a dataset name, your own layout)
    data_root: str
    size: tuple[int, int]  # probe input (H, W): --img-size, else the task's (demo: its demo size)
    batch_size: Optional[int]  # per device: --batch-size, else the kind's (None: the kind has no DataModule)
    num_workers: int
    aug: bool              # not --no-aug (the linear probe's training view)
    train_split: str
    val_split: Optional[str]  # None: the task's (val; depth: test)
    max_samples: Optional[int]


@dataclass(frozen=True)
class ProbeConfig:
    """Everything one ``make probe`` reads, typed and resolved once from the flags (``make_config``)."""
    task: TaskSpec
    kind: Optional[Kind]          # --kind: None = the task's own, else a head-free kind (tasks.ALT_KINDS)
    backbone: BackboneFlags
    checkpoint: Optional[Path]    # the file --ckpt names (None: random / pixels), found once before the data
    seed: int
    patch_size: int               # of --ckpt pixels
    data: ProbeData
    layer: str                    # --layer
    launch: Launch
    progress: bool
    options: KindOptions          # the running kind's own (its class beside its protocol)
    runs_dir: Path
    record: dict[str, Any]        # the resolved flags, as results.json's config records them
    probe_kind: Kind              # the kind that runs: --kind, else the task's
    note: Optional[str] = None    # the first line of the output: DATA chosen for the user (DATA_ROOT alone)


def make_config(f: argparse.Namespace) -> ProbeConfig:
    """The run's config from the parsed flags: the task and kind looked up, --quick applied, the input size and the
    kind's options built, the shared eval flags checked (``tokenmix.cli.finish_eval_args``), and the checkpoint
    file found (a wrong CKPT fails before the data is opened or generated)."""
    task = get_task(f.task.strip())
    kind = resolve_kind(task, f.kind)
    probe_kind = kind or task.kind
    if f.solver == Solver.RIDGE.value and probe_kind != Kind.SEG:
        raise ValueError(f"--solver ridge is for segmentation tasks, not {probe_kind.value}")
    note = None
    if not (f.data or "").strip() and f.data_root:  # DATA_ROOT alone names the task's own dataset
        f = argparse.Namespace(**{**vars(f), "data": task.dataset})
        note = f"[probe] DATA={task.dataset}: task {task.name}'s own dataset (DATA_ROOT given, DATA not)"
    demo = is_demo(f.data or "demo")
    max_epochs, max_samples = (f.max_epochs or 2, f.max_samples or 16) if f.quick else (f.max_epochs, f.max_samples)
    f = argparse.Namespace(**{**vars(f), "max_epochs": max_epochs, "max_samples": max_samples})
    size = probe_size(protocol_img_size(f, probe_kind), task, demo)
    options = OPTIONS[probe_kind](f, task, size[0])
    ev = finish_eval_args(f, demo=demo, accelerator=f.accelerator)
    record = {**vars(f), "variant": ev.backbone.variant, "ckpt": ev.backbone.ckpt, "data": ev.data,
              "arch": ev.backbone.arch, "num_nodes": ev.launch.num_nodes}
    data = ProbeData(ev.data, ev.data_root, size, f.batch_size or KINDS[probe_kind].batch_size, f.num_workers,
                     not f.no_aug, f.train_split, f.val_split, max_samples)
    return ProbeConfig(task, kind, ev.backbone, checkpoint_path(ev.backbone.ckpt, ev.backbone.variant), f.seed,
                       f.patch_size or (8 if demo else 16), data, f.layer, ev.launch, f.progress, options,
                       Path(f.runs_dir) if f.runs_dir else paths.RUNS, record, probe_kind, note)


def parse_args(argv: Optional[list[str]] = None) -> Optional[ProbeConfig]:
    """The command line (and its --config file) -> the run's ``ProbeConfig``; --print-config prints the resolved
    flags as YAML and gives None."""
    f = parse_flags(argv)
    if not f.print_config:
        return make_config(f)
    get_task(f.task.strip())  # an unknown task is an error here too
    import yaml
    print(yaml.safe_dump({k: v for k, v in vars(f).items() if k != "print_config"}, sort_keys=False))
    return None
