#!/usr/bin/env bash
# One device call in stages: each stage has its own time limit, its output goes into one log
# ($OUT/session.log, which comes back) and its last lines and exit status are printed, so a stage
# that hangs or fails costs only its own limit and the others still report.
#
#   bash benchmarks/gpu_session.sh STAGE[:SECONDS] ...
#
# Stages (default limits): quantize (150) tests/test_gpu_quantize.py; gemm (200)
# tests/test_gpu_gemm.py; grouped (150) gpu_gemm.py --grouped; fused (300) tests/test_gpu_fused.py;
# fused-check (300) gpu_fused.py --check; fused-bench (150) gpu_fused.py --bench at the issue's
# shapes; gemm-bench (300) gpu_gemm.py --bench. gemm_wgmma.cu's instances are compiled first in
# the background (gpu_warm.py); stages that launch them wait for it with `wait` on its PID (never
# `pgrep -f`, which matches the shell running this command's own text). WARM_S (default 240)
# bounds that compile; a fresh machine needs more when most instances are still uncached.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=.:benchmarks
STAGES="quantize gemm grouped fused fused-check fused-bench gemm-bench"
for arg in "$@"; do
  case " $STAGES " in
    *" ${arg%%:*} "*) ;;
    *) echo "gpu_session: unknown stage ${arg%%:*}; known: $STAGES"; exit 2 ;;
  esac
done
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"
log="$OUT/session.log"
: > "$log"

timeout "${WARM_S:-240}" python3 benchmarks/gpu_warm.py --jobs "$(nproc)" > "$OUT/warm.log" 2>&1 &
warm_pid=$!
warmed=0

run_stage() {   # name limit command...
  local name=$1 limit=$2 start rc
  shift 2
  if [ "$name" != quantize ] && [ $warmed = 0 ]; then
    wait "$warm_pid"
    warmed=1
    tail -n 1 "$OUT/warm.log"
  fi
  echo "== $name (limit ${limit} s)" | tee -a "$log"
  local before
  before=$(wc -l < "$log")
  start=$(date +%s)
  timeout "$limit" "$@" >> "$log" 2>&1
  rc=$?
  tail -n +"$(( before + 1 ))" "$log" | tail -n 8
  echo "== $name: exit $rc after $(( $(date +%s) - start )) s" | tee -a "$log"
}

for arg in "$@"; do
  name=${arg%%:*}
  limit=${arg#*:}
  [ "$limit" = "$arg" ] && limit=""
  case $name in
    quantize)    run_stage "$name" "${limit:-150}" python3 -m pytest -q -p no:cacheprovider tests/test_gpu_quantize.py ;;
    gemm)        run_stage "$name" "${limit:-200}" python3 -m pytest -q -p no:cacheprovider tests/test_gpu_gemm.py ;;
    grouped)     run_stage "$name" "${limit:-150}" python3 benchmarks/gpu_gemm.py --grouped ;;
    fused)       run_stage "$name" "${limit:-300}" python3 -m pytest -q -p no:cacheprovider --durations=5 tests/test_gpu_fused.py ;;
    fused-check) run_stage "$name" "${limit:-300}" python3 benchmarks/gpu_fused.py --check ;;
    fused-bench) run_stage "$name" "${limit:-150}" python3 benchmarks/gpu_fused.py --bench --shapes 16384x512x512,2048x1024x1024,8192x256x256 ;;
    gemm-bench)  run_stage "$name" "${limit:-300}" python3 benchmarks/gpu_gemm.py --bench ;;
  esac
done
[ $warmed = 1 ] || kill "$warm_pid" 2>/dev/null
exit 0
