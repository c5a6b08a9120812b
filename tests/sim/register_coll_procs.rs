//! Ring and tree collectives on registered buffers with ranks as processes (the in-process
//! cases are `register_coll`'s): a registered output reaches the peers as a record, which they
//! map before their launches, so the rounds after the first go direct; graph registration does
//! the same for captured calls.

use super::register_coll::{counts, COLLS};
use crate::common::register::{coll_round, expected_direct, Who};
use crate::common::{self, procs};
use nccl::Comm;
use nccl_device::abi::Coll;

/// A rank of a child process of [`procs::run`].
fn child_comm() -> Option<Comm> {
    let (rank, nranks, id) = procs::child()?;
    Some(
        Comm::init_rank_on(common::sim_dev(rank), nranks, &id, rank).expect("init_rank in a child"),
    )
}

/// Ranks as processes: a registered output reaches the predecessor as a record (an IPC handle
/// of its allocation), which it maps before a launch; an offer not yet mapped is declined and
/// the data takes the FIFO, so the first rounds after registering may copy. Every round's
/// result is checked; rounds where nobody registered never go direct, and with the output
/// registered once, the last round of AllGather, AllReduce and Broadcast goes direct.
#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_gather",
        nccl_rs_kernel = "nccl_all_reduce_int32_sum",
        nccl_rs_kernel = "nccl_broadcast",
        nccl_rs_kernel = "nccl_reduce_scatter_int32_sum",
        nccl_rs_kernel = "nccl_reduce_int32_sum"
    )),
    ignore = "needs nccl_all_gather, nccl_all_reduce_int32_sum, nccl_broadcast, nccl_reduce_scatter_int32_sum, nccl_reduce_int32_sum, which NCCL_RS_KERNELS left out"
)]
fn registered_ring_collectives_across_processes() {
    if let Some(comm) = child_comm() {
        let rank = comm.rank();
        let comms = vec![comm];
        for (k, coll) in COLLS.into_iter().enumerate() {
            let count = counts(coll)[1];
            let got = coll_round(&comms, coll, Who::None, count, k == 1, 70 + k as u64);
            assert!(got[0].iter().all(|&s| s == 0), "rank {rank}: {got:?}");
        }
        // The same output registered once for every round: its record reaches the
        // predecessor's process before that process's launches after the first rounds, and the
        // last round of each collective goes direct on every channel that fills a step.
        // The last two rounds: out of place, then in place (AllReduce's reduce-scatter half
        // goes direct only out of place).
        for coll in COLLS {
            let count = counts(coll)[1];
            let rounds: Vec<_> = (0..6u64)
                .map(|k| registered_once(&comms[0], coll, count, k % 2 == 1, 80 + k))
                .collect();
            for (k, got) in rounds.iter().enumerate().skip(4) {
                let in_place = k % 2 == 1;
                let want = expected_direct(&comms[0], coll, |_| true, count, in_place, true);
                assert_eq!(
                    got,
                    &want,
                    "rank {rank}: registered {} (in place {in_place}) did not go direct",
                    coll.name()
                );
            }
        }
        // ReduceScatter and Reduce on outputs registered afresh each round: the records may
        // or may not reach the predecessor's process before its launch (an offer it cannot
        // map yet is declined), so each channel went direct on its whole slice or not at all;
        // the results are checked either way.
        use common::register::{reduce_root_round, reduce_scatter_round};
        let (dt, op) = (nccl::DataType::Int32, nccl::ReduceOp::SUM);
        for k in 0..4u64 {
            let in_place = k % 2 == 1;
            for (coll, got, count) in [
                (
                    Coll::ReduceScatter,
                    reduce_scatter_round::<i32>(&comms, dt, op, Who::All, 20_001, in_place, 90 + k),
                    20_001,
                ),
                (
                    Coll::Reduce,
                    reduce_root_round::<i32>(&comms, dt, op, Who::All, 10_001, in_place, 95 + k),
                    10_001,
                ),
            ] {
                let want = expected_direct(&comms[0], coll, |_| true, count, in_place, true);
                for (g, w) in got[0].iter().zip(&want) {
                    assert!(
                        *g == 0 || g == w,
                        "rank {rank}: {} (in place {in_place}) took {:?} direct steps, at most \
                         {want:?}",
                        coll.name(),
                        got[0]
                    );
                }
            }
        }
        return;
    }
    for n in [2usize, 3] {
        common::procs::run(
            n,
            &[
                ("NCCL_PROTO", "Simple"),
                ("NCCL_ALGO", "Ring"),
                ("NCCL_LOCAL_REGISTER", "1"),
                // Registered calls on fewer CTAs: the agreement across processes too.
                ("NCCL_RS_REGISTERED_CTAS", "1"),
            ],
        );
    }
}

/// The one-node tree AllReduce with ranks as processes: a child's way up translates its
/// parent's (the ring predecessor's) offer through that rank's registration records
/// ([`nccl_device::abi::ChannelDev::prev_reach`]), the way down its child's as the ring does.
/// With the output registered once, the last two rounds (out of place: both ways; in place: the
/// way down) go direct on every channel that fills a step; every round's result is checked.
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_int32_sum"),
    ignore = "needs nccl_all_reduce_int32_sum, which NCCL_RS_KERNELS left out"
)]
fn registered_tree_all_reduce_across_processes() {
    if let Some(comm) = child_comm() {
        let rank = comm.rank();
        let count = counts(Coll::AllReduce)[1];
        let choice = comm.tuning(nccl::Coll::AllReduce, 4 * count).unwrap();
        assert_eq!(
            choice.algo,
            nccl::Algo::Tree,
            "rank {rank}: the forced tree"
        );
        let rounds: Vec<_> = (0..6u64)
            .map(|k| registered_once(&comm, Coll::AllReduce, count, k % 2 == 1, 180 + k))
            .collect();
        let mut modelled = 0;
        for (k, got) in rounds.iter().enumerate().skip(4) {
            let in_place = k % 2 == 1;
            let want = expected_direct(&comm, Coll::AllReduce, |_| true, count, in_place, true);
            modelled += want.iter().sum::<u64>();
            assert_eq!(
                got, &want,
                "rank {rank}: the registered tree (in place {in_place}) did not go direct"
            );
        }
        // (In place the root has none: it receives nothing on the way down.)
        assert!(modelled > 0, "rank {rank}: the model says no direct step");
        return;
    }
    for n in [2usize, 3] {
        common::procs::run(
            n,
            &[
                ("NCCL_PROTO", "Simple"),
                ("NCCL_ALGO", "Tree"),
                ("NCCL_LOCAL_REGISTER", "1"),
                ("NCCL_RS_REGISTERED_CTAS", "0"),
            ],
        );
    }
}

/// A collective (as [`coll_round`] runs it) into an output registered once for the whole process
/// (so the peers' records are in after the first rounds): checks the result and returns the
/// direct steps per channel.
fn registered_once(c: &Comm, coll: Coll, count: usize, in_place: bool, seed: u64) -> Vec<u64> {
    use common::register::{coll_data, elem_bytes, root_of};
    use std::sync::OnceLock;
    /// Room for every round's input and output (3 ranks at most).
    const ROOM: usize = 1 << 20;
    static BUFS: OnceLock<(nccl::DevBuffer, nccl::DevBuffer)> = OnceLock::new();
    let (n, r) = (c.count(), c.rank());
    let (inp, out) = BUFS.get_or_init(|| {
        let inp = c.device().alloc(ROOM).unwrap();
        let out = c.device().alloc(ROOM).unwrap();
        // SAFETY: the buffer lives (in the static) as long as the process.
        unsafe { c.register_raw(out.ptr(), ROOM).unwrap() };
        (inp, out)
    });
    let bytes = count * elem_bytes(coll);
    let (mine, want) = coll_data(coll, n, r, count, seed);
    assert!(want.len() <= ROOM);
    out.write(0, &vec![0xA5; want.len()]).unwrap();
    let at = if coll == Coll::AllGather {
        r * bytes
    } else {
        0
    };
    let send = if in_place {
        if coll != Coll::Broadcast || r == root_of(n) {
            out.write(at, &mine).unwrap();
        }
        out.ptr() + at as u64
    } else {
        inp.write(0, &mine).unwrap();
        inp.ptr()
    };
    let stream = c.device().stream_create().unwrap();
    let before = c.ring_direct_steps().unwrap();
    let recv = out.ptr();
    // SAFETY: both buffers hold what the call needs and live in the static.
    unsafe {
        match coll {
            Coll::AllGather => c.all_gather_raw(send, recv, count, nccl::DataType::Uint8, stream),
            Coll::Broadcast => {
                c.broadcast_raw(send, recv, count, nccl::DataType::Uint8, root_of(n), stream)
            }
            _ => c.all_reduce_raw(
                send,
                recv,
                count,
                nccl::DataType::Int32,
                nccl::ReduceOp::SUM,
                stream,
            ),
        }
        .unwrap();
    }
    c.device().stream_sync(stream).unwrap();
    c.device().stream_destroy(stream).unwrap();
    let mut got = vec![0u8; want.len()];
    out.read(0, &mut got).unwrap();
    assert!(
        got == want,
        "rank {r}: wrong {} result (in place {in_place})",
        coll.name()
    );
    let now = c.ring_direct_steps().unwrap();
    now.iter().zip(before).map(|(a, b)| a - b).collect()
}

/// The double binary tree across nodes (ranks as processes, nodes by `NCCL_HOSTID`, sockets over
/// loopback between them) on registered outputs: on the links inside a node (its chain, through
/// p2p), a child's partial sums land in its parent's output (out of place) and the parent's
/// results in the child's, through the tree links' handshake; the links between nodes copy
/// through the network. [`common::register::TREE_ACROSS_NODES`] names the shapes, and
/// [`common::register::registered_tree_across_nodes`] what each rank checks.
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_int32_sum"),
    ignore = "needs nccl_all_reduce_int32_sum, which NCCL_RS_KERNELS left out"
)]
fn registered_tree_across_nodes_goes_direct_inside_nodes() {
    if let Some(comm) = child_comm() {
        common::register::registered_tree_across_nodes(&comm);
        return;
    }
    for shape in common::register::TREE_ACROSS_NODES {
        let env = shape.env();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        common::procs::run_nodes(shape.nodes, shape.per_node, &env);
    }
}

/// Graph registration with ranks as processes: a capture registers the output's allocation and
/// sends its record, and the predecessor's capture waits for it (the marks of
/// comm/graph_reg.rs), so every replay of the graph goes direct on buffers nobody registered,
/// on rings (AllGather, AllReduce, Broadcast) and on the one-node tree (AllReduce); eager calls
/// into it copy, and once the graph is destroyed the next call withdraws it. Random data and
/// poisoned outputs in every replay and round (`common::register::captured_coll_rounds`).
#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_gather",
        nccl_rs_kernel = "nccl_all_reduce_int32_sum",
        nccl_rs_kernel = "nccl_broadcast"
    )),
    ignore = "needs nccl_all_gather, nccl_all_reduce_int32_sum, nccl_broadcast, which NCCL_RS_KERNELS left out"
)]
fn captured_collectives_go_direct_across_processes_until_the_graph_is_gone() {
    if let Some(c) = child_comm() {
        let rank = c.rank();
        let colls = COLLS.map(|coll| (coll, counts(coll)[1]));
        match std::env::var("NCCL_ALGO").as_deref() {
            // The one-node tree: AllReduce, its way down and (out of place) up direct.
            Ok("Tree") => {
                let choice = c.tuning(nccl::Coll::AllReduce, 4 * colls[1].1).unwrap();
                assert_eq!(
                    choice.algo,
                    nccl::Algo::Tree,
                    "rank {rank}: the forced tree"
                );
                common::register::captured_coll_rounds(&c, &colls[1..2]);
            }
            _ => common::register::captured_coll_rounds(&c, &colls),
        }
        return;
    }
    for (n, algo, ctas) in [(2usize, "Ring", "1"), (3, "Ring", "1"), (3, "Tree", "0")] {
        common::procs::run(
            n,
            &[
                ("NCCL_PROTO", "Simple"),
                ("NCCL_ALGO", algo),
                ("NCCL_LOCAL_REGISTER", "1"),
                ("NCCL_GRAPH_REGISTER", "1"),
                ("NCCL_RS_REGISTERED_CTAS", ctas),
            ],
        );
    }
}

/// Graph registration is a setting of each process: a peer whose process has it off
/// (NCCL_GRAPH_REGISTER=0) sends no marks, so a captured launch does not wait for it (before,
/// one NCCL_RS_GRAPH_REG_WAIT_MS wait per such peer, and a warning). Here the wait is 1 ms,
/// which rank 1 would outlast every time: with rank 1's setting ignored, rank 0 would count
/// it late. Every replay's results are checked on both ranks.
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_int32_sum"),
    ignore = "needs nccl_all_reduce_int32_sum, which NCCL_RS_KERNELS left out"
)]
fn a_peer_without_graph_registration_is_never_waited_for() {
    if let Some(c) = child_comm() {
        let rank = c.rank();
        common::register::captured_allreduce_replays(&c, 3000);
        assert_eq!(
            c.graph_late_peers(),
            0,
            "rank {rank}: a peer was waited for in vain"
        );
        return;
    }
    let env = [
        ("NCCL_PROTO", "Simple"),
        ("NCCL_ALGO", "Ring"),
        ("NCCL_LOCAL_REGISTER", "1"),
        ("NCCL_RS_GRAPH_REG_WAIT_MS", "1"),
    ];
    // Rank 1's process has graph registration off.
    common::procs::run_each(2, &env, |rank| {
        let on = if rank == 1 { "0" } else { "1" };
        vec![("NCCL_GRAPH_REGISTER".into(), on.into())]
    });
}
