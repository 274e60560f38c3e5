# Two commands on a fresh machine:
#   make demo   -> creates .venv, installs calibrl (CPU torch), runs the built-in demo (report in runs/demo)
#   make test   -> creates .venv, installs calibrl with test extras, runs the whole test suite;
#                  then builds .venv-verl (verl 0.9.1, kept apart from TRL's pins) and runs the verl plugin tests
# On a CPU-only machine whose pip would pull a CUDA torch, set TORCH_INDEX=https://download.pytorch.org/whl/cpu
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
BIN := $(VENV)/bin

.PHONY: setup demo test bench clean

$(BIN)/calibrl: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(BIN)/calibrl

setup: $(BIN)/calibrl

demo: setup
	$(BIN)/calibrl demo --out runs/demo

test: setup
	$(BIN)/python -m pytest
	TORCH_SPEC="$(TORCH_SPEC)" TORCH_INDEX="$(TORCH_INDEX)" PYTHON=$(PYTHON) bash scripts/setup_verl_env.sh .venv-verl
	.venv-verl/bin/python -m pytest tests/test_verl.py

bench: setup
	$(BIN)/python bench/advantages.py
	$(BIN)/python bench/metrics.py

clean:
	rm -rf $(VENV) .venv-verl runs .pytest_cache
