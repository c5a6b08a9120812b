//! `ncclCommSuspend` / `ncclCommResume` (NCCL 2.29): an idle communicator gives back its
//! connections' device memory (the simulator's free memory grows by it, and its ranges fault if
//! touched), refuses every operation until resumed, and afterwards works as before at the same
//! addresses: collectives and sends after the resume, and CUDA graphs captured before the
//! suspend, replay correctly, ranks as threads and as processes.

use crate::common::graphs::{capture_and_replay_with, FirstUse};
use crate::common::p2p::check_all_to_all;
use crate::common::suspend::{after_even_replays, free_of, suspend_and_resume};
use crate::common::{self, check_all_reduce, every_collective, procs, Drive, Ranks};
use nccl::{Comm, DataType, NcclResult, ReduceOp, SUSPEND_MEM};

#[test]
fn threads_suspend_and_resume_between_collectives() {
    common::sim();
    let ranks = common::sim_ranks(3);
    for c in &ranks.comms {
        // A flag word without NCCL_SUSPEND_MEM suspends nothing.
        c.suspend(0).expect("flags 0");
        assert!(!c.is_suspended());
    }
    every_collective(&ranks, 11);
    check_all_to_all(&ranks, 3000, Drive::Group).unwrap();
    // Inside a group the calls queued before would launch after the release: refused.
    nccl::group_start();
    let e = ranks.comms[0]
        .suspend(SUSPEND_MEM)
        .expect_err("a suspend inside a group");
    nccl::group_end().unwrap();
    assert_eq!(e.code, NcclResult::InvalidUsage, "{e}");
    assert!(e.message.contains("group"), "{e}");
    for round in 0..2 {
        suspend_and_resume(&ranks).unwrap_or_else(|e| panic!("round {round}: {e}"));
        every_collective(&ranks, 12 + round);
        check_all_to_all(&ranks, 3000, Drive::Group).unwrap();
    }
}

/// Graphs captured before a suspend replay after the resume: every address they hold is back.
#[test]
fn graphs_captured_before_a_suspend_replay_after_it() {
    common::sim();
    let ranks = common::sim_ranks(2);
    capture_and_replay_with(&ranks, 6, FirstUse::BeforeCapture, &after_even_replays).unwrap();
}

/// Ranks as processes: each maps its neighbours' blocks from their descriptors, unmaps them on
/// suspend and maps the new ones on resume.
#[test]
fn processes_suspend_and_resume() {
    let Some((rank, nranks, id)) = procs::child() else {
        common::sim();
        procs::run(3, &[]);
        return;
    };
    common::sim();
    let comm = Comm::init_rank_on(common::sim_dev(rank), nranks, &id, rank).expect("init");
    let ranks = Ranks::new(vec![comm]);
    let (f, sum) = (DataType::Float32, ReduceOp::SUM);
    check_all_reduce(&ranks, 50_001, f, sum, false, 1, Drive::OneThread).unwrap();
    check_all_to_all(&ranks, 3000, Drive::Group).unwrap();
    for round in 0..2u64 {
        let c = &ranks.comms[0];
        let (held, free) = (c.suspendable_memory(), free_of(c));
        assert!(held > 0, "rank {rank}: nothing suspendable");
        c.suspend(SUSPEND_MEM).expect("suspend");
        assert!(
            free_of(c) >= free + held,
            "rank {rank}: {held} bytes suspendable, {} given back",
            free_of(c) - free
        );
        c.resume().expect("resume");
        check_all_reduce(
            &ranks,
            50_001,
            f,
            sum,
            round == 1,
            2 + round,
            Drive::OneThread,
        )
        .unwrap();
        check_all_to_all(&ranks, 3000, Drive::Group).unwrap();
    }
    every_collective(&ranks, 21);
}

/// With `NCCL_CUMEM_ENABLE=0` the connections' memory is plain: nothing is suspendable, and a
/// suspend is refused (the communicator stays usable). With it on one rank only, the other
/// ranks are refused too (a remote error naming that rank), rather than left waiting.
#[test]
fn plain_memory_refuses_a_suspend() {
    let Some((rank, nranks, id)) = procs::child() else {
        common::sim();
        procs::run(2, &[("NCCL_CUMEM_ENABLE", "0")]);
        procs::run_each(3, &[], |r| match r {
            1 => vec![("NCCL_CUMEM_ENABLE".into(), "0".into())],
            _ => Vec::new(),
        });
        return;
    };
    common::sim();
    let comm = Comm::init_rank_on(common::sim_dev(rank), nranks, &id, rank).expect("init");
    let plain = std::env::var("NCCL_CUMEM_ENABLE").is_ok_and(|v| v == "0");
    assert_eq!(comm.suspendable_memory() == 0, plain, "rank {rank}");
    let e = comm
        .suspend(SUSPEND_MEM)
        .expect_err("a suspend where some memory is plain");
    if plain {
        assert_eq!(e.code, NcclResult::InvalidUsage, "{e}");
        assert!(e.message.contains("NCCL_CUMEM_ENABLE"), "{e}");
    } else {
        assert_eq!(e.code, NcclResult::RemoteError, "{e}");
        assert!(e.message.contains("rank 1 could not go on"), "{e}");
    }
    assert!(!comm.is_suspended());
    let ranks = Ranks::new(vec![comm]);
    let (f, sum) = (DataType::Float32, ReduceOp::SUM);
    check_all_reduce(&ranks, 4099, f, sum, false, 5, Drive::OneThread).unwrap();
}
