#!/bin/bash
# A/B of two builds' kernels in the kernel lab (ranks sharing one GPU, no NVLink crossed), on a
# GPU host: the same benchmarks from bundle A and bundle B, alternated round by round so that
# drift on the host falls on both. Bundles come from the GPU bundle (docs/gpu-hosts.md) --dir DIR; carry
# both. Compare A with B only, never with NCCL (it refuses shared GPUs).
#   benches/lab-ab.sh A_DIR B_DIR [ROUNDS]      environment: PROTOS (Simple), CHANNELS ("1 32"),
#                                               COLLS (broadcast,all_reduce,reduce), MAXB (256M),
#                                               A_ENV / B_ENV: NAME=value words for one side only
# (one bundle against itself with B_ENV="NCCL_RS_SIMPLE_PUBLISHER=1" compares a setting).
# Logs come back as one archive, $OUT/lab-ab.tgz, with summary.txt: per size, each side's
# out-of-place busbw (GB/s) in every round.
set -u
a=$1 b=$2 rounds=${3:-2}
out="${OUT:-/tmp}/lab-ab"
rm -rf "$out" && mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 NCCL_RS_SHARED_GPUS=1
export CUDA_CACHE_MAXSIZE=4294967296 # each bundle's PTX JIT-compiled once, then cached
for r in $(seq "$rounds"); do
  for side in A B; do
    dir=$([ $side = A ] && echo "$a" || echo "$b")
    side_env=$([ $side = A ] && echo "${A_ENV:-}" || echo "${B_ENV:-}")
    for p in ${PROTOS:-Simple}; do
      for ch in ${CHANNELS:-1 32}; do
        log="$out/$side-$p-${ch}ch-r$r.txt"
        t0=$SECONDS
        # shellcheck disable=SC2086 # side_env is NAME=value words
        env $side_env NCCL_PROTO=$p NCCL_MAX_NCHANNELS=$ch timeout 300 "$dir/bin/bench-nccl_bench" -g 2 \
          -C "${COLLS:-broadcast,all_reduce,reduce}" -b 1M -e "${MAXB:-256M}" -f 4 >"$log" 2>&1
        rc=$?
        echo "$(basename "$log"): rc=$rc after $((SECONDS - t0)) s"
      done
    done
  done
done
# summary: one line per (protocol, channels, collective, size): A's busbw per round, then B's.
for p in ${PROTOS:-Simple}; do
  for ch in ${CHANNELS:-1 32}; do
    for side in A B; do
      for r in $(seq "$rounds"); do
        awk -v tag="$side r$r" -v key="$p ${ch}ch" '/Collective:/ {c=$3} /^ +[0-9]/ {print key, c, $1, tag, $8}' \
          "$out/$side-$p-${ch}ch-r$r.txt"
      done
    done
  done
done | sort -k1,1 -k2,2 -k3,3 -k4,4n -s >"$out/summary.txt"
cat "$out/summary.txt"
tar -czf "${OUT:-/tmp}/lab-ab.tgz" -C "$out" .
