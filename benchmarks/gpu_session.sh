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
# shapes; gemm-bench (300) gpu_gemm.py --bench; wide-check (200) gpu_gemm.py --check --wide always
# (every case on wide tiles, then wide against 128-wide); wide256-check, wide192-check (150 each)
# the same comparison only, with 256- or 192-wide FP8 tiles; variants (300) gpu_gemm.py --variants
# at $VARIANT_SHAPES (default 8192x8192x8192,65536x1024x1024); check (120) gpu_gemm.py --check; ab
# (200) gpu_ab.py --builds "$AB_BUILDS" --cases "$AB_CASES" (default blk,e4m3) --shapes "$AB_SHAPES"
# (default 8192x8192x8192,65536x1024x1024) --rounds "$AB_ROUNDS" (default 5); ab-reversed (200) the
# same with the builds in reverse order (an order effect shows as a ratio that follows the position,
# not the build); isolate (90 per build) gpu_isolate.py for each build of $AB_BUILDS in its own
# process (every wide-tile case, or only $ISOLATE_SCALING's; ISOLATE_SANITIZE=1: a build that faults
# is run again under compute-sanitizer, 120 s, which names the instruction), after which the ab
# stages time only the builds that passed (a kernel fault ends a process's CUDA context, and with it
# every build's timing in that process; ISOLATE_BUILDS, when set, names the builds to check instead,
# and the ab stages drop those of them that failed and keep every other build of $AB_BUILDS, e.g.
# diagnostic builds whose results are wrong by design); ncu-scales (90 per profile) ncu
# (--clock-control none: speed of light, warp states, schedulers, pipes, instructions) of one e4m3
# GEMM with per-tensor and with block scales on the same 256-wide tiles, at each of $NCU_SHAPES
# (default 8192x8192x8192,65536x1024x1024). Patches under test are applied to the tree before the
# call. gemm_wgmma.cu's instances are compiled first in the background (gpu_warm.py); stages that
# launch them wait for it with `wait` on its PID (never `pgrep -f`, which matches the shell running
# this command's own text). WARM_S (default 240) bounds that compile; a fresh machine needs more
# when most instances are still uncached.
#
# The kernel cache lives in .cupycache/ (ignored by git) unless CUPY_CACHE_DIR says otherwise.
# SAVE_CACHE=1 packs it into $OUT/cupycache.tgz.aa, .ab, ... (15 MB parts); put those parts in the
# tree's root and name them in the device call's carry, and the next fresh machine unpacks them
# first and skips the compiles they hold (entries of an older source are never used).
# DEADLINE_S (default 570): no stage runs past that many seconds from the start (a stage's limit
# is cut to what is left, less 20 s for packing the cache), so one device call stays in its limit.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=.:benchmarks
STAGES="quantize gemm grouped fused fused-check fused-bench gemm-bench wide-check wide256-check wide192-check variants check isolate ab ab-reversed ncu-scales"
for arg in "$@"; do
  case " $STAGES " in
    *" ${arg%%:*} "*) ;;
    *) echo "gpu_session: unknown stage ${arg%%:*}; known: $STAGES"; exit 2 ;;
  esac
done
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"
log="$OUT/session.log"
t_start=$(date +%s)
: > "$log"
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.cupycache}
mkdir -p "$CUPY_CACHE_DIR"
if compgen -G ".cupycache.tgz.*" > /dev/null; then
  cat .cupycache.tgz.* | tar xzf - -C "$CUPY_CACHE_DIR" && echo "gpu_session: unpacked $(find "$CUPY_CACHE_DIR" -name "*.cubin" | wc -l) cached kernels"
fi

timeout "${WARM_S:-240}" python3 benchmarks/gpu_warm.py --jobs "$(nproc)" > "$OUT/warm.log" 2>&1 &
warm_pid=$!
warmed=0

stage_rc=0
run_stage() {   # name limit command...; its exit status in stage_rc (124: out of time)
  local name=$1 limit=$2 start rc
  shift 2
  stage_rc=124
  if [ "$name" != quantize ] && [ $warmed = 0 ]; then
    wait "$warm_pid"
    warmed=1
    tail -n 1 "$OUT/warm.log"
  fi
  local left=$(( ${DEADLINE_S:-570} - ($(date +%s) - t_start) - 20 ))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -le 0 ]; then
    echo "== $name: skipped, no time left before DEADLINE_S" | tee -a "$log"
    return
  fi
  echo "== $name (limit ${limit} s)" | tee -a "$log"
  local before
  before=$(wc -l < "$log")
  start=$(date +%s)
  timeout "$limit" "$@" >> "$log" 2>&1
  rc=$?
  stage_rc=$rc
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
    wide-check)  run_stage "$name" "${limit:-200}" python3 benchmarks/gpu_gemm.py --check --wide always ;;
    wide256-check) run_stage "$name" "${limit:-150}" python3 benchmarks/gpu_gemm.py --check --wide always --wide-fp8 256 --wide-only ;;
    wide192-check) run_stage "$name" "${limit:-150}" python3 benchmarks/gpu_gemm.py --check --wide always --wide-fp8 192 --wide-only ;;
    check)       run_stage "$name" "${limit:-120}" python3 benchmarks/gpu_gemm.py --check ;;
    isolate|ab|ab-reversed)
                 builds=${AB_BUILDS:?"isolate and ab need AB_BUILDS, e.g. 'old=WG_X=0;new='"}
                 ;;&
    isolate)     passed="" failed=" "
                 for b in $(printf '%s\n' "${ISOLATE_BUILDS:-$builds}" | tr ';' ' '); do
                   run_stage "isolate ${b%%=*}" "${limit:-90}" python3 benchmarks/gpu_isolate.py \
                     "$b" ${ISOLATE_SCALING:+--scaling "$ISOLATE_SCALING"}
                   if [ "$stage_rc" = 0 ]; then passed=${passed:+$passed;}$b; else failed="$failed${b%%=*} "; fi
                   if [ "$stage_rc" = 3 ] && [ "${ISOLATE_SANITIZE:-0}" = 1 ]; then   # where?
                     san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
                     run_stage "sanitize ${b%%=*}" "${limit:-120}" "$san" --print-limit 4 \
                       --target-processes application-only python3 benchmarks/gpu_isolate.py "$b" \
                       --no-compile ${ISOLATE_SCALING:+--scaling "$ISOLATE_SCALING"}
                   fi
                 done
                 echo "== isolate: builds passed: ${passed:-none}" | tee -a "$log"
                 if [ -n "${ISOLATE_BUILDS:-}" ]; then   # every build of AB_BUILDS not failed here
                   passed=""
                   for b in $(printf '%s\n' "$builds" | tr ';' ' '); do
                     case "$failed" in *" ${b%%=*} "*) ;; *) passed=${passed:+$passed;}$b ;; esac
                   done
                 fi
                 AB_BUILDS=$passed
                 [ -n "$passed" ] || AB_BUILDS=";" ;;   # no build left: the ab stages skip
    ab|ab-reversed)
                 if [ "$builds" = ";" ]; then
                   echo "== $name: skipped, no build passed isolate" | tee -a "$log"
                   continue
                 fi
                 if [ "$name" = ab-reversed ]; then
                   builds=$(printf '%s\n' "$builds" | tr ';' '\n' | tac | paste -sd ';')
                 fi
                 run_stage "$name" "${limit:-200}" python3 benchmarks/gpu_ab.py \
                   --builds "$builds" --cases "${AB_CASES:-blk,e4m3}" \
                   --shapes "${AB_SHAPES:-8192x8192x8192,65536x1024x1024}" --rounds "${AB_ROUNDS:-5}" ;;
    ncu-scales)  ncu_bin=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
                 for shape in $(printf '%s\n' "${NCU_SHAPES:-8192x8192x8192,65536x1024x1024}" | tr ',' ' '); do
                   for sc in tensor block; do
                     run_stage "ncu $shape $sc" "${limit:-90}" "$ncu_bin" --clock-control none \
                       -k regex:gemm_wgmma -s 2 -c 1 --section SpeedOfLight --section WarpStateStats \
                       --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats \
                       python3 benchmarks/gpu_gemm_one.py "$shape" e4m3 "$sc" --wide-fp8 256
                   done
                 done ;;
    variants)    run_stage "$name" "${limit:-300}" python3 benchmarks/gpu_gemm.py --variants \
                   --shapes "${VARIANT_SHAPES:-8192x8192x8192,65536x1024x1024}" ;;
  esac
done
[ $warmed = 1 ] || kill "$warm_pid" 2>/dev/null
if [ "${SAVE_CACHE:-0}" = 1 ]; then
  tar czf - -C "$CUPY_CACHE_DIR" . | split -b 15m - "$OUT/cupycache.tgz."
  echo "gpu_session: saved $(find "$CUPY_CACHE_DIR" -name "*.cubin" | wc -l) cached kernels in $(ls "$OUT"/cupycache.tgz.* | wc -l) parts"
fi
exit 0
