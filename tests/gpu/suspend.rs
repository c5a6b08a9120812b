//! `ncclCommSuspend` / `ncclCommResume` on a GPU: the connections' VMM blocks released
//! (`cuMemUnmap` + `cuMemRelease`, the device's free memory grows) and mapped again at the same
//! addresses; collectives, sends and graphs captured before the suspend run correctly after
//! it. Ranks of one process, and ranks as processes (their blocks mapped from POSIX
//! descriptors, unmapped and mapped anew), sharing a GPU with NCCL_RS_SHARED_GPUS=1.

use super::collectives::{child_rank, gpus};
use crate::common::graphs::{capture_and_replay_with, FirstUse};
use crate::common::p2p::check_all_to_all;
use crate::common::suspend::{after_even_replays, suspend_and_resume};
use crate::common::{self, every_collective, Drive, Ranks};

/// Every collective and an all-to-all, then twice: every rank suspended and resumed, and
/// both again.
fn around_suspends(ranks: &Ranks, seed: u64) {
    every_collective(ranks, seed);
    check_all_to_all(ranks, 70_000, Drive::Group).unwrap();
    for round in 0..2 {
        suspend_and_resume(ranks).unwrap_or_else(|e| panic!("round {round}: {e}"));
        every_collective(ranks, seed + 1 + round);
        check_all_to_all(ranks, 70_000, Drive::Group).unwrap();
    }
}

#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn suspend_and_resume_ranks_of_one_process() {
    let ranks = gpus(2);
    around_suspends(&ranks, 31);
    capture_and_replay_with(&ranks, 4, FirstUse::BeforeCapture, &after_even_replays).unwrap();
}

#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn suspend_and_resume_ranks_as_processes() {
    if let Some(ranks) = child_rank() {
        around_suspends(&ranks, 41);
        return;
    }
    common::procs::run(2, &[]);
}
