# fourm-kfp developer entry points. `make demo` runs the whole pipeline locally; `make test` runs the suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-done
UV := $(BIN)/uv pip install --python $(BIN)/python -q --compile-bytecode
DEMO_ROOT ?= runs/demo
PROOF_ROOT ?= runs/proof

.PHONY: setup demo proof test compile bench device-wheels ui clean

setup: $(STAMP)

# torch goes first and pinned: any other torch requirement pulls GBs of CUDA packages on CPU machines.
# torchx (`fourm-kfp launch`, src/fourm_kfp/launchers/torchx_job.py) goes last, with --no-deps: torchx 0.7.0 declares
# urllib3<1.27, a stale bound (removed upstream after 0.7.0) that kfp's urllib3==2.7.0 contradicts, so pip cannot
# resolve both. Its other requirements (pyproject.toml's `launch` extra) are installed pinned from the lock first.
# pip installs torch (the machine's pip configuration says where its CPU build lies) and uv, pinned in the lock; uv
# installs the rest, the same pinned set, downloading, unpacking and compiling to bytecode on every core: 0.9 min
# where pip alone took 2.1 (docs/records/2026-12-02-test-suite-time.md).
# `pip check` reports exactly one complaint, "torchx 0.7.0 has requirement
# urllib3<1.27,>=1.21.1, but you have urllib3 2.7.0." (tests/test_torchx_launch.py fails on any other).
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -c constraints.txt torch==2.13.0 uv
	$(UV) -c constraints.txt -e ".[dev,launch]"
	$(UV) --no-deps -c constraints.txt torchx
	touch $(STAMP)

demo: setup
	$(BIN)/fourm-kfp run --preset demo --root $(DEMO_ROOT) --summary $(DEMO_ROOT)/summary.json

# The CPU proof that the model learns (README, "What the demo reaches"; docs/records/): about 40 minutes on 2 cores.
proof: setup
	$(BIN)/fourm-kfp run --preset proof --root $(PROOF_ROOT) --summary $(PROOF_ROOT)/summary.json

# On every CPU the machine has (pytest-xdist; `make test TEST_WORKERS=4` to choose): tests/conftest.py deals out
# whole units (a module, the second smoke run's tests), slow units first; --no-loadscope-reorder keeps that order.
TEST_WORKERS ?= logical
# The package's bytecode first: where PYTHONDONTWRITEBYTECODE is set, every process the suite starts (over 200:
# pipeline steps, ranks, CLI calls) would otherwise compile the package modules it imports, up to 0.1 s each.
test: setup
	$(BIN)/python -m compileall -q src
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

# The MLflow UI on the demo's store (another run folder: make ui DEMO_ROOT=runs/x). The full mlflow package, which
# serves it, is the optional `ui` extra: installed here on first use, never in the stage images.
ui: $(VENV)/.ui-done
	$(BIN)/fourm-kfp ui --root $(DEMO_ROOT)

$(VENV)/.ui-done: $(STAMP)
	$(BIN)/python -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[ui]"
	touch $@

compile: setup
	$(BIN)/fourm-kfp compile --output pipelines/fourm_pretrain.yaml

bench: setup
	$(BIN)/python bench/prepare_data.py
	$(BIN)/python bench/labelers.py

# Wheels the GPU device machine's image lacks, for bench/gpu_session.sh (carried there as .whl/).
device-wheels: setup
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux2014_x86_64 -d .whl webdataset==1.0.2 braceexpand==0.1.7

clean:
	rm -rf $(VENV) runs .pytest_cache
