# tokenmix: every target depends on `install`, so a fresh clone needs nothing else.
# Variables (all optional):  VARIANT=softmax|entmax|registers|specialization|lastvit|entmax+lastvit|...
#   DATA=demo|<dataset>  DATA_ROOT=<folder with the real dataset> (make probe: DATA_ROOT alone = the task's dataset)  TASK=<task>  CKPT=<checkpoint>
#   RESUME=1|<path>  LAYER=<block index>|all  ARGS="<extra LightningCLI / script flags>"
#   OBJECTIVE=dino|supervised (make pretrain: DINO self-distillation, or LaSt-ViT's label-supervised recipe)
#   make study: VARIANTS="v1 v2"  SEEDS=<count or list>  TASKS="t1 t2"  PRESET=demo|tiny|paper  LAUNCHER=local|slurm
#   DRY_RUN=1  STUDY=<name>  AT="25% 50% 100%" (training points evaluated; or e<epoch> / s<step>)  (docs/study.md)
SHELL := /bin/bash
PY := .venv/bin/python
VARIANT ?= softmax
DATA_GIVEN := $(DATA)
DATA ?= demo
DATA_ROOT ?=
TASK ?=
CKPT ?=
DIAL ?=
RESUME ?=
LAYER ?=
KIND ?=
OUT ?=
ARGS ?=
OBJECTIVE ?= dino
# make study (docs/study.md)
STUDY ?=
VARIANTS ?= softmax entmax registers specialization lastvit
SEEDS ?= 3
TASKS ?= knn voc nyuv2 pib corloc
PRESET ?= $(if $(filter demo,$(DATA)),demo,paper)
LAUNCHER ?= local
DRY_RUN ?=
AT ?=

.PHONY: install test test-fast pretrain probe analyze report study check-data export bench kernel-report gpu-check gpu-wheels gpu-compat tensorboard demo-data clean

install: .venv/.installed

.venv/.installed: pyproject.toml
	test -d .venv || python3 -m venv .venv
	.venv/bin/pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $@

# make test: every test (CI); make test-fast: the unit tier only (no training, subprocess or compilation; tests
# that do those are marked slow, tests/helpers/tiers.py). Both print the ten slowest. TEST_ARGS: extra pytest flags.
# TEST_WORKERS: pytest-xdist workers, whole files each, the long files first (tests/helpers/tiers.py); 0 = one process.
TEST_ARGS ?=
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -p no:cacheprovider --durations=10 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
test: install
	$(PYTEST) $(TEST_ARGS) tests

test-fast: install
	$(PYTEST) -m 'not slow' $(TEST_ARGS) tests

demo-data: install
	$(PY) -m datamodules.demo

pretrain: install
	$(PY) -m lightning_modules.pretrain --objective '$(OBJECTIVE)' --variant '$(VARIANT)' --data '$(DATA)' --data-root '$(DATA_ROOT)' --resume '$(RESUME)' $(ARGS)

export: install
	$(PY) -m lightning_modules.export --ckpt '$(CKPT)' --variant '$(VARIANT)' --out '$(OUT)'

probe: install
	$(PY) -m probes.run --task '$(TASK)' --variant '$(VARIANT)' --ckpt '$(CKPT)' --data '$(DATA_GIVEN)' --data-root '$(DATA_ROOT)' --layer '$(LAYER)' --kind '$(KIND)' $(ARGS)

analyze: install
	$(PY) -m analysis.run --task '$(TASK)' --variant '$(VARIANT)' --ckpt '$(CKPT)' --data '$(DATA)' --data-root '$(DATA_ROOT)' $(if $(DIAL),--dial '$(DIAL)') $(ARGS)

report: install
	$(PY) -m analysis.report $(ARGS)

study: install
	$(PY) -m study --name '$(STUDY)' --variants '$(VARIANTS)' --seeds '$(SEEDS)' --tasks '$(TASKS)' --preset '$(PRESET)' --data '$(DATA)' --data-root '$(DATA_ROOT)' --launcher '$(LAUNCHER)' --at '$(AT)' $(if $(filter-out 0 no false,$(DRY_RUN)),--dry-run) $(ARGS)

check-data: install
	$(PY) -m datamodules.check --task '$(TASK)' --data-root '$(DATA_ROOT)' $(ARGS)

bench: install
	$(PY) -m bench.run $(ARGS)

# the static kernel model, no GPU needed: the Triton kernels compiled for sm_90/sm_80, SASS counted, predicted time
# (ARGS e.g. "--target sm_90 --n 197 --dtype bf16 --json FILE"; kernel_model/report.py --help)
kernel-report: install
	$(PY) -m kernel_model $(ARGS)

# CUDA only (prints "no CUDA GPU: skipped" elsewhere; ARGS="--smoke --out DIR": the CPU rehearsal), parts (a)-(e),
# docs/performance.md "GPU check". PYTHON=python3: that interpreter as it is (no .venv, no install, no network);
# what it lacks comes from .whl/ (`make gpu-wheels`, run where there is network), installed into a temporary
# folder first. `make gpu-compat` (not in CI) rehearses that in a scratch venv with the GPU image's versions.
PYTHON ?=
GPU_PY = $(or $(PYTHON),$(PY))
GPU_DEPS = $(if $(PYTHON),,install)
GPU_WHEELS = entmax==1.3 jsonargparse==4.53.0 docstring-parser==0.18.0 typeshed-client==2.15.0 rich==15.0.0 \
	markdown-it-py==4.3.0 mdurl==0.1.2 pygments==2.21.0
COMPAT_PYTHON ?= python3.12
COMPAT_VENV ?= .gpu-compat
COMPAT_PKGS = torch==2.11.0 triton==3.6.0 torchvision==0.26.0 lightning==2.6.6 torchmetrics==1.9.0 timm==1.0.31 \
	tensorboard pyyaml numpy pillow

gpu-check: $(GPU_DEPS)
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	if [ -n "$(PYTHON)" ]; then \
	  if ls .whl/*.whl >/dev/null 2>&1; then \
	    $(GPU_PY) -m pip install --quiet --disable-pip-version-check --no-index --no-deps --find-links .whl \
	      --target "$$tmp" .whl/*.whl || for w in .whl/*.whl; do $(GPU_PY) -m zipfile -e "$$w" "$$tmp"; done; \
	  else echo "no .whl/ here: run 'make gpu-wheels' where there is network and copy .whl/ along"; fi; \
	fi; \
	PYTHONPATH="$$tmp:$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" $(GPU_PY) -m gpu_check $(ARGS)

gpu-wheels: $(GPU_DEPS)
	$(GPU_PY) -m pip download --quiet --disable-pip-version-check --only-binary=:all: --no-deps \
		--python-version 3.12 --implementation cp --abi cp312 --platform manylinux_2_28_x86_64 \
		--platform any -d .whl $(GPU_WHEELS)

gpu-compat: gpu-wheels
	test -x $(COMPAT_VENV)/bin/python || $(COMPAT_PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/pip install --quiet --disable-pip-version-check $(COMPAT_PKGS)
	$(COMPAT_VENV)/bin/python -c "import importlib.util as u, sys; bad = [m for m in ('entmax', 'jsonargparse', \
		'mmseg', 'mmcv', 'mmengine') if u.find_spec(m)]; sys.exit(f'not the GPU image: has {bad}' if bad else 0)"
	$(MAKE) gpu-check PYTHON=$(COMPAT_VENV)/bin/python ARGS="--smoke --out $(or $(OUT),runs/gpu-compat) $(ARGS)"

tensorboard: install
	.venv/bin/tensorboard --logdir runs

clean:
	rm -rf runs data/demo
