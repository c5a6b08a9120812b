#!/bin/bash
# Runs one GPU test under one compute-sanitizer tool on the GPU host (issue 23).
#   san.sh TOOL BINARY TEST LIMIT_S [NAME=VALUE...]
# TOOL: memcheck, racecheck, synccheck, initcheck, or none (the test alone, e.g. to warm the
# driver's JIT cache). BINARY: test-gpu_collectives or test-gpu_extents, from bin/ beside this
# script. The log goes to $OUT/TOOL-TEST[-TAG].txt (TAG from SAN_TAG); one line per step to
# $OUT/summary.txt.
here="$(cd "$(dirname "$0")" && pwd)"
tool=$1 bin=$2 test=$3 limit=$4
shift 4
export NCCL_NVLS_ENABLE=0 NCCL_RS_SHARED_GPUS=1 CUDA_CACHE_MAXSIZE=4294967296
# The driver JIT cache benches/gpu-session.sh keeps and packs (a cold one costs minutes).
export CUDA_CACHE_PATH="${CUDA_CACHE_PATH:-/tmp/nccl-rs-jit}"
dir="${SAN_DIR:-${OUT:-/tmp}}"; mkdir -p "$dir"
log="$dir/$tool-$test${SAN_TAG:+-$SAN_TAG}.txt"
{
  echo "# $(date -u +%FT%TZ) tool=$tool test=$test limit=${limit}s env: NCCL_RS_SHARED_GPUS=1 $*"
} >"$log"
SECONDS=0
if [ "$tool" = none ]; then
  env "$@" timeout -k 10 "$limit" "$here/bin/$bin" --include-ignored --test-threads=1 --exact "$test" \
    --nocapture >>"$log" 2>&1
else
  env "$@" timeout -k 10 "$limit" compute-sanitizer --tool "$tool" --print-limit 30 \
    --error-exitcode 9 ${SAN_OPTS:-} "$here/bin/$bin" --include-ignored --test-threads=1 --exact \
    "$test" --nocapture >>"$log" 2>&1
fi
rc=$?
t=$SECONDS
line="$tool $test ${SAN_TAG:-} rc=$rc ${t}s :: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1) :: $(grep -E '^test result' "$log" | tail -1)"
echo "$line" | tee -a "${OUT:-/tmp}/summary.txt"
exit 0
