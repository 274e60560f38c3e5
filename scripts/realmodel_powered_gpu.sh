#!/usr/bin/env bash
# The powered real-model study's 20 runs on one GPU (docs/protocols/realmodel_powered.md, amendment 5): the
# pre-registered commands of scripts/realmodel_powered_queue.sh plus `--device cuda`, each run in its own process,
# SLOTS processes at a time (one CPU core each: the runs are bound by Python, not by the GPU), in the order that
# completes the primary endpoint first (GRPO and CAPO + mask of seeds 0-4, then decision CE and slow GRPO).
#
#   scripts/realmodel_powered_gpu.sh                    # all 20 runs; waits for them; then gathers the records
#   SLOTS=8 DEADLINE=540 scripts/realmodel_powered_gpu.sh
#
# SLOTS (default 10, the amendment's "up to 10 at a time"): processes at a time. DEADLINE (seconds, default
# none): every run still going then is stopped (it resumes from its newest checkpoint when this script runs
# again: the same run folders; protocol amendment 6). RUNS (default runs/realmodel_powered) and RECORDS (default
# docs/results/realmodel_powered): where the runs go and
# where `python -m studies.realmodel_powered --gather` writes the finished ones. PYTHON (default python3). EXTRA_ARGS:
# appended to every command (they override the protocol's: a smoke test, never the study). DEVICE (default cuda).
# Unlike the CPU queue it does not commit: the records are committed by hand after it ends.
#
# Logs: $RUNS/logs/gpu_<arm>_seed<s>.log (each run's output); $RUNS/logs/gpu_pool.log (start and end of each).
set -euo pipefail

cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
RUNS=${RUNS:-runs/realmodel_powered}
RECORDS=${RECORDS:-docs/results/realmodel_powered}
SLOTS=${SLOTS:-10}
DEVICE=${DEVICE:-cuda}
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
# the protocol's COMMON settings, word for word (as scripts/realmodel_powered_queue.sh)
COMMON="--steps 60 --prompts 4 --generations 8 --tokens 8 --levels 1 2 --train-prompts 2000 \
  --eval-prompts 500 --eval-k 4 --eval-every 12 --eval-split test --eval-batch 50 --threads 1"
mkdir -p "$RUNS/logs"
END=$(( $(date +%s) + ${DEADLINE:-0} ))

# the built-in model converted once, before the processes start (each would otherwise convert it at once)
"$PY" -c "from calibrl.models import resolve_model; resolve_model('builtin:smollm2-135m-instruct')"

jobs=()  # "<name> <lr> <out> <method> <seed>", the primary endpoint's runs first
for s in 0 1 2 3 4; do
  jobs+=("grpo_seed$s 3e-4 $RUNS/seed$s grpo $s" "capo_mask_seed$s 3e-4 $RUNS/seed$s capo_mask $s")
done
for s in 0 1 2 3 4; do
  jobs+=("grpo_decision_seed$s 3e-4 $RUNS/seed$s grpo_decision $s" "slow_grpo_seed$s 1e-4 $RUNS/slow/seed$s grpo $s")
done

run_one() {  # run_one NAME LR OUT METHOD SEED
  local left=0
  if [ "${DEADLINE:-0}" != 0 ]; then
    left=$(( END - $(date +%s) ))
    if [ "$left" -le 0 ]; then
      echo "[$(date -u +%FT%TZ)] $1: not started (deadline)" >>"$RUNS/logs/gpu_pool.log"
      return 0
    fi
  fi
  echo "[$(date -u +%FT%TZ)] $1: start" >>"$RUNS/logs/gpu_pool.log"
  local rc=0
  # shellcheck disable=SC2086
  timeout "$left" "$PY" -m studies.realmodel_study $COMMON --device "$DEVICE" --seed "$5" --lr "$2" --out "$3" \
    --methods "$4" ${EXTRA_ARGS:-} >>"$RUNS/logs/gpu_$1.log" 2>&1 || rc=$?
  if [ "$rc" = 0 ]; then
    echo "[$(date -u +%FT%TZ)] $1: finished" >>"$RUNS/logs/gpu_pool.log"
  else
    echo "[$(date -u +%FT%TZ)] $1: stopped, exit $rc (rerun this script to resume it)" >>"$RUNS/logs/gpu_pool.log"
  fi
}
export -f run_one
export PY RUNS DEVICE COMMON END DEADLINE EXTRA_ARGS

printf '%s\n' "${jobs[@]}" | xargs -P "$SLOTS" -L 1 bash -c 'run_one "$@"' _
"$PY" -m studies.realmodel_powered --gather --runs "$RUNS" --records "$RECORDS"
