#!/usr/bin/env bash
# The kernel researcher's loop, timed on a clean clone: clones the repository's HEAD into a
# temporary folder (twice: one clone per cold start measured) and times each step below, then
# prints a table. Crates come from cargo's cache (~/.cargo); the pinned toolchain must be
# installed (`rustup toolchain install`). Takes most of an hour on 2 cores.
#
#   tools/loop-times.sh [REPO]     (REPO: a path or URL to clone, default this checkout)
#
# Knobs: KEEP=1 keeps the temporary folder; STEPS="bench capi ci filtered full host bench-all"
# picks steps (bench-all: the main job with both architectures' PTX, as on a machine whose GPUs
# are elsewhere; the others build what the machine itself can run);
# AREA (sim) and TESTS (all_reduce) name the simulator tests of the collective edited.
set -euo pipefail
repo="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
area="${AREA:-sim}"
tests="${TESTS:-all_reduce}"
steps="${STEPS:-bench capi ci filtered full host bench-all}"
tmp="$(mktemp -d /tmp/nccl-rs-loop.XXXXXX)"
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$tmp"' EXIT
table=()

# Times `$@` (run in the current directory, output to $tmp/<label>.log); adds a row.
step() {
    local label="$1"
    shift
    local log="$tmp/$(echo "$label" | tr -c 'a-zA-Z0-9' _).log"
    echo "== $label: $*" >&2
    local t0 t1 rc=0
    t0=$(date +%s.%N)
    "$@" >"$log" 2>&1 || rc=$?
    t1=$(date +%s.%N)
    local s
    s=$(echo "$t1 - $t0" | bc)
    local row
    row=$(printf '| %s | %d min %02d s | %s |' "$label" "$(echo "$s / 60" | bc)" \
        "$(echo "$s % 60 / 1" | bc)" "$([ $rc = 0 ] && echo ok || echo "FAILED (rc $rc, $log)")")
    echo "$row" >&2
    table+=("$row")
    [ $rc = 0 ] || { KEEP=1; return 0; }
}

# A one-line change in the ring AllReduce body (a comment line, so the kernels stay correct:
# cargo and rustc see a changed source file all the same).
touch_kernel() {
    echo "// loop-times: edit $(date +%s%N)" >>device/src/coll/all_reduce.rs
}
touch_host() {
    echo "// loop-times: edit $(date +%s%N)" >>host/tune/mod.rs
}
# Whether the last build compiled a kernel: the device crate or the PTX build script.
kernels_rebuilt() {
    grep -E "Compiling nccl-device|Running .*nccl-rs.*build-script-build" "$1" >/dev/null
}

clone() {
    git clone --quiet "$repo" "$tmp/$1"
    cd "$tmp/$1"
}

test_cmd=$(grep -E '^    (rustup toolchain install && )?cargo test' "$repo/README.md" | head -n 1 |
    sed -e 's/^ *//' -e 's/^rustup toolchain install && //')

for s in $steps; do
    case $s in
    bench)
        clone bench
        step "README main job (cargo bench), build + run, clean clone" \
            cargo bench --bench nccl_bench
        ;;
    capi)
        cd "$tmp/bench"
        step "cargo build --release --features capi --lib, after the bench" \
            cargo build --release --features capi --lib
        ;;
    ci)
        clone ci
        step "README test command ($test_cmd), build + run, clean clone" bash -c "$test_cmd"
        step ".ci/run's lints after it (fmt, clippy, doc)" env CI_LINTS_ONLY=1 .ci/run
        ;;
    filtered)
        cd "$tmp/ci"
        export NCCL_RS_KERNELS=all_reduce:f32:sum
        step "first build with NCCL_RS_KERNELS=$NCCL_RS_KERNELS (once per filter)" \
            cargo test --all-features --test "$area" --no-run
        touch_kernel
        step "kernel edit, NCCL_RS_KERNELS=$NCCL_RS_KERNELS: rebuild + run '$area $tests'" \
            cargo test --all-features --test "$area" -- "$tests"
        unset NCCL_RS_KERNELS
        ;;
    full)
        # Both architectures' PTX, asked for: a machine without a GPU builds none by default.
        cd "$tmp/ci"
        export NCCL_RS_PTX_ARCHS=all
        cargo test --all-features --test "$area" --no-run >/dev/null 2>&1 || true
        touch_kernel
        step "kernel edit, every kernel and both PTX (NCCL_RS_PTX_ARCHS=all): rebuild + run '$area $tests'" \
            cargo test --all-features --test "$area" -- "$tests"
        unset NCCL_RS_PTX_ARCHS
        ;;
    bench-all)
        clone bench-all
        step "main job with both PTX (NCCL_RS_PTX_ARCHS=all), build + run, clean clone" \
            env NCCL_RS_PTX_ARCHS=all cargo bench --bench nccl_bench
        ;;
    host)
        cd "$tmp/ci"
        # Everything up to date first (the kernel steps rebuilt only the sim binary's units).
        cargo test --workspace --all-features --no-run >/dev/null 2>&1 || true
        touch_host
        step "host-only edit (host/tune/mod.rs): rebuild the tests" \
            cargo test --workspace --all-features --no-run -v
        log="$tmp/$(echo "host-only edit (host/tune/mod.rs): rebuild the tests" | tr -c 'a-zA-Z0-9' _).log"
        if kernels_rebuilt "$log"; then
            table+=("| host-only edit rebuilt a kernel (device crate or PTX) | yes: FAILED | $log |")
            KEEP=1
        else
            table+=("| host-only edit rebuilt a kernel (device crate or PTX) | no | ok |")
        fi
        ;;
    *)
        echo "unknown step $s" >&2
        exit 2
        ;;
    esac
done

echo
echo "Measured on $(nproc) cores, $(date -u +%Y-%m-%d), $(git -C "$repo" rev-parse --short HEAD):"
echo
echo "| step | time | result |"
echo "|---|---|---|"
printf '%s\n' "${table[@]}"
