//! One-sided operations on real GPUs (ignored without one; see `collectives.rs`): puts on the
//! copy engine into peers' windows, signals as stream writes, waits in the wait kernel; across
//! nodes over the socket network; and the copy-engine collectives (CTAPolicy zero).

use crate::collectives::{counts, gpus};
use crate::common::onesided::{all_to_all_by_puts, copy_engine_cases, puts_then_waits};

/// Puts then waits on one stream (nccl-tests' pattern), 2 and 4 ranks of one process.
#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn puts_then_waits_on_one_stream() {
    for n in counts(&[2, 4]) {
        puts_then_waits(&gpus(n), 100_003);
    }
}

/// An all-to-all made of `ncclPutSignal` and `ncclWaitSignal` on 2 and 4 ranks of one
/// process, three rounds on the same windows: the waits hold their streams until the data
/// landed. The barrier between is an AllReduce launched while the waits hold their streams:
/// its kernel must be loaded at init (NCCL_RS_PRELOAD_KERNELS names it for builds without
/// SASS), since loading it then waits for the held waits (the hang of session 29).
#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn puts_and_signals_on_2_and_4_ranks() {
    let preload = [("NCCL_RS_PRELOAD_KERNELS", "nccl_all_reduce_float_sum")];
    crate::common::procs::isolated(&preload, &[], || {
        for n in counts(&[2, 4]) {
            let ranks = gpus(n);
            all_to_all_by_puts(&ranks, 100_003, 3);
        }
    });
}

/// Puts and signals across 2 nodes (`NCCL_HOSTID` each; loopback sockets), a rank process
/// per node and two: staged through pinned host memory, carried by the communicators'
/// one-sided threads. With NCCL_RS_SHARED_GPUS=1 the processes share one GPU (start the MPS
/// daemon first).
#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn puts_and_signals_across_two_nodes() {
    if let Some(ranks) = crate::collectives::child_rank() {
        all_to_all_by_puts(&ranks, 300_001, 2);
        puts_then_waits(&ranks, 4097);
        return;
    }
    let env = [
        ("NCCL_SOCKET_IFNAME", "lo"),
        ("NCCL_RS_PRELOAD_KERNELS", "nccl_all_reduce_float_sum"),
    ];
    for (nodes, per_node) in [(2, 1), (2, 2)] {
        crate::common::procs::run_nodes(nodes, per_node, &env);
    }
}

/// AllGather, AlltoAll, Gather and Scatter on symmetric windows on the copy engines
/// (NCCL_CTA_POLICY=2), 2 and 4 ranks of one process; on plain buffers they keep their kernels.
#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn copy_engine_collectives_on_2_and_4_ranks() {
    crate::common::procs::isolated(&[("NCCL_CTA_POLICY", "2")], &[], || {
        for n in counts(&[2, 4]) {
            copy_engine_cases(&gpus(n));
        }
    });
}
