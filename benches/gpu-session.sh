#!/bin/bash
# One device call's worth of GPU work, from a bundle built here with
#   NCCL_RS_PTX_ARCHS=sm_90 the GPU bundle (docs/gpu-hosts.md) -- --test gpu --bench nccl_bench
# and run on the GPU host as `benches/gpu-session.sh [tests|bench|all|both|lab|nodes|torch|unpack] [TEST...]`
# with `.gpu` carried (`unpack`: only unpack the programs and the JIT cache, for a lab script or
# tools/san.sh to run next; `both`: the named tests, then the benchmarks; `lab`: our kernels with ranks
# sharing one GPU, for hosts of one; `nodes`: 2 rank processes as 2 nodes on one GPU under MPS
# beside NCCL's socket transport, 64 MiB-1 GiB (issue 20's table); `torch`: PyTorch's torch.distributed on our libnccl.so.2,
# which `NCCL_RS_PTX_ARCHS=sm_90 cargo build --release --features capi --lib` builds and
# `.gpu-capi/libnccl.so.2` carries: cp target/release/libnccl.so .gpu-capi/libnccl.so.2; its
# parts: `torch checks`, `torch nonblocking`, `torch dead-peer`).
# Every step has its own time limit, so one stuck step cannot eat the call. The logs come back
# as one archive, $OUT/gpu-session.tgz (the device tool returns at most 8 files).
# A bundle built with NCCL_RS_PTXAS (docs/gpu-hosts.md) carries SASS and needs none of the JIT
# below. Otherwise the first run on a fresh machine JIT-compiles the PTX (a process per GPU does it again): the
# tests took about 8 minutes on 4xH200, the benchmarks about 3, so give each its own call
# (a call may run 10 minutes). The driver's JIT cache makes the next call warm: it lives in
# /tmp/nccl-rs-jit (kept while the machine stays warm between calls), and a packed copy comes
# back as $OUT/jit.txz (94 MB of cache packs to about 6 MB). Put that file in .gpu/ and the next
# call starts warm even on a fresh machine. It only fits the same PTX: a change under device/
# makes it cold again.
# Programs too large to carry together (two 45 MB ones against the 64 MiB limit) can travel
# xz-compressed as .gpu/bin/NAME.xz: they are unpacked here first.
set -u
root="$(cd "$(dirname "$0")/.." && pwd)"
bundle="$root/.gpu"
out="$bundle/logs"
rm -rf "$out" && mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 # never multicast on the shared hosts
export CUDA_CACHE_PATH="${CUDA_CACHE_PATH:-/tmp/nccl-rs-jit}" CUDA_CACHE_MAXSIZE=4294967296
mkdir -p "$CUDA_CACHE_PATH"
[ -f "$bundle/jit.txz" ] && tar -xJf "$bundle/jit.txz" -C "$CUDA_CACHE_PATH"
for f in "$bundle"/bin/*.xz; do
  [ -e "$f" ] || continue
  python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$f" "${f%.xz}" && chmod +x "${f%.xz}"
done
[ "${1:-}" = unpack ] && exit 0
nccl=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
bench="$bundle/bin/bench-nccl_bench"
tests="$bundle/bin/test-gpu"
what="${1:-all}"
only="${*:2}" # tests: run only these (all when empty)

step() { # step LIMIT_S LOG COMMAND...: runs COMMAND with a limit, says how it ended
  local limit=$1 log=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$out/$log" 2>&1
  local rc=$?
  echo "$log: rc=$rc after $((SECONDS - t0)) s$([ $rc = 124 ] && echo ' (time limit)')"
  # The archive so far, in case the call's own limit ends the session.
  tar -czf "${OUT:-$bundle}/gpu-session.tgz" -C "$bundle" logs
}

if [ "$what" = tests ] || [ "$what" = all ] || [ "$what" = both ]; then
  nvidia-smi topo -m >"$out/topo.txt" 2>&1
  for t in ${only:-$("$tests" --list --include-ignored 2>/dev/null | sed -n 's/^\(collectives::.*\): test$/\1/p')}; do
    # The forced-protocol test runs 8 cases of a process per GPU: 200 s did not finish it warm.
    limit=${TEST_LIMIT_S:-$([ "$t" = forced_algorithms_and_protocols ] && echo 420 || echo 300)}
    step "$limit" "test-$t.log" "$tests" --include-ignored --exact --nocapture --test-threads=1 "$t"
  done
fi
if [ "$what" = bench ] || [ "$what" = all ] || [ "$what" = both ]; then
  step 200 bench-all.txt "$bench" -C all -b 8 -e 1G -f 4 --baseline "$nccl"
  step 90 bench-sendrecv.txt "$bench" -C sendrecv -b 8 -e 1G -f 4 --baseline "$nccl"
  # Simple steps with a publishing warp (off by default until this measures it): the large sizes,
  # to set beside bench-all's and bench-sendrecv's rows.
  NCCL_RS_SIMPLE_PUBLISHER=1 step 120 bench-publisher.txt "$bench" -C all -b 64M -e 1G -f 4 --baseline "$nccl"
  for p in LL Simple; do
    NCCL_PROTO=$p step 60 "bench-allreduce-$p.txt" "$bench" -C all_reduce -b 8 -e 4M -f 4 --baseline "$nccl"
  done
  NCCL_PROTO=LL128 step 60 bench-allreduce-LL128.txt "$bench" -C all_reduce -b 8 -e 256M -f 4 --baseline "$nccl"
  NCCL_ALGO=allreduce:tree step 60 bench-allreduce-tree.txt "$bench" -C all_reduce -b 64K -e 256M -f 4 --baseline "$nccl"
  export NCCL_RS_BENCH_HOST_TIME=1 # host issue time per iteration, on stderr
  step 60 bench-threads-small.txt "$bench" -t threads -C all_reduce -b 8 -e 64K -f 8 --baseline "$nccl"
  step 30 bench-threads-small-1gpu.txt "$bench" -t threads -g 1 -C all_reduce -b 8 -e 8 --baseline "$nccl"
  unset NCCL_RS_BENCH_HOST_TIME
fi
if [ "$what" = lab ]; then
  # The kernel lab, for hosts of one GPU: two ranks share it (NCCL_RS_SHARED_GPUS=1), so this
  # measures our kernels' per-CTA rates with no NVLink crossed; NCCL cannot run beside (it
  # refuses shared GPUs). Compare our own builds and settings with it, never NCCL.
  export NCCL_RS_SHARED_GPUS=1
  for p in Simple LL128 LL; do
    max=$([ $p = LL ] && echo 16M || echo 256M)
    NCCL_PROTO=$p step 150 "lab-$p.txt" "$bench" -g 2 -C all_reduce,broadcast -b 64K -e $max -f 4
    NCCL_PROTO=$p NCCL_MAX_NCHANNELS=1 step 150 "lab-$p-1ch.txt" "$bench" -g 2 -C all_reduce,broadcast -b 64K -e 16M -f 4
  done
  unset NCCL_RS_SHARED_GPUS
fi
if [ "$what" = nodes ]; then
  # Ours at default sockets (the mean, as nccl-tests, and the median iteration: a gap between
  # them means a few slow iterations), then both libraries at 4 threads x 4 sockets, NCCL's best
  # setting there. MPS lets the two processes share the GPU at once.
  export NCCL_RS_SHARED_GPUS=1 NCCL_SOCKET_IFNAME=lo CUDA_VISIBLE_DEVICES=0
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d
  table=(--nodes 2 -C all_reduce,all_gather,reduce_scatter,sendrecv -b 64M -e 1G -f 2 -w 2 -n 10)
  for stat in mean median; do
    step 150 "nodes2-ours-$stat.txt" "$bench" "${table[@]}" --stat $stat
  done
  NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4 step 300 nodes2-both-4x4.txt "$bench" "${table[@]}" --baseline "$nccl"
  echo quit | nvidia-cuda-mps-control
  unset NCCL_RS_SHARED_GPUS NCCL_SOCKET_IFNAME CUDA_VISIBLE_DEVICES CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi
if [ "$what" = torch ]; then
  python=/opt/torch/.venv/bin/python
  lib="$root/.gpu-capi/libnccl.so.2"
  torchlib=$(dirname "$nccl")/../../../torch/lib/libtorch_cuda.so
  # What torch asks of libnccl.so.2, against what ours exports.
  { readelf -d "$torchlib" | grep -E 'NEEDED.*nccl|RPATH|RUNPATH|FLAGS'
    echo "# nccl symbols torch needs, and whether ours exports them"
    nm -D --defined-only "$lib" | awk '{print $3}' | sort >"$out/ours.sym"
    nm -D --undefined-only "$torchlib" | awk '{print $2}' | grep -i nccl | sort |
      while read -r f; do echo "$f $(grep -qx "$f" "$out/ours.sym" && echo ours || echo MISSING)"; done
  } >"$out/torch-nccl-symbols.txt" 2>&1
  gpus=$(nvidia-smi -L | grep -c '^GPU')
  # The parts run (`torch checks nonblocking dead-peer`, all by default): about 9 minutes in
  # all on a fresh one-GPU host, more than one call may run, so give each part its own call.
  parts=" ${only:-checks nonblocking dead-peer} "
  run_torch() { # run_torch LOG NRANKS LIMIT_S [ARGS...]: our library on NRANKS ranks
    local log=$1 n=$2 limit=$3 shared
    shift 3
    shared=$([ "$gpus" -lt "$n" ] && echo 1 || echo 0)
    NCCL_RS_SHARED_GPUS=$shared step "$limit" "$log" "$python" "$root/tests/python/torch_dropin.py" \
      --lib "$lib" --nranks "$n" --timeout $((limit - 20)) "$@"
  }
  if [[ $parts == *" checks "* ]]; then
    step 120 torch-nvidia-1.txt "$python" "$root/tests/python/torch_dropin.py" --lib nvidia --nranks 1
    for n in 1 2 4; do run_torch "torch-ours-$n.txt" "$n" 400; done
  fi
  if [[ $parts == *" nonblocking "* ]]; then # the checks on non-blocking communicators
    export TORCH_NCCL_USE_COMM_NONBLOCKING=1
    for n in 2 4; do run_torch "torch-ours-nonblocking-$n.txt" "$n" 300; done
    unset TORCH_NCCL_USE_COMM_NONBLOCKING
  fi
  if [[ $parts == *" dead-peer "* ]]; then # a rank dies mid-job: an error and an abort, no hang
    for n in 2 4; do run_torch "torch-ours-dead-peer-$n.txt" "$n" 200 --scenario dead-peer; done
  fi
fi
tar -czf "${OUT:-$bundle}/gpu-session.tgz" -C "$bundle" logs
# The JIT cache for the next call (see the top).
XZ_OPT=-T0 tar -cJf "${OUT:-$bundle}/jit.txz" -C "$CUDA_CACHE_PATH" .
