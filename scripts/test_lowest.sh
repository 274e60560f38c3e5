#!/usr/bin/env bash
# The low end of calibrl's ranges: a fresh virtual environment with the LOWEST version pyproject.toml allows of
# every direct dependency (uv's `--resolution lowest-direct`; what they pull in is resolved as usual), then the core
# suite (the test files that need no TRL, transformers or datasets). The high end is `make test`.
#
# Usage:  bash scripts/test_lowest.sh [VENV_DIR]      (default .venv-lowest; rebuilt from scratch on every run)
# Env:    PYTHON (default python3)
#         EXTRAS (default dev): the extras installed at their lowest too, e.g. EXTRAS=all,dev
#         TESTS  (default the core suite below): the test files to run
# Downloads the floor releases from PyPI (torch's floor is a CUDA build from PyPI: a few GB the first time;
# uv caches it). The installed versions are written to VENV_DIR/lowest-versions.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-lowest}"
PYTHON="${PYTHON:-python3}"
EXTRAS="${EXTRAS:-dev}"
CORE_TESTS=(
    tests/test_install.py tests/test_advantages.py tests/test_batch.py tests/test_decision_stationary.py
    tests/test_metrics.py tests/test_abstention_guarantee.py tests/test_paired_bootstrap.py tests/test_posthoc.py
    tests/test_selection.py tests/test_rewards.py tests/test_samples.py tests/test_formats.py tests/test_styles.py
    tests/test_eval_cli.py tests/test_eval_paths.py tests/test_eval_real_files.py tests/test_eval_report.py
    tests/test_eval_scale.py tests/test_verl.py
)
# the TRL tests of a mostly-core file
CORE_DESELECT=(
    --deselect tests/test_paired_bootstrap.py::test_real_model_matched_accuracy_uses_the_paired_interval_when_records_keep_samples
    --deselect tests/test_paired_bootstrap.py::test_real_model_runs_keep_each_evaluations_samples
)
if [ -n "${TESTS:-}" ]; then
    # shellcheck disable=SC2206
    TESTS=($TESTS); CORE_DESELECT=()
else
    TESTS=("${CORE_TESTS[@]}")
fi

start=$(date +%s)
"$PYTHON" -m venv --clear "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check uv
"$VENV/bin/python" -m uv pip install --python "$VENV/bin/python" --resolution lowest-direct -e ".[$EXTRAS]"
"$VENV/bin/python" -m uv pip freeze --python "$VENV/bin/python" > "$VENV/lowest-versions.txt"
echo "test_lowest: installed in $(( $(date +%s) - start )) s; versions in $VENV/lowest-versions.txt"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "${TESTS[@]}" "${CORE_DESELECT[@]}"
