"""Launch checks that run before Lightning starts any process: node count from the cluster, refusal of
num_nodes > 1 on a plain machine, the DDP process-group timeout, the dataset layout, the scale line."""
from __future__ import annotations

from datetime import timedelta

import pytest

from lightning_modules.pretrain import main
from tokenmix.launch import (LaunchError, cluster_environment, cluster_num_nodes, count_devices, ddp_strategy,
                             refuse_unlaunched_multinode)

CLUSTER_VARS = ("SLURM_NTASKS", "SLURM_NNODES", "SLURM_JOB_NAME", "SLURM_JOB_NUM_NODES", "RANK", "GROUP_RANK",
                "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "LSB_JOBID", "LSB_DJOB_RANKFILE",
                "JSM_NAMESPACE_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


@pytest.fixture
def plain_machine(monkeypatch):
    for v in CLUSTER_VARS:
        monkeypatch.delenv(v, raising=False)
    return monkeypatch


def test_nodes_come_from_slurm_and_torchrun(plain_machine):
    assert cluster_environment() is None and cluster_num_nodes() is None
    with pytest.raises(LaunchError, match=r"num_nodes=2.*srun.*torchrun"):
        refuse_unlaunched_multinode(2)
    refuse_unlaunched_multinode(1)
    plain_machine.setenv("SLURM_NTASKS", "16")
    plain_machine.setenv("SLURM_NNODES", "2")
    plain_machine.setenv("SLURM_JOB_NAME", "tokenmix-dino")
    assert cluster_environment() == "SLURMEnvironment" and cluster_num_nodes() == 2
    refuse_unlaunched_multinode(2)  # launched by srun: fine
    for v in ("SLURM_NTASKS", "SLURM_NNODES", "SLURM_JOB_NAME"):
        plain_machine.delenv(v)
    for k, v in {"RANK": "9", "GROUP_RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "8",
                 "WORLD_SIZE": "16", "TORCHELASTIC_RUN_ID": "x"}.items():
        plain_machine.setenv(k, v)
    assert cluster_environment() == "TorchElasticEnvironment" and cluster_num_nodes() == 2


def test_ddp_gets_the_process_group_timeout():
    from lightning.pytorch.strategies import DDPStrategy
    s = ddp_strategy("auto", "cpu", 2, 1, timeout_min=3)
    assert isinstance(s, DDPStrategy) and s._timeout == timedelta(minutes=3)
    assert ddp_strategy("auto", "cpu", 1, 1) == "auto"  # one process: no process group at all
    assert isinstance(ddp_strategy("ddp", "cpu", 1, 2), DDPStrategy)
    assert ddp_strategy("fsdp", "cpu", 2, 1) == "fsdp"  # an explicit other strategy is left alone
    assert count_devices("cpu", "auto") == 1 and count_devices("cpu", "0,1") == 2 and count_devices("cpu", [0]) == 1


@pytest.mark.slow  # LightningCLI's parser starts a Python process (jsonargparse's stub resolver)
def test_multinode_without_launcher_is_refused_before_spawning(plain_machine, tmp_path, capsys):
    code = main(["--variant", "softmax", "--preset", "tiny", "--runs-dir", str(tmp_path),
                 "--trainer.num_nodes=2", "--trainer.enable_progress_bar=false"])
    err = capsys.readouterr().err
    assert code == 2 and "num_nodes=2" in err and "srun" in err and "torchrun" in err
    assert not list(tmp_path.rglob("*.ckpt"))


@pytest.mark.slow  # LightningCLI's parser starts a Python process (jsonargparse's stub resolver)
def test_a_config_files_num_nodes_is_checked(plain_machine, tmp_path, capsys):
    """The check reads the configuration LightningCLI resolves: a --config file's num_nodes counts as the flag does,
    and under SLURM the job's node count fills in where the user's arguments leave the preset's."""
    from lightning_modules.cli import PretrainCLI
    from lightning_modules.pretrain import parse_launch
    two = tmp_path / "two_nodes.yaml"
    two.write_text("trainer:\n  num_nodes: 2\n")
    code = main(["--preset", "tiny", "--runs-dir", str(tmp_path), "--config", str(two)])
    err = capsys.readouterr().err
    assert code == 2 and "num_nodes=2" in err and "srun" in err
    for k, v in {"SLURM_NTASKS": "2", "SLURM_NNODES": "2", "SLURM_JOB_NAME": "tokenmix-dino"}.items():
        plain_machine.setenv(k, v)
    resolved = lambda *a: PretrainCLI(parse_launch(["--preset", "tiny", "--runs-dir", str(tmp_path), *a]),  # noqa
                                      build=False).config.trainer.num_nodes
    assert resolved() == 2 and resolved("--config", str(two)) == 2  # from SLURM_NNODES; as the file says
    three = tmp_path / "three_nodes.yaml"
    three.write_text("trainer:\n  num_nodes: 3\n")
    assert resolved("--config", str(three)) == 3  # the user's file wins over the environment


@pytest.mark.slow  # LightningCLI's parser starts a Python process (jsonargparse's stub resolver)
def test_wrong_data_root_is_named_before_spawning(plain_machine, tmp_path, capsys):
    missing = tmp_path / "no_imagenet_here"
    code = main(["--variant", "softmax", "--data", "imagenet", "--data-root", str(missing), "--preset", "tiny",
                 "--runs-dir", str(tmp_path), "--trainer.devices=2", "--trainer.enable_progress_bar=false"])
    err = capsys.readouterr().err
    assert code == 2 and str(missing) in err and "train/<wnid>/*.JPEG" in err


@pytest.mark.slow
def test_paper_preset_on_this_machine_prints_the_scale_line(plain_machine, fixtures_root, tmp_path, capfd):
    # one process on a CPU machine; 1 step of batch 2 (ViT-S/16, 2 x 224 + 8 x 96 crops)
    code = main(["--variant", "softmax", "--data", "imagenet", "--data-root", str(fixtures_root / "imagenet"),
                 "--runs-dir", str(tmp_path), "--data.batch_size=2", "--trainer.max_steps=1",
                 "--trainer.accelerator=cpu",  # a real dataset on the CPU: chosen explicitly (tokenmix/launch.py)
                 "--data.num_workers=0", "--trainer.enable_progress_bar=false", "--trainer.callbacks=[]"])
    out = capfd.readouterr()  # Lightning's log handler writes to the real stderr
    assert code == 0, out.err[-3000:]
    text = out.out + out.err
    assert "scale: world size 1 (1 node(s) x 1 CPU device(s)), batch 2 per device x 1 = 2 total" in text
    assert "lr 3.91e-06 (base 0.0005 x 2/256), precision 32-true" in text and "x the paper's 1024" in text
