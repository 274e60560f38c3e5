#!/usr/bin/env bash
# The test suite under several instruction sets and thread counts on one machine (docs/testing.md, "Across CPUs").
#
#   bash scripts/test_isa.sh [VENV] [pytest arguments...]      (make test-isa; default: .venv, the whole suite)
#
# A float sum's rounding depends on the kernels the CPU runs (AVX-512, AVX2 or SSE code in ATen, MKL and oneDNN)
# and on how many threads split it, so a test that passes only on one of them asserts one machine's trajectory.
# Each combination below runs the suite in a fresh process with:
#   ATEN_CPU_CAPABILITY   PyTorch's own vectorised kernels (default = no vector ISA, avx2, avx512)
#   MKL_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA   the BLAS (MKL) and oneDNN restricted to the same level
#   OMP_NUM_THREADS, MKL_NUM_THREADS              1 or 2 threads (tests that pin torch to 1 thread keep 1)
# avx512 is tried only where the CPU has it. The summary (one line per combination, pass or fail with the failing
# tests) goes to stdout and to runs/test-isa/summary.txt; each combination's pytest log beside it.
set -uo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv}"
shift || true
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(tests)
out=runs/test-isa
mkdir -p "$out"

levels=("default SSE4_2 SSE41" "avx2 AVX2 AVX2")
if grep -q avx512f /proc/cpuinfo 2>/dev/null; then
    levels+=("avx512 AVX512 AVX512_CORE")
fi
summary="$out/summary.txt"
: > "$summary.tmp"
status=0
for level in "${levels[@]}"; do
    read -r aten mkl onednn <<< "$level"
    for threads in 1 2; do
        name="aten-${aten}_threads-${threads}"
        start=$(date -u +%FT%TZ)
        ATEN_CPU_CAPABILITY=$aten MKL_ENABLE_INSTRUCTIONS=$mkl ONEDNN_MAX_CPU_ISA=$onednn \
            OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads \
            "$venv/bin/python" -m pytest -p no:cacheprovider -rf "${args[@]}" > "$out/$name.log" 2>&1
        rc=$?
        capability=$(ATEN_CPU_CAPABILITY=$aten "$venv/bin/python" -c \
            "import torch; print(torch.backends.cpu.get_cpu_capability())" 2>/dev/null)
        result=$(grep -E "^[0-9]+ (passed|failed)|^=+ .*(passed|failed).* =+$" "$out/$name.log" | tail -n 1 | tr -d '=')
        line="$name (torch reports ${capability:-?}; MKL $mkl, oneDNN $onednn): ${result:-no summary} [$start .. $(date -u +%FT%TZ)]"
        if [ $rc -ne 0 ]; then
            status=1
            line="$line FAILED: $(grep -E '^FAILED ' "$out/$name.log" | cut -d' ' -f2 | tr '\n' ' ')"
        fi
        echo "$line" | tee -a "$summary.tmp"
    done
done
mv "$summary.tmp" "$summary"
exit $status
