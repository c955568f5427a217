# fourm-kfp developer entry points. `make demo` runs the whole pipeline locally; `make test` runs the suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-done
DEMO_ROOT ?= runs/demo

.PHONY: setup demo test compile bench clean

setup: $(STAMP)

# torch goes first and pinned: any other torch requirement pulls GBs of CUDA packages on CPU machines.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/python -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[dev]"
	touch $(STAMP)

demo: setup
	$(BIN)/fourm-kfp run --preset demo --root $(DEMO_ROOT) --summary $(DEMO_ROOT)/summary.json

test: setup
	$(BIN)/python -m pytest

compile: setup
	$(BIN)/fourm-kfp compile --output pipelines/fourm_pretrain.yaml

bench: setup
	$(BIN)/python bench/prepare_data.py

clean:
	rm -rf $(VENV) runs .pytest_cache
