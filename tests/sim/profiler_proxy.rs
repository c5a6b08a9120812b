//! The profiler's proxy events (`ProxyOp`, `ProxyStep`) on the simulator: two nodes of one
//! rank, ring collectives of every kind and of sizes that take LL and Simple steps, through
//! the test plugin (`tests/c/plugins/profiler_record.c`). Each rank process checks that the
//! steps the host predicted for its network connections are the steps its kernels took; the
//! parent then checks every event in the logs.

use super::profiler::{env, logs, of_type, starts, stopped_once, Line};
use crate::common::{self, procs};
use nccl::{Comm, DataType, ReduceOp};
use std::collections::HashMap;

/// What a rank process runs: every ring collective at three sizes, then the check of its
/// predicted step counters against the kernels'.
fn rank_child() -> bool {
    let Some((rank, nranks, id)) = procs::child() else {
        return false;
    };
    let comm = Comm::init_rank_on(common::sim_dev(rank), nranks, &id, rank).expect("init");
    let dev = comm.device();
    let st = dev.stream_create().unwrap();
    let most = 70_000;
    let send = dev.alloc(nranks * most * 4).unwrap();
    let recv = dev.alloc(nranks * most * 4).unwrap();
    send.write(0, &vec![1u8; nranks * most * 4]).unwrap();
    let f32 = DataType::Float32;
    for count in [1, 3000, most] {
        let (s, r) = (send.ptr(), recv.ptr());
        // SAFETY: both buffers hold nranks * most floats; synced below.
        unsafe {
            comm.all_reduce_raw(s, r, count, f32, ReduceOp::SUM, st)
                .unwrap();
            comm.all_gather_raw(s, r, count, f32, st).unwrap();
            comm.reduce_scatter_raw(s, r, count, f32, ReduceOp::SUM, st)
                .unwrap();
            comm.broadcast_raw(s, r, count, f32, 1, st).unwrap();
            comm.reduce_raw(s, r, count, f32, ReduceOp::SUM, 0, st)
                .unwrap();
            comm.all_reduce_raw(r, r, count, f32, ReduceOp::SUM, st)
                .unwrap();
        }
    }
    // Messages around the ring: empty, small, and of many slots.
    let (next, prev) = ((rank + 1) % nranks, (rank + nranks - 1) % nranks);
    for count in [0, 1000, most] {
        nccl::group_start();
        // SAFETY: as above.
        unsafe {
            comm.send_raw(send.ptr(), count, f32, next, st).unwrap();
            comm.recv_raw(recv.ptr(), count, f32, prev, st).unwrap();
        }
        nccl::group_end().unwrap();
    }
    dev.stream_sync(st).unwrap();
    for (peer, to) in [(next, true), (prev, false)] {
        let predicted = comm.p2p_steps_predicted(peer, to);
        let actual = comm.p2p_steps(peer, to).unwrap().unwrap_or_default();
        for (c, (p, a)) in predicted.iter().zip(&actual).enumerate() {
            if let Some(p) = p {
                assert_eq!(
                    p, a,
                    "rank {rank}, connection {c} with {peer}: predicted, taken"
                );
            }
        }
    }
    if std::env::var_os("PROXY_TEST_GRAPH").is_some() {
        // A captured AllReduce, replayed twice, then one more call: the queues are lost, the
        // events so far end, nothing hangs or breaks.
        dev.capture_begin(st).unwrap();
        // SAFETY: as above.
        let issued =
            unsafe { comm.all_reduce_raw(send.ptr(), recv.ptr(), most, f32, ReduceOp::SUM, st) };
        let graph = dev.capture_end(st);
        issued.unwrap();
        let graph = graph.unwrap();
        for _ in 0..2 {
            graph.launch(st).unwrap();
        }
        // SAFETY: as above.
        unsafe { comm.all_reduce_raw(send.ptr(), recv.ptr(), 3000, f32, ReduceOp::SUM, st) }
            .unwrap();
        dev.stream_sync(st).unwrap();
        drop(graph);
        dev.stream_destroy(st).unwrap();
        drop(comm);
        return true;
    }
    let pat = comm.pat_steps_predicted().unwrap();
    for s in comm.dbt_steps_predicted().unwrap().into_iter().chain(pat) {
        assert_eq!(
            s.predicted,
            s.taken,
            "rank {rank}, tree or PAT channel {}, {} rank {}: predicted, taken",
            s.channel,
            if s.send { "to" } else { "from" },
            s.peer
        );
    }
    let predicted = comm.ring_send_steps_predicted();
    let actual = comm.ring_send_steps().unwrap();
    for (c, (p, a)) in predicted.iter().zip(&actual).enumerate() {
        if let Some(p) = p {
            assert_eq!(
                p, a,
                "rank {rank}, channel {c}: predicted steps, the kernels'"
            );
        }
    }
    dev.stream_destroy(st).unwrap();
    drop(comm);
    true
}

/// The records of the event with handle `h`: its states, in order.
fn states(lines: &[Line], h: &str) -> Vec<String> {
    lines
        .iter()
        .filter(|l| l.kind == "record" && l.get("h") == h)
        .map(|l| l.get("state").to_string())
        .collect()
}

/// How many `ProxyOp` events hang from a `Coll` event of algorithm `algo`.
fn ops_under(lines: &[Line], algo: &str) -> usize {
    let by_handle = starts(lines);
    of_type(lines, "ProxyOp")
        .into_iter()
        .filter(|o| {
            by_handle
                .get(o.get("parent"))
                .is_some_and(|p| p.get("algo") == algo)
        })
        .count()
}

/// Runs `nodes` x `per_node` ranks with `mask` and `extra` in their environment; returns
/// each rank's log.
fn run(
    (nodes, per_node): (usize, usize),
    mask: &str,
    tag: &str,
    extra: &[(&str, &str)],
) -> HashMap<usize, Vec<Line>> {
    let prefix = common::plugins::scratch("profiler").join(format!("proxy-{tag}/log"));
    let vars = env(6, mask, &prefix);
    let mut all: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    all.extend([common::LOOPBACK, ("NCCL_ALGO", "Ring")]);
    all.extend(extra);
    procs::run_nodes(nodes, per_node, &all);
    let logs = logs(&prefix);
    assert_eq!(logs.len(), nodes * per_node, "a log per rank");
    logs
}

#[test]
fn proxy_ops_and_steps_of_ring_collectives_across_nodes() {
    if rank_child() {
        return;
    }
    for (r, lines) in &run((2, 1), "0x7fff", "all", &[]) {
        stopped_once(lines);
        let by_handle = starts(lines);
        let ops = of_type(lines, "ProxyOp");
        assert!(!ops.is_empty(), "rank {r}: no ProxyOp event");
        let (mut sends, mut recvs) = (0, 0);
        let mut p2p = 0;
        for op in &ops {
            let parent = by_handle.get(op.get("parent")).map(|p| p.get("type"));
            assert!(
                matches!(parent, Some("Coll") | Some("P2p")),
                "rank {r}: {op:?}'s parent"
            );
            p2p += usize::from(parent == Some("P2p"));
            assert_eq!(op.get("peer"), (1 - r).to_string(), "rank {r}: {op:?}");
            assert!(op.get("pid").parse::<u32>().is_ok(), "rank {r}: {op:?}");
            let n: usize = op.get("steps").parse().unwrap();
            assert!(n > 0, "rank {r}: {op:?}");
            let send = op.get("send") == "1";
            if send {
                sends += 1;
            } else {
                recvs += 1;
            }
            // Its steps: numbered 0 to n - 1 in order, each through its two states.
            let steps: Vec<&Line> = of_type(lines, "ProxyStep")
                .into_iter()
                .filter(|s| s.get("parent") == op.get("h"))
                .collect();
            let numbers: Vec<String> = steps.iter().map(|s| s.get("step").to_string()).collect();
            let want: Vec<String> = (0..n).map(|i| i.to_string()).collect();
            assert_eq!(numbers, want, "rank {r}: the steps of {op:?}");
            let expect = match send {
                true => ["8", "9"],
                false => ["10", "12"],
            };
            for s in steps {
                assert_eq!(states(lines, s.get("h")), expect, "rank {r}: {s:?}");
            }
            assert_eq!(states(lines, op.get("h")), ["19"], "rank {r}: {op:?}");
        }
        assert!(
            sends > 0 && recvs > 0,
            "rank {r}: {sends} sends, {recvs} receives"
        );
        assert!(p2p > 0, "rank {r}: no ProxyOp of a send or receive");
    }
    // The mask without ProxyStep: the ops alone.
    for (r, lines) in &run((2, 1), "0xa", "ops", &[]) {
        stopped_once(lines);
        assert!(
            !of_type(lines, "ProxyOp").is_empty(),
            "rank {r}: no ProxyOp"
        );
        assert!(
            of_type(lines, "ProxyStep").is_empty(),
            "rank {r}: a ProxyStep"
        );
    }
}

/// The predicted steps match the kernels' (each rank process checks) on more ranks and
/// channels, with rings that cross nodes between ranks of a node, with LL128, the trees and
/// PAT; and a kernel that takes uncounted steps ends its connections' events.
#[test]
fn predicted_proxy_steps_are_the_kernels_steps() {
    if rank_child() {
        return;
    }
    let three = [("NCCL_MIN_NCHANNELS", "3")];
    for (r, lines) in &run((3, 1), "0x7fff", "three", &three) {
        stopped_once(lines);
        assert!(
            !of_type(lines, "ProxyOp").is_empty(),
            "rank {r}: no ProxyOp"
        );
    }
    run((2, 2), "0x7fff", "two-by-two", &[]);
    // One node whose ranks reach each other over the network (p2p and SHM off), with the
    // one-node tree, whose steps nothing counts: its connections' queues are lost, every
    // event started ends, the ring's predictions held until then.
    let one_node = [
        ("NCCL_P2P_DISABLE", "1"),
        ("NCCL_SHM_DISABLE", "1"),
        (
            "NCCL_ALGO",
            "allreduce:tree;allgather:ring;reducescatter:ring;broadcast:ring;reduce:ring",
        ),
    ];
    for (r, lines) in &run((1, 2), "0x7fff", "one-node-net", &one_node) {
        stopped_once(lines);
        assert!(!of_type(lines, "Coll").is_empty(), "rank {r}: no Coll");
    }
    run((2, 1), "0x7fff", "ll128", &[("NCCL_PROTO", "LL128")]);
    // PAT on 3, 4 and 5 nodes of one rank: packed pieces and a step per offset.
    let pat = [(
        "NCCL_ALGO",
        "allgather:pat;reducescatter:pat;allreduce:ring;broadcast:ring;reduce:ring",
    )];
    for nodes in [3, 4, 5] {
        let tag = format!("pat{nodes}");
        for (r, lines) in &run((nodes, 1), "0x7fff", &tag, &pat) {
            stopped_once(lines);
            let pat_ops = ops_under(lines, "PAT");
            assert!(pat_ops > 0, "rank {r} of {tag}: no ProxyOp of a PAT call");
        }
    }
    // The double binary tree: on 4 nodes (its fan, Simple and LL), and on 2 nodes of 2 ranks
    // (the heads' exchange).
    for (nodes, per_node, tag) in [(4, 1, "tree4"), (2, 2, "tree2x2")] {
        let tree = [(
            "NCCL_ALGO",
            "allreduce:tree;allgather:ring;reducescatter:ring;broadcast:ring;reduce:ring",
        )];
        for (r, lines) in &run((nodes, per_node), "0x7fff", tag, &tree) {
            stopped_once(lines);
            let tree_ops = ops_under(lines, "TREE");
            assert!(
                tree_ops > 0,
                "rank {r} of {tag}: no ProxyOp of a tree AllReduce"
            );
        }
    }
    // A launch captured into a graph: the connections' events stop, each started one ends.
    for (r, lines) in &run((2, 1), "0x7fff", "graph", &[("PROXY_TEST_GRAPH", "1")]) {
        stopped_once(lines);
        assert!(
            !of_type(lines, "ProxyOp").is_empty(),
            "rank {r}: no ProxyOp"
        );
    }
}
