#!/usr/bin/env bash
# The powered real-model study's runs: the two queues of docs/protocols/realmodel_powered.md ("Commands
# (pre-registered)"), side by side, each in its own process, about 47 CPU-hours in all.
#
#   scripts/realmodel_powered_queue.sh              # both queues (two processes); waits for both
#   scripts/realmodel_powered_queue.sh --queue 1    # one queue only (e.g. on another terminal)
#   scripts/realmodel_powered_queue.sh --dry-run    # print the commands, run nothing
#   scripts/realmodel_powered_queue.sh --publish    # gather the finished runs and commit them (what each run does)
#
# Resumable: run it again after any interruption (a reboot, a kill, a failure). A finished method is skipped, an
# interrupted one resumes from its newest complete checkpoint (saved at every evaluation point, every 12 steps)
# with the records an uninterrupted run gives. Each command is attempted at most twice per invocation of this
# script; a second failure is written to runs/realmodel_powered/logs/failures.log and the queue goes on (the
# protocol: a seed whose GRPO or CAPO + mask run cannot finish after two attempts is left out, and said so:
# python -m studies.realmodel_powered --left-out SEED).
#
# THIS SCRIPT COMMITS. After each finished run (python -m studies.realmodel_study --on-finish), it gathers every finished
# run under runs/realmodel_powered/ into docs/results/realmodel_powered/, one <arm>_seed<s>.json.gz per run
# (python -m studies.realmodel_powered --gather), and commits THAT FOLDER ONLY: `git add` of it and `git commit -- <it>`,
# which leaves anything else staged in the index out of the commit. No commit when no file changed. The two queues take a lock
# (runs/realmodel_powered/.publish.lock) around gathering and committing. Set REALMODEL_POWERED_NO_COMMIT=1 to
# gather without committing.
#
# Logs: runs/realmodel_powered/logs/queue<N>.log (each command's output, appended).
set -euo pipefail

cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
RUNS=runs/realmodel_powered
RECORDS=docs/results/realmodel_powered
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
# the protocol's COMMON settings, word for word
COMMON="--steps 60 --prompts 4 --generations 8 --tokens 8 --levels 1 2 --train-prompts 2000 \
  --eval-prompts 500 --eval-k 4 --eval-every 12 --eval-split test --eval-batch 50 --threads 1"
SELF="scripts/realmodel_powered_queue.sh"

publish() {
  mkdir -p "$RUNS"
  (
    flock 9
    summary=$("$PY" -m studies.realmodel_powered --gather --runs "$RUNS" --records "$RECORDS")
    echo "$summary"
    if [ "${REALMODEL_POWERED_NO_COMMIT:-0}" = 1 ]; then
      exit 0
    fi
    git add -- "$RECORDS"
    if git diff --cached --quiet -- "$RECORDS"; then
      echo "$RECORDS: unchanged, nothing to commit"
    else
      git commit -q -m "Powered real-model study: raw records, ${summary%% ->*}" -- "$RECORDS"
      echo "$RECORDS: committed"
    fi
  ) 9>"$RUNS/.publish.lock"
}

DRY=0
attempt() {  # attempt LOG COMMAND...: run it, once more if it fails (it resumes), then record the failure
  local log=$1
  shift
  if [ "$DRY" = 1 ]; then
    printf '%q ' "$@"
    echo
    return 0
  fi
  for try in 1 2; do
    echo "[$(date -u +%FT%TZ)] attempt $try: $*" >>"$log"
    if "$@" >>"$log" 2>&1; then
      return 0
    fi
  done
  echo "[$(date -u +%FT%TZ)] failed twice: $*" | tee -a "$RUNS/logs/failures.log" >>"$log"
}

queue1() {
  for s in 0 1 2 3 4; do
    # shellcheck disable=SC2086
    attempt "$RUNS/logs/queue1.log" "$PY" -m studies.realmodel_study $COMMON --seed $s --lr 3e-4 \
      --out $RUNS/seed$s --methods grpo,capo_mask --on-finish "$SELF --publish"
  done
}

queue2() {
  for s in 0 1 2 3 4; do
    # shellcheck disable=SC2086
    attempt "$RUNS/logs/queue2.log" "$PY" -m studies.realmodel_study $COMMON --seed $s --lr 3e-4 \
      --out $RUNS/seed$s --methods grpo_decision --on-finish "$SELF --publish"
    # shellcheck disable=SC2086
    attempt "$RUNS/logs/queue2.log" "$PY" -m studies.realmodel_study $COMMON --seed $s --lr 1e-4 \
      --out $RUNS/slow/seed$s --methods grpo --on-finish "$SELF --publish"
  done
}

QUEUE=both
while [ $# -gt 0 ]; do
  case $1 in
    --publish) publish; exit 0 ;;
    --dry-run) DRY=1 ;;
    --queue) QUEUE=${2:?--queue needs 1, 2 or both}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "$SELF: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

[ "$DRY" = 1 ] || mkdir -p "$RUNS/logs"
case $QUEUE in
  1) queue1 ;;
  2) queue2 ;;
  both)
    if [ "$DRY" = 1 ]; then
      echo "# queue 1"; queue1; echo "# queue 2 (at the same time)"; queue2
      exit 0
    fi
    queue1 & q1=$!
    queue2 & q2=$!
    trap 'kill $q1 $q2 2>/dev/null' INT TERM
    wait $q1 $q2
    ;;
  *) echo "$SELF: --queue must be 1, 2 or both, got $QUEUE" >&2; exit 2 ;;
esac
echo "queues done; failures (if any): $RUNS/logs/failures.log"
