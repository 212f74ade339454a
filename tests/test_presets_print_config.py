"""Every pretraining preset and every probe config parses (``--print_config``), so a broken preset fails CI."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from backbones import parse_variant  # noqa: F401  (variant names are validated by main)
from lightning_modules.objectives import OBJECTIVES
from lightning_modules.pretrain import main as pretrain_main
from probes.run import main as probe_main

REPO = Path(__file__).resolve().parents[1]
VARIANTS = sorted(p.stem for p in (REPO / "configs" / "variants").glob("*.yaml"))
PROBE_CONFIGS = sorted((REPO / "configs" / "probe").glob("*.yaml"))


def _printed(capsys) -> dict:
    out = capsys.readouterr().out
    return yaml.safe_load(out[out.index("seed_everything"):])


@pytest.mark.parametrize("objective,preset", [(o, p) for o in OBJECTIVES for p in OBJECTIVES[o].presets])
@pytest.mark.slow
def test_pretrain_preset_prints_config(objective, preset, capsys, tmp_path):
    assert pretrain_main(["--objective", objective, "--preset", preset, "--variant", "entmax+lastvit",
                          "--runs-dir", str(tmp_path), "--print_config"]) == 0
    cfg = _printed(capsys)
    raw = yaml.safe_load((REPO / "configs" / "pretrain" / f"{preset}.yaml").read_text())
    assert cfg["model"]["arch"] == raw["model"]["arch"] and cfg["model"]["variant"] == "entmax+lastvit"
    assert cfg["data"]["batch_size"] == raw["data"]["batch_size"]
    assert cfg["trainer"]["max_epochs"] == raw["trainer"]["max_epochs"]
    if preset == "paper":  # fits the machine it finds: all devices present, one node unless launched on more
        assert cfg["trainer"]["devices"] == "auto" and cfg["trainer"]["num_nodes"] == 1
        assert cfg["data"]["batch_size"] == 64  # per device, the official value


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.slow
def test_every_variant_file_prints_config(variant, capsys, tmp_path):
    assert pretrain_main(["--preset", "tiny", "--variant", variant, "--runs-dir", str(tmp_path),
                          "--print_config"]) == 0
    assert _printed(capsys)["model"]["variant"] == variant


@pytest.mark.parametrize("config", PROBE_CONFIGS, ids=lambda p: p.stem)
def test_probe_config_prints_for_every_task(config, capsys):
    raw = yaml.safe_load(config.read_text())
    for task, settings in (raw.get("tasks") or {}).items():
        assert probe_main(["--task", task, "--config", str(config), "--print-config"]) is None
        cfg = yaml.safe_load(capsys.readouterr().out)
        for key, value in (settings or {}).items():
            assert cfg[key.replace("-", "_")] == value, (config.name, task, key)


def test_slurm_example_names_the_paper_layout():
    sbatch = (REPO / "configs" / "slurm" / "pretrain_2x8.sbatch").read_text()
    assert "--nodes=2" in sbatch and "--ntasks-per-node=8" in sbatch and "--gpus-per-node=8" in sbatch
    assert "srun" in sbatch and "lightning_modules.pretrain" in sbatch
