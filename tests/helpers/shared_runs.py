"""Trained runs that several test files read, trained once per session (the ``entmax_run`` fixture in
conftest.py) instead of once per file, also across pytest-xdist workers (``once``). A test reads a shared run and
never writes into its folder.
"""
from __future__ import annotations

import fcntl
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
# DenseProbeCheck's reduced settings (tests/test_dense_check.py reads the same numbers)
DENSE_CHECK = {"max_samples": 5, "img_size": 32, "batch_size": 2, "attn_images": 3}


@dataclass(frozen=True)
class TinyRun:
    runs: Path  # the --runs-dir
    version: Path  # runs/entmax/pretrain/tiny/version_0: summary.json, TensorBoard events, checkpoints/
    call_wall: float  # seconds of the whole pretrain call (DenseProbeCheck states its share of the fit's time)
    small_voc: Path  # the demo data DenseProbeCheck probed

    @property
    def last(self) -> Path:
        return self.version / "checkpoints" / "last.ckpt"


def small_voc(root: Path) -> Path:
    from datamodules.demo import DemoSpec, ensure_demo_data
    return ensure_demo_data(root, spec=DemoSpec(cls_train=2, cls_val=2, voc_train=6, voc_val=5, nyu_train=2,
                                                nyu_test=2))


def train_tiny_entmax(runs: Path, data: Path) -> TinyRun:
    """`make pretrain` on the tiny preset (2 epochs x 3 steps of entmax, vit_test_patch8 at 32 px) with every
    online check a test reads: k-NN (on 256 train images), DenseProbeCheck each epoch on ``data``, and the epoch-1
    checkpoint kept (the flags `make study AT=e1` adds)."""
    from lightning_modules.pretrain import main
    from study.points import keep_args
    cbs = yaml.safe_load((REPO / "configs/pretrain/tiny.yaml").read_text())["trainer"]["callbacks"]
    cbs[-1:-1] = [{"class_path": "lightning_modules.callbacks.knn.KNNCheck", "init_args": {"max_train": 256}},
                  {"class_path": "lightning_modules.callbacks.dense_check.DenseProbeCheck",
                   "init_args": {"data_root": str(data), "every_n_epochs": 1, **DENSE_CHECK}}]
    runs.mkdir(parents=True, exist_ok=True)
    extra = runs.parent / f"{runs.name}_callbacks.yaml"
    extra.write_text(yaml.safe_dump({"trainer": {"callbacks": cbs}}))
    t0 = time.perf_counter()
    code = main(["--variant", "entmax", "--preset", "tiny", "--runs-dir", str(runs), f"--config={extra}",
                 "--trainer.enable_progress_bar=false", *keep_args(("e1", ""))])
    wall = time.perf_counter() - t0
    assert code == 0, f"the shared tiny entmax run failed (exit {code})"
    return TinyRun(runs, runs / "entmax" / "pretrain" / "tiny" / "version_0", wall, data)


def once(session_dir: Path, name: str, make) -> TinyRun:
    """``make(folder)`` run once per test session: the first worker to get here trains under a file lock and
    records the result; pytest-xdist's other workers (same ``session_dir``) wait for it and read the record."""
    folder, record = session_dir / name, session_dir / f"{name}.json"
    session_dir.mkdir(parents=True, exist_ok=True)
    with open(session_dir / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not record.exists():
            run = make(folder)
            record.write_text(json.dumps({k: str(v) for k, v in asdict(run).items()}))
        fields = json.loads(record.read_text())
    return TinyRun(Path(fields["runs"]), Path(fields["version"]), float(fields["call_wall"]), Path(fields["small_voc"]))
