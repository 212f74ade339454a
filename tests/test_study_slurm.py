"""LAUNCHER=slurm: the generated job scripts, executed with stand-ins for sbatch, srun and python that log what
they are given: the dependency chain, the array sizes, the multi-node settings and every cell's command."""
import os
import re
from pathlib import Path

import pytest

from helpers import procs
from study.__main__ import main
from study.cells import PRETRAIN
from study.plan import Spec, plan

ARGS = ["--variants", "softmax entmax", "--seeds", "2", "--tasks", "knn pib", "--preset", "tiny",
        "--launcher", "slurm", "--nodes", "2", "--gpus-per-node", "4", "--partition", "gpu", "--max-parallel", "3"]


def _bin(folder: Path, name: str, body: str) -> None:
    p = folder / name
    p.write_text("#!/bin/bash\n" + body)
    p.chmod(0o755)


@pytest.fixture
def generated(tmp_path):
    root = tmp_path / "study"
    assert main(["--name", "s", "--root", str(root), *ARGS]) == 0
    spec = Spec.create(name="s", variants=["softmax", "entmax"], seeds=[0, 1], tasks=["knn", "pib"], preset="tiny",
                       root=root)
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "calls.log"
    # sbatch --parsable prints "<id>;<cluster>" on federated clusters: the submit script must keep the id only
    _bin(fake, "sbatch", f'n=$(( $(wc -l < {log}.sbatch 2>/dev/null || echo 0) + 1 ))\n'
                         f'echo "$*" >> {log}.sbatch\necho "$((1000 + n));cluster"\n')
    _bin(fake, "srun", f'echo "srun" >> {log}\nexec "$@"\n')
    _bin(fake, "python", f'echo "TOKENMIX_RUNS=$TOKENMIX_RUNS $*" >> {log}\n')
    return spec, root / "slurm", fake, log


def _run(script: Path, fake: Path, **env):
    e = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "PY": str(fake / "python"), **env}
    return procs.run(["bash", str(script)], env=e, timeout=60)


def test_headers_array_sizes_and_dependencies(generated):
    spec, folder, fake, log = generated
    pre, ev = (folder / "pretrain.sbatch").read_text(), (folder / "eval.sbatch").read_text()
    for line in ("#SBATCH --array=0-3%3", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4",
                 "#SBATCH --gpus-per-node=4", "#SBATCH --partition=gpu"):
        assert line in pre.splitlines()
    # 2 variants x 2 seeds x 2 tasks evaluations, one GPU each on one node
    for line in ("#SBATCH --array=0-7%3", "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1",
                 "#SBATCH --gpus-per-node=1"):
        assert line in ev.splitlines()
    r = _run(folder / "submit.sh", fake)
    assert r.returncode == 0, r.stderr
    calls = Path(f"{log}.sbatch").read_text().splitlines()
    assert calls == ["--parsable pretrain.sbatch", "--parsable --dependency=afterok:1001 eval.sbatch",
                     "--parsable --dependency=afterany:1002 report.sbatch"]
    rep = (folder / "report.sbatch").read_text()
    assert "--report-only" in rep and "--name=s" in rep and "--seeds=0,1" in rep and "--probe-args= " in rep


def test_every_array_index_runs_its_cell_then_records_it(generated):
    spec, folder, fake, log = generated
    cells = plan(spec)
    pre = [c for c in cells if c.kind == PRETRAIN]
    evals = [c for c in cells if c.kind != PRETRAIN]
    for i, c in enumerate(pre):
        log.unlink(missing_ok=True)
        r = _run(folder / "pretrain.sbatch", fake, SLURM_ARRAY_TASK_ID=str(i))
        assert r.returncode == 0, r.stderr
        srun, cmd, rec = log.read_text().splitlines()
        want = c.command("X")[1:] + ["--trainer.num_nodes=2", "--trainer.devices=4",
                                            "--trainer.accelerator=gpu"]
        assert srun == "srun"
        assert cmd == f"TOKENMIX_RUNS={spec.seed_root(c.seed)} " + " ".join(want)
        assert re.fullmatch(rf"TOKENMIX_RUNS=\S+ -m study\.record --plan \S+plan\.json --cell {re.escape(c.id)} "
                            "--record", rec)
    # a restarted task resumes from its own last.ckpt
    ck = pre[0].checkpoint
    ck.parent.mkdir(parents=True)
    ck.write_bytes(b"x")
    log.unlink()
    assert _run(folder / "pretrain.sbatch", fake, SLURM_ARRAY_TASK_ID="0").returncode == 0
    assert log.read_text().splitlines()[1].endswith(f"--resume {ck}")
    for i, c in enumerate(evals):
        log.unlink(missing_ok=True)
        assert _run(folder / "eval.sbatch", fake, SLURM_ARRAY_TASK_ID=str(i)).returncode == 0
        cmd, rec = log.read_text().splitlines()
        assert cmd == f"TOKENMIX_RUNS={spec.seed_root(c.seed)} " + " ".join(c.command("X")[1:])
        assert f"--cell {c.id} --record" in rec
    assert _run(folder / "eval.sbatch", fake, SLURM_ARRAY_TASK_ID="8").returncode == 2  # no such index


def test_finished_cells_leave_the_arrays(generated, tmp_path):
    spec, folder, fake, log = generated
    from study.store import record
    for c in plan(spec):
        if c.kind == PRETRAIN:
            ck = c.checkpoint
            ck.parent.mkdir(parents=True, exist_ok=True)
            ck.write_bytes(c.id.encode())
            record(c)
    assert main(["--name", "s", "--root", str(spec.root), *ARGS]) == 0
    assert not (folder / "pretrain.sbatch").exists()
    assert "#SBATCH --array=0-7%3" in (folder / "eval.sbatch").read_text()
    log.with_suffix(".log.sbatch").unlink(missing_ok=True)
    assert _run(folder / "submit.sh", fake).returncode == 0
    assert Path(f"{log}.sbatch").read_text().splitlines() == [
        "--parsable eval.sbatch", "--parsable --dependency=afterany:1001 report.sbatch"]


@pytest.mark.parametrize("env,resume", [({}, ""), ({"SLURM_RESTART_COUNT": "0"}, ""),
                                        ({"SLURM_RESTART_COUNT": "2"}, "1"),  # requeued: its own run's last.ckpt
                                        ({"SLURM_RESTART_COUNT": "1", "RESUME": "/r/x.ckpt"}, "/r/x.ckpt")])
def test_paper_sbatch_requeued_resumes_its_run(tmp_path, env, resume):
    # configs/slurm/pretrain_2x8.sbatch under a stand-in srun that logs its command: a requeued job (SLURM sets
    # SLURM_RESTART_COUNT) resumes (a finished run then trains nothing: test_resume_anywhere.py), a first one not
    fake, log = tmp_path / "bin", tmp_path / "srun.log"
    fake.mkdir()
    _bin(fake, "srun", f'printf "%s\\n" "$@" > {log}\n')
    script = Path(__file__).resolve().parents[1] / "configs" / "slurm" / "pretrain_2x8.sbatch"
    e = {k: v for k, v in os.environ.items() if k not in ("RESUME", "SLURM_RESTART_COUNT")}
    r = procs.run(["bash", str(script)], env={**e, "PATH": f"{fake}:{os.environ['PATH']}", "DATA_ROOT": "/d", **env},
                  timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    args = log.read_text().splitlines()
    assert args[args.index("--resume") + 1] == resume
