"""The study's own report columns. Its tasks besides the CLIs' (``probes.core.task_table.TASKS``,
``analysis.registry.TASKS``): a head-free probe kind on a segmentation task, named ``<task>_<kind>`` as the probe
CLI names its run folder and results.json (``probes.run.run_name``): ``voc_retrieval`` runs ``probes.run --task voc
--kind retrieval`` (Hummingbird dense retrieval), ``voc_overcluster`` ``--kind overcluster``; and their columns.
Also the columns every study reads off its pretraining runs' own summary.json (val top-1, last k-NN, dense checks).

    >>> probe_flags("voc_retrieval"), probe_flags("voc")
    (['--task', 'voc', '--kind', 'retrieval'], ['--task', 'voc'])
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from .store import read_result


def headless_tasks() -> dict[str, tuple[str, str]]:
    """study task -> (probe task, kind), for every segmentation task and head-free kind it takes."""
    from probes.core.task_table import ALT_KINDS, TASKS
    return {f"{name}_{k.value}": (name, k.value) for name, t in TASKS.items() for k in ALT_KINDS.get(t.kind, ())}


def probe_flags(task: str) -> list[str]:
    """The probe CLI's --task (and --kind) of a study task."""
    base = headless_tasks().get(task)
    return ["--task", base[0], "--kind", base[1]] if base else ["--task", task]


def _largest_memory(m: dict, r: dict) -> Optional[float]:
    """Retrieval: mIoU at the largest memory the run reached (sizes capped at every patch give equal banks)."""
    sizes = m.get("mIoU") if isinstance(m, dict) else None
    if not isinstance(sizes, dict) or not sizes:
        return None
    best = max(sizes.items(), key=lambda kv: (kv[1].get("memory", 0), int(kv[0])))[1]
    return float(best["mIoU"])


def _k_classes(m: dict, r: dict) -> Optional[float]:
    """Overclustering: mIoU at the smallest K (K = classes by default: Hungarian matching)."""
    ks = m.get("mIoU") if isinstance(m, dict) else None
    if not isinstance(ks, dict) or not ks:
        return None
    return float(ks[min(ks, key=int)]["mIoU"])


def headless_columns() -> list:
    """Report columns of the head-free tasks (``analysis.report.Column``: same fields, same formatting)."""
    from analysis.report import COLUMNS, Column
    how = {"retrieval": ("retrieval mIoU (Hummingbird, largest memory)", _largest_memory),
           "overcluster": ("overclustering mIoU (K = classes)", _k_classes)}
    seg = {c.task: c.title for c in COLUMNS if c.key.endswith("_miou")}  # "VOC mIoU", "own seg mIoU", ...
    return [Column(f"{name}_miou", seg[base].replace("mIoU", how[kind][0]), "probe", name, how[kind][1])
            for name, (base, kind) in headless_tasks().items()]


def training_columns() -> list:
    """Columns read from each pretraining run's summary.json at the end of its schedule (no evaluation cell):
    what the run's own callbacks measured (SupervisedSummary, KNNCheck, DenseProbeCheck). A column appears only for
    runs whose summary has it."""
    from analysis.report import Column
    m = lambda key: (lambda metrics, r: metrics.get(key) if isinstance(metrics.get(key), (int, float)) else None)
    spec = [("train_val_top1", "run's val top-1 (supervised)", "val_top1", 2),
            ("train_knn_top1", "run's k-NN top-1 (KNNCheck, end)", "knn_top1", 2),
            ("train_dense_miou", "dense check ridge mIoU (end)", "dense_mIoU", 2),
            ("train_dense_retrieval", "dense check retrieval mIoU (end)", "dense_retrieval_mIoU", 2),
            ("train_effective_rank", "dense check effective rank (end)", "diffusion_effective_rank", 2),
            ("train_cls_patch_cos", "dense check cos(patch, [CLS]) (end)", "diffusion_cls_patch_cosine", 4)]
    return [Column(key, title, "pretrain", "pretrain", m(name), digits=d) for key, title, name, d in spec]


def training_values(rec: Optional[dict]) -> list:
    """(column, value, summary.json path) of a finished pretraining cell's marker, for every training column its
    run's summary.json (beside checkpoints/) has."""
    res = read_result(Path(rec["run_dir"]) / "summary.json") if rec and rec.get("run_dir") else None
    if res is None:
        return []
    picked = [(col, col.pick(res.metrics, res.payload)) for col in training_columns()]
    return [(col, float(v), str(res.path)) for col, v in picked if v is not None]
