//! One-sided operations (`comm/onesided.rs`, NCCL 2.29's `ncclPutSignal`, `ncclSignal`,
//! `ncclWaitSignal`) on the simulator: puts land in the peers' windows before their signals,
//! waits hold their streams until the signals came, counts go on across rounds, ranks in one
//! process and as processes; an abort releases a stream held by a wait; bad arguments are
//! refused with clear errors.

use crate::common::onesided::{all_to_all_by_puts, put_to_self, puts_then_waits, windows};
use crate::common::{self, lend, Ranks};
use nccl::{DataType, NcclResult, ReduceOp, SignalWait};

#[test]
fn puts_land_before_their_signals_in_one_process() {
    common::sim();
    for n in [2, 4] {
        let ranks = common::sim_ranks(n);
        all_to_all_by_puts(&ranks, 1001, 3);
        puts_then_waits(&ranks, 333);
        put_to_self(&ranks, 77);
    }
}

/// Ranks as processes: the windows and signal pads are mapped through the simulator's IPC.
#[test]
fn puts_and_signals_between_processes() {
    let Some((rank, nranks, id)) = common::procs::child() else {
        common::sim();
        common::procs::run(3, &[]);
        return;
    };
    let comm = nccl::Comm::init_rank_on(common::sim_dev(rank), nranks, &id, rank).unwrap();
    let ranks = Ranks::new(vec![comm]);
    all_to_all_by_puts(&ranks, 777, 2);
}

/// Ranks on different nodes (`NCCL_HOSTID`): puts and signals travel over the socket network
/// (`comm/onesided_net.rs`), a put of several chunks too, ranks of one node through it as well.
#[test]
fn puts_and_signals_across_nodes() {
    if let Some(ranks) = crate::multinode::child_comm() {
        let chunks = 2 * 512 * 1024 / 4 + 1001; // floats: a put of three network chunks
        all_to_all_by_puts(&ranks, chunks, 2);
        all_to_all_by_puts(&ranks, 333, 3);
        puts_then_waits(&ranks, 4097);
        put_to_self(&ranks, 1003);
        return;
    }
    common::sim();
    // One lane, and three (an odd count, against chunks of several puts in flight); the
    // default (8 here) runs elsewhere.
    for (nodes, per_node, lanes) in [(2, 1, "1"), (2, 2, "3")] {
        let env = [common::LOOPBACK, ("NCCL_RS_PUT_LANES", lanes)];
        common::procs::run_nodes(nodes, per_node, &env);
    }
}

/// A rank killed while the others' streams wait for its signals across nodes: the waits end,
/// every survivor's async error names it, abort and destroy return.
#[test]
fn a_dead_peer_across_nodes_ends_the_waits_for_it() {
    if let Some(ranks) = crate::multinode::child_comm() {
        let (_w, _) = windows(&ranks, &[4096]);
        let c = &ranks.comms[0];
        let (me, victim) = (c.rank(), c.count() - 1);
        let st = ranks.streams[0];
        // Every rank past the registration before the victim dies: an AllReduce ends on the
        // victim once every rank's part of it ran.
        let one = c.device().alloc(4).unwrap();
        // SAFETY: the test's buffer, alive until the synchronization.
        unsafe {
            c.all_reduce_raw(
                one.ptr(),
                one.ptr(),
                1,
                DataType::Float32,
                ReduceOp::SUM,
                st,
            )
        }
        .unwrap();
        c.device().stream_sync(st).unwrap();
        if me == victim {
            // SAFETY: kill(2) on our own pid.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        c.wait_signal_raw(
            &[SignalWait {
                peer: victim,
                ops: 1,
            }],
            st,
        )
        .unwrap();
        // The wait ends only once the death is known: the fault raises the communicator's
        // error and then the abort flag the wait kernel watches (the harness bounds the run).
        let _ = c.device().stream_sync(st);
        let err = c
            .get_async_error()
            .expect_err("the wait ended with no async error");
        assert!(err.message.contains(&format!("rank {victim}")), "{err}");
        c.abort();
        return;
    }
    common::sim();
    common::procs::run_nodes_with_victim(2, 1, &[common::LOOPBACK], 1);
    common::procs::run_nodes_with_victim(2, 2, &[common::LOOPBACK], 3);
}

/// A signal with no data, waited for; then a wait nobody answers, released by the abort.
#[test]
fn an_abort_releases_a_stream_held_by_a_wait() {
    common::sim();
    let ranks = common::sim_ranks(2);
    let _w = windows(&ranks, &[4096, 4096]);
    let lent = lend(&ranks.comms);
    std::thread::scope(|s| {
        for (i, c) in lent.iter().enumerate() {
            let st = ranks.streams[i];
            s.spawn(move || {
                let peer = 1 - c.rank();
                c.signal_raw(peer, st).unwrap();
                c.wait_signal_raw(&[SignalWait { peer, ops: 1 }], st)
                    .unwrap();
                c.device().stream_sync(st).unwrap();
            });
        }
    });
    let c = &ranks.comms[0];
    let st = ranks.streams[0];
    c.wait_signal_raw(&[SignalWait { peer: 1, ops: 1 }], st)
        .unwrap();
    assert!(
        !c.device().stream_query(st).unwrap(),
        "the wait did not hold the stream"
    );
    c.abort_handle().abort();
    let d = c.device().clone();
    let limit = common::procs::limit();
    common::procs::within(
        "a stream held by a wait, after the abort",
        limit,
        move || d.stream_sync(st).unwrap(),
    );
}

/// Bad arguments: clear errors, nothing issued.
#[test]
fn bad_one_sided_calls_are_refused() {
    common::sim();
    let ranks = common::sim_ranks(2);
    let c = &ranks.comms[0];
    let st = ranks.streams[0];
    let src = c.device().alloc(4096).unwrap();
    let put = |peer: usize, win: u64, offset: usize, count: usize| {
        // SAFETY: the test's buffer; every call here is refused before anything is queued.
        unsafe { c.put_signal_raw(src.ptr(), count, DataType::Float32, peer, win, offset, st) }
            .expect_err("a bad put")
    };
    // No window yet: nothing is mapped.
    assert_eq!(
        c.signal_raw(1, st).unwrap_err().code,
        NcclResult::InvalidUsage
    );
    let (_bufs, handles) = windows(&ranks, &[4096, 2048]);
    let h = handles[0];
    assert_eq!(
        put(2, h, 0, 4).code,
        NcclResult::InvalidArgument,
        "peer out of range"
    );
    assert_eq!(
        put(1, h + 7, 0, 4).code,
        NcclResult::InvalidArgument,
        "unknown window"
    );
    let e = put(1, h, 1024, 300); // 1200 bytes from 1024 overrun rank 1's 2048
    assert_eq!(e.code, NcclResult::InvalidArgument, "{e}");
    assert!(e.message.contains("2048"), "{e}");
    assert_eq!(
        put(1, h, usize::MAX, 1).code,
        NcclResult::InvalidArgument,
        "offset overflow"
    );
    let e = c
        .wait_signal_raw(&[SignalWait { peer: 5, ops: 1 }], st)
        .unwrap_err();
    assert_eq!(e.code, NcclResult::InvalidArgument, "{e}");
    // Captured: refused (the counts are taken when issued).
    let d = c.device();
    d.capture_begin(st).unwrap();
    let e = c.signal_raw(1, st).unwrap_err();
    let _ = d.capture_end(st);
    assert_eq!(e.code, NcclResult::InvalidUsage, "{e}");
    assert!(e.message.contains("graph"), "{e}");
}
