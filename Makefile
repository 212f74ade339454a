# tokenmix: every target depends on `install`, so a fresh clone needs nothing else.
# Variables (all optional):  VARIANT=softmax|entmax|registers|specialization|lastvit|entmax+lastvit|...
#   DATA=demo|<dataset>  DATA_ROOT=<folder with the real dataset>  TASK=<task>  CKPT=<checkpoint>
#   RESUME=1|<path>  LAYER=<block index>|all  ARGS="<extra LightningCLI / script flags>"
#   OBJECTIVE=dino|supervised (make pretrain: DINO self-distillation, or LaSt-ViT's label-supervised recipe)
#   make study: VARIANTS="v1 v2"  SEEDS=<count or list>  TASKS="t1 t2"  PRESET=demo|tiny|paper  LAUNCHER=local|slurm
#   DRY_RUN=1  STUDY=<name>  (docs/study.md)
SHELL := /bin/bash
PY := .venv/bin/python
VARIANT ?= softmax
DATA ?= demo
DATA_ROOT ?=
TASK ?=
CKPT ?=
RESUME ?=
LAYER ?=
OUT ?=
ARGS ?=
OBJECTIVE ?= dino
PRETRAIN_ENTRY = $(if $(filter supervised,$(OBJECTIVE)),supervised,$(if $(filter dino,$(OBJECTIVE)),pretrain,$(error OBJECTIVE=$(OBJECTIVE): valid are dino, supervised)))
# make study (docs/study.md)
STUDY ?=
VARIANTS ?= softmax entmax registers specialization lastvit
SEEDS ?= 3
TASKS ?= knn voc nyuv2 pib corloc
PRESET ?= $(if $(filter demo,$(DATA)),demo,paper)
LAUNCHER ?= local
DRY_RUN ?=

.PHONY: install test pretrain probe analyze report study check-data export bench gpu-check tensorboard demo-data clean

install: .venv/.installed

.venv/.installed: pyproject.toml
	test -d .venv || python3 -m venv .venv
	.venv/bin/pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $@

test: install
	$(PY) -m pytest -q -p no:cacheprovider tests

demo-data: install
	$(PY) -m datamodules.demo

pretrain: install
	$(PY) -m lightning_modules.$(PRETRAIN_ENTRY) --variant '$(VARIANT)' --data '$(DATA)' --data-root '$(DATA_ROOT)' --resume '$(RESUME)' $(ARGS)

export: install
	$(PY) -m lightning_modules.export --ckpt '$(CKPT)' --variant '$(VARIANT)' --out '$(OUT)'

probe: install
	$(PY) -m probes.run --task '$(TASK)' --variant '$(VARIANT)' --ckpt '$(CKPT)' --data '$(DATA)' --data-root '$(DATA_ROOT)' --layer '$(LAYER)' $(ARGS)

analyze: install
	$(PY) -m analysis.run --task '$(TASK)' --variant '$(VARIANT)' --ckpt '$(CKPT)' --data '$(DATA)' --data-root '$(DATA_ROOT)' $(ARGS)

report: install
	$(PY) -m analysis.report $(ARGS)

study: install
	$(PY) -m study --name '$(STUDY)' --variants '$(VARIANTS)' --seeds '$(SEEDS)' --tasks '$(TASKS)' --preset '$(PRESET)' --data '$(DATA)' --data-root '$(DATA_ROOT)' --launcher '$(LAUNCHER)' $(if $(filter-out 0 no false,$(DRY_RUN)),--dry-run) $(ARGS)

check-data: install
	$(PY) -m datamodules.check --task '$(TASK)' --data-root '$(DATA_ROOT)' $(ARGS)

bench: install
	$(PY) -m bench.run $(ARGS)

# CUDA only (prints "no CUDA GPU: skipped" elsewhere): Triton kernel check, ViT and DINO-step timings
gpu-check: install
	$(PY) -m bench.gpu_check $(ARGS)

tensorboard: install
	.venv/bin/tensorboard --logdir runs

clean:
	rm -rf runs data/demo
