#!/bin/bash
# Issue 21's target table on a GPU host, in one device call: 2 rank processes as 2 nodes
# (`nccl_bench --nodes 2`, NCCL_HOSTID per node, loopback) through
#   socket  the built-in socket network (NCCL_NET_PLUGIN=none),
#   host    the test plugin tests/c/plugins/net_plugin_tcp.c, host memory (-DNET_VERSION=11
#           -DHELPER_THREAD: a thread per comm moves its bytes),
#   cuda    the same with CUDA pointers (-DCUDA_PTR -DDMABUF, NCCL_NET_GDR_LEVEL=SYS): FIFOs in
#           GPU memory, moved through the CUDA driver by the plugin,
# alternated by round, sizes 64 MiB .. 1 GiB; then a summary of busbw per size and the plugin's
# ratio to sockets (the target: within 10% at >= 64 MiB).
#
# Build here:  NCCL_RS_PTX_ARCHS=sm_90 the GPU bundle (docs/gpu-hosts.md) --no-bench -- --bench nccl_bench
#              (or with the tests: -- --features internals --test gpu --bench nccl_bench)
# Run there:   tools/gpu-plugin-bench.sh [bench [ROUNDS]]   (from the repository root, .gpu carried)
#              tools/gpu-plugin-bench.sh tests [TEST...]    the GPU tests of tests/gpu/net_plugin.rs
#              (all three by default, each with its own time limit), with the same MPS set-up
#              tools/gpu-plugin-bench.sh ofi    nccl_bench through aws-ofi-nccl (libfabric's tcp
#              provider on lo) from .gpu-ofi/ (carried too; see .gpu-ofi/README.txt), then the
#              socket network beside it
# Knobs:       COLLS (all_reduce; a list: all_reduce,all_gather,...), MINB (64M), MAXB (1G), ITERS (10),
#              WARMUP (3), CHECK (1: check each size's first call), BASELINE=1 (NVIDIA NCCL
#              beside the socket rows; it refuses nothing here: 2 nodes), STEP_LIMIT_S (150).
# On a host of one GPU the ranks share it (NCCL_RS_SHARED_GPUS=1) and the MPS daemon this
# script starts (and stops); the logs and CSVs go to $OUT/plugin-bench (or .gpu/logs/...), and
# all of it as one archive, $OUT/plugin-bench.tgz.
set -u
root="$(cd "$(dirname "$0")/.." && pwd)"
bench="${BENCH:-$root/.gpu/bin/bench-nccl_bench}"
base="${OUT:-$root/.gpu/logs}"
out="$base/plugin-bench"
rm -rf "$out" && mkdir -p "$out"
mode="${1:-bench}"
rounds="${2:-2}"
colls="${COLLS:-all_reduce}"
minb="${MINB:-64M}" maxb="${MAXB:-1G}"
iters="${ITERS:-10}" warmup="${WARMUP:-3}" check="${CHECK:-1}"
limit="${STEP_LIMIT_S:-150}"
nccl=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
work="$(mktemp -d)"

export NCCL_NVLS_ENABLE=0 # never multicast on the shared hosts
export NCCL_SOCKET_IFNAME=lo # loopback only
export CUDA_CACHE_MAXSIZE=4294967296 # our PTX, JIT-compiled once for every rank process

archive() { tar -czf "$base/plugin-bench.tgz" -C "$base" plugin-bench 2>/dev/null; }

tests="$root/.gpu/bin/test-gpu"
case "$mode" in
  bench) [ -x "$bench" ] || { echo "no $bench: build the bundle first (see the top of $0)"; exit 2; } ;;
  tests) [ -x "$tests" ] || { echo "no $tests: bundle it (-- --test gpu)"; exit 2; } ;;
  ofi) [ -x "$bench" ] && [ -f "$root/.gpu-ofi/libnccl-net-ofi.so" ] ||
    { echo "ofi needs $bench and .gpu-ofi/libnccl-net-ofi.so (carried)"; exit 2; } ;;
  *) echo "usage: $0 [bench [ROUNDS] | tests [TEST...] | ofi]"; exit 2 ;;
esac

# The plugin flavours.
src="$root/tests/c/plugins/net_plugin_tcp.c"
build() { # build FILE DEFINES...
  local f=$1
  shift
  cc -shared -fPIC -O2 -Wall -Werror -I "$root/include" -o "$work/$f" "$src" -ldl -lpthread "$@" ||
    { echo "cc failed for $f"; exit 2; }
}
# A helper thread per comm (as the socket network's helper threads): comms move bytes in parallel.
build libtest-host.so -DNET_VERSION=11 -DHELPER_THREAD
build libtest-cuda.so -DNET_VERSION=11 -DCUDA_PTR -DDMABUF -DHELPER_THREAD

{
  echo "# $(date -u +%FT%TZ) $(hostname) build $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  echo "# glibc: $(ldd --version | head -1)"
  echo "# peer-memory module: $(ls /sys/module/nvidia_peermem /sys/kernel/mm/memory_peers/nv_mem 2>/dev/null | head -1 || true)"
} >"$out/host.txt" 2>&1
cat "$out/host.txt"

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
mps_started=0
if [ "$gpus" -lt 2 ]; then
  export NCCL_RS_SHARED_GPUS=1
  export CUDA_MPS_PIPE_DIRECTORY="$work/mps-pipe" CUDA_MPS_LOG_DIRECTORY="$work/mps-log"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then
    mps_started=1
    echo "MPS daemon started (ranks share GPU 0)"
  else
    echo "MPS daemon did not start: ranks time-slice the GPU"
  fi
fi
stop_mps() {
  if [ $mps_started = 1 ]; then
    echo quit | nvidia-cuda-mps-control
    mps_started=0
  fi
}
trap 'stop_mps; archive' EXIT

if [ "$mode" = tests ]; then
  shift
  status=0
  for t in ${*:-cuda_pointer_plugin_on_gpu_flushes_simple_steps_only cuda_pointer_plugin_on_gpu_groups_receives host_memory_plugin_on_gpu}; do
    t0=$SECONDS
    # The test finds the plugin's source here; a cold host JIT-compiles our PTX first.
    NCCL_RS_TEST_SHOW_RANKS=1 NCCL_RS_SOURCE_DIR="$root" NCCL_RS_TEST_PROC_LIMIT_S="${NCCL_RS_TEST_PROC_LIMIT_S:-400}" \
      timeout "${TEST_LIMIT_S:-450}" "$tests" --include-ignored --exact --nocapture \
      --test-threads=1 "net_plugin::$t" >"$out/test-$t.log" 2>&1
    rc=$?
    echo "test $t: rc=$rc after $((SECONDS - t0)) s$([ $rc = 124 ] && echo ' (time limit)')"
    grep -E '^test result|panicked|plugin counters' "$out/test-$t.log" | head -12
    [ $rc = 0 ] || status=1
    archive
  done
  exit $status
fi

summary() { # busbw per collective, size and network: the mean of both placements over the
  # rounds so far; the plugin's ratio to sockets.
python3 - "$out" <<'EOF' | tee "$out/summary.txt"
import csv, glob, os, sys
from collections import defaultdict
out = sys.argv[1]
bw = defaultdict(list)
for path in sorted(glob.glob(os.path.join(out, "*-[0-9]*.csv"))):
    net = os.path.basename(path).rsplit("-", 1)[0]
    for row in csv.DictReader(open(path)):
        bw[(row["collective"], int(row["size_bytes"]), net)].append(float(row["busbw_gbps"]))
present = {n for _, _, n in bw}
nets = [n for n in ["socket", "host", "cuda", "ofi"] if n in present]
others = [n for n in nets if n != "socket"]
print("# busbw GB/s, mean of out-of-place and in-place over the rounds (n values); ratio = network / socket")
print(f"{'collective':14} {'size':>10} " + " ".join(f"{n:>12}" for n in nets)
      + "".join(f" {n + '/sock':>10}" for n in others))
for coll, size in sorted({(c, s) for c, s, _ in bw}):
    m = {}
    cells = []
    for n in nets:
        v = bw.get((coll, size, n), [])
        m[n] = sum(v) / len(v) if v else None
        cells.append(f"{m[n]:8.2f} ({len(v)})" if v else f"{'-':>12}")
    ratio = lambda n: f"{m[n] / m['socket']:10.3f}" if m.get(n) and m.get("socket") else f"{'-':>10}"
    print(f"{coll:14} {size >> 20:>7} MiB " + " ".join(cells) + "".join(f" {ratio(n)}" for n in others))
EOF
}

run() { # run ROUND NAME ENV...: one benchmark run, its table, CSV and INFO logs
  local r=$1 name=$2
  shift 2
  local tag="$name-$r" t0=$SECONDS extra=()
  [ "$name" = socket ] && [ "${BASELINE:-0}" = 1 ] && extra=(--baseline "$nccl")
  mkdir -p "$out/logs-$tag"
  env "$@" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET NCCL_DEBUG_FILE="$out/logs-$tag/rank-%p.log" \
    timeout "$limit" "$bench" --nodes 2 -C "$colls" -b "$minb" -e "$maxb" -f 2 \
    -w "$warmup" -n "$iters" -c "$check" --csv "$out/$tag.csv" "${extra[@]}" \
    >"$out/$tag.txt" 2>&1
  local rc=$?
  echo "$tag: rc=$rc after $((SECONDS - t0)) s$([ $rc = 124 ] && echo ' (time limit)')"
  # Which network and placement the connections took, as the ranks logged it.
  grep -hoE 'via NET/[A-Za-z]+/[0-9]+(/GDRDMA)?|GPU Direct RDMA (on|off)[^:]*(: .*)?' \
    "$out/logs-$tag"/rank-*.log 2>/dev/null | sort | uniq -c | head -6
  summary >/dev/null # kept current, in case the call's limit ends the session
  archive
}

if [ "$mode" = ofi ]; then
  # aws-ofi-nccl, unmodified, over libfabric's tcp provider on loopback; its libraries from
  # .gpu-ofi/lib. A plugin that fails to load or init is skipped for the socket network, and the
  # log says why: the lines kept below tell which network carried the traffic.
  ofi="$root/.gpu-ofi"
  { ldd --version | head -1; LD_LIBRARY_PATH="$ofi/lib" ldd "$ofi/libnccl-net-ofi.so"; } \
    >"$out/ofi-ldd.txt" 2>&1
  grep -E 'not found|GLIBC' "$out/ofi-ldd.txt"
  # OFI_PROVIDER: libfabric's FI_PROVIDER (default tcp; "all" leaves the choice to libfabric).
  prov="${OFI_PROVIDER:-tcp}"
  [ "$prov" = all ] && prov=""
  run 1 ofi LD_LIBRARY_PATH="$ofi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ${prov:+FI_PROVIDER="$prov"} \
    FI_TCP_IFACE=lo FI_SOCKETS_IFACE=lo FI_LOG_LEVEL=warn NCCL_NET_PLUGIN="$ofi/libnccl-net-ofi.so"
  grep -hE 'NET/OFI|NET/Plugin|WARN' "$out/logs-ofi-1"/rank-*.log 2>/dev/null | sort | uniq -c | head -30
  run 1 socket NCCL_NET_PLUGIN=none
  summary
  exit 0
fi

for r in $(seq 1 "$rounds"); do
  run "$r" socket NCCL_NET_PLUGIN=none
  run "$r" host NCCL_NET_PLUGIN="$work/libtest-host.so" NCCL_NET=TestTCP
  run "$r" cuda NCCL_NET_PLUGIN="$work/libtest-cuda.so" NCCL_NET=TestTCP NCCL_NET_GDR_LEVEL=SYS
done
summary

