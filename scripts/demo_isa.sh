#!/usr/bin/env bash
# make demo's run (calibrl demo, 200 steps) under each instruction set, each with its own warm-start cache
# (docs/testing.md, "The demo under each instruction set"). Output: runs/demo-isa/<level>/demo/report.md.
#
#   bash scripts/demo_isa.sh [VENV]        (default .venv; about 12 minutes per level on 2 cores)
set -uo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv}"
levels=("default SSE4_2 SSE41" "avx2 AVX2 AVX2")
if grep -q avx512f /proc/cpuinfo 2>/dev/null; then
    levels+=("avx512 AVX512 AVX512_CORE")
fi
mkdir -p runs/demo-isa
for level in "${levels[@]}"; do
    read -r aten mkl onednn <<< "$level"
    out=runs/demo-isa/$aten
    echo "$aten start $(date -u +%FT%TZ)" | tee -a runs/demo-isa/times.txt
    CALIBRL_CACHE=$out/cache ATEN_CPU_CAPABILITY=$aten MKL_ENABLE_INSTRUCTIONS=$mkl ONEDNN_MAX_CPU_ISA=$onednn \
        "$venv/bin/calibrl" demo --out "$out/demo" > "$out.log" 2>&1
    echo "$aten end $(date -u +%FT%TZ) rc=$?" | tee -a runs/demo-isa/times.txt
done
