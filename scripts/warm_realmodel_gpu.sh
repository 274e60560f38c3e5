#!/usr/bin/env bash
# The warm real-model study's full design on one GPU (docs/protocols/warm_realmodel.md, "full"): every (arm, seed)
# of `python -m studies.warm_realmodel --run full` in its own process, SLOTS at a time (one CPU core each: the runs
# are bound by Python, not by the GPU), seeds in order so the primary endpoint's pairs complete first. Each run
# resumes from its newest checkpoint when the script runs again; each finished run is packed into RECORDS.
#
#   scripts/warm_realmodel_gpu.sh                      # the study (about 10 minutes on one GPU, estimated)
#   DEVICE=cpu TINY=1 SEEDS=0 SLOTS=2 RECORDS=/tmp/rehearsal RUNS=/tmp/rehearsal_runs scripts/warm_realmodel_gpu.sh
#                                                      # the rehearsal on the CPU: tiny size, seed 0's three runs
#
# SLOTS (default 8), DEADLINE (seconds, default none: runs still going then are stopped, resumable), RUNS (default
# runs/warm_realmodel), RECORDS (default docs/results/warm_realmodel), DEVICE (default cuda), TINY (1: the design
# at tiny size, never into the study's records), SEEDS (comma-separated: only these seeds; default the design's),
# PYTHON (default python3). Logs: $RUNS/logs/<arm>_seed<s>.log and
# $RUNS/logs/pool.log (each run's UTC start and end, and the commit). It does not commit: the records are committed
# by hand after it ends.
set -euo pipefail

cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
RUNS=${RUNS:-runs/warm_realmodel}
RECORDS=${RECORDS:-docs/results/warm_realmodel}
SLOTS=${SLOTS:-8}
DEVICE=${DEVICE:-cuda}
TINY_FLAG=""
if [ "${TINY:-0}" = 1 ]; then TINY_FLAG="--tiny"; fi
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$RUNS/logs" "$RECORDS"
END=$(( $(date +%s) + ${DEADLINE:-0} ))
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)

# the warm model merged once, before the processes start (each would otherwise wait on the merge's lock)
"$PY" -c "from calibrl.models import resolve_model; resolve_model('builtin:smollm2-135m-warm')"

jobs=$("$PY" -c "from studies.warm_realmodel import DESIGNS as D; d = D['full']
seeds = [int(x) for x in '${SEEDS:-}'.split(',') if x] or d['seeds']
print('\n'.join(f'{a} {s}' for s in seeds for a in d['arms']))")

run_one() {  # run_one ARM SEED
  local left=0
  if [ "${DEADLINE:-0}" != 0 ]; then
    left=$(( END - $(date +%s) ))
    if [ "$left" -le 0 ]; then
      echo "[$(date -u +%FT%TZ)] $1 seed $2: not started (deadline)" >>"$RUNS/logs/pool.log"
      return 0
    fi
  fi
  echo "[$(date -u +%FT%TZ)] $1 seed $2: start (commit $COMMIT, device $DEVICE)" >>"$RUNS/logs/pool.log"
  local rc=0
  # shellcheck disable=SC2086
  timeout "$left" "$PY" -m studies.warm_realmodel --run full --arms "$1" --seeds "$2" --device "$DEVICE" \
    --runs "$RUNS" --records "$RECORDS" $TINY_FLAG >>"$RUNS/logs/$1_seed$2.log" 2>&1 || rc=$?
  if [ "$rc" = 0 ]; then
    echo "[$(date -u +%FT%TZ)] $1 seed $2: finished" >>"$RUNS/logs/pool.log"
  else
    echo "[$(date -u +%FT%TZ)] $1 seed $2: stopped, exit $rc (rerun this script to resume it)" >>"$RUNS/logs/pool.log"
  fi
}
export -f run_one
export PY RUNS RECORDS DEVICE END DEADLINE TINY_FLAG COMMIT

printf '%s\n' "$jobs" | xargs -P "$SLOTS" -L 1 bash -c 'run_one "$@"' _
cat "$RUNS/logs/pool.log"
