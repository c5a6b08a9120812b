//! Communicators across nodes on the CPU simulator: ranks are processes, grouped into nodes by
//! `NCCL_HOSTID`, so ranks of one node reach each other through p2p (simulated IPC) and ranks of
//! different nodes through the network transport (the socket network over loopback) and the
//! proxy threads. Every collective, protocol and algorithm is checked with random data and
//! poisoned outputs.

use crate::common::{self, Drive, Ranks, LOOPBACK};
use nccl::{DataType, RedOpKind, ReduceOp};

/// A rank of a child process of `procs::run_nodes`, with a stream.
pub(crate) fn child_comm() -> Option<Ranks> {
    let (rank, nranks, id) = common::procs::child()?;
    let dev = common::sim_dev(rank);
    let comm = nccl::Comm::init_rank_on(dev, nranks, &id, rank).expect("init_rank across nodes");
    Some(Ranks::new(vec![comm]))
}

#[test]
fn ring_collectives_across_nodes() {
    if let Some(ranks) = child_comm() {
        // The tuner sees the nodes: across the socket network LL ends at a few KiB (on one
        // node it runs to MiBs), and the tuned time of a large AllReduce counts the network.
        let c = &ranks.comms[0];
        let mid = c.tuning(nccl::Coll::AllReduce, 256 << 10).unwrap();
        assert_ne!(mid.proto, nccl::tune::Proto::Ll, "{mid:?}");
        let big = c.tuning(nccl::Coll::AllReduce, 256 << 20).unwrap();
        // 256 MiB over loopback, which the tuner counts at 10 GB/s: over 20 ms.
        assert!(big.est_time_us > 20_000.0, "{big:?}");
        // Two rings across nodes unless NCCL_MIN_NCHANNELS asks for more.
        let rings = std::env::var("NCCL_MIN_NCHANNELS").map_or(2, |v| v.parse().unwrap()); // the simulator's 2
        assert_eq!(c.shape().nchannels, rings);
        // A large collective uses every ring the communicator connected across the network.
        assert_eq!(big.nchannels, c.shape().nchannels as usize, "{big:?}");
        common::every_collective(&ranks, 1);
        return;
    }
    for (nodes, per_node) in [(2, 1), (2, 2), (3, 2), (4, 2)] {
        common::procs::run_nodes(nodes, per_node, &[LOOPBACK]);
    }
    let env = [LOOPBACK, ("NCCL_MIN_NCHANNELS", "3")];
    common::procs::run_nodes(2, 2, &env);
}

#[test]
fn every_protocol_and_algorithm_across_nodes() {
    if let Some(ranks) = child_comm() {
        common::every_collective(&ranks, 2);
        return;
    }
    for proto in ["LL", "LL128", "Simple"] {
        let env = [LOOPBACK, ("NCCL_PROTO", proto)];
        common::procs::run_nodes(2, 2, &env);
    }
    // The small-message protocols where rings cross three and four nodes (two ranks each).
    for (nodes, proto) in [(3, "LL"), (3, "LL128"), (4, "LL"), (4, "LL128")] {
        let env = [LOOPBACK, ("NCCL_PROTO", proto)];
        common::procs::run_nodes(nodes, 2, &env);
    }
    let env = [LOOPBACK, ("NCCL_ALGO", "allreduce:tree")];
    common::procs::run_nodes(2, 2, &env);
}

/// LL steps (published without a release, their lines checked by the proxy before it sends
/// them) and Simple steps (released) in turn on the same network connections, in odd runs so
/// that every FIFO slot carries both kinds and a slot's size word goes from one kind to the
/// other: AllGathers on 2 ranks (one step per chunk), each checked.
#[test]
fn ll_and_simple_steps_in_turn_across_nodes() {
    if let Some(ranks) = child_comm() {
        let c = &ranks.comms[0];
        let big = 1 << 20;
        // AllGather: one step per chunk on 2 ranks, so a small call is one LL step.
        let coll = nccl::Coll::AllGather;
        let simple = c.tuning(coll, 8 * big).unwrap();
        assert_eq!(simple.proto, nccl::tune::Proto::Simple, "{simple:?}");
        let ll = c.tuning(coll, 16).unwrap();
        assert_eq!(ll.proto, nccl::tune::Proto::Ll, "{ll:?}");
        for (k, (count, calls)) in [(2, 1), (big, 1), (2, 3), (big, 2), (2, 1), (big, 1)]
            .into_iter()
            .enumerate()
        {
            for call in 0..calls {
                let seed = (k * 10 + call) as u64;
                common::check_collective(
                    &ranks,
                    nccl_device::abi::Coll::AllGather,
                    count,
                    DataType::Float32,
                    ReduceOp::SUM,
                    0,
                    false,
                    seed,
                    Drive::OneThread,
                )
                .unwrap_or_else(|e| panic!("count {count}, call {call}: {e}"));
            }
        }
        return;
    }
    common::procs::run_nodes(2, 1, &[LOOPBACK]);
}

/// ncclSend/ncclRecv across nodes: an all-to-all in one group (every pair, self included, a
/// different size each), so each rank talks to peers on its node over p2p and to the others
/// over the network.
#[test]
fn send_recv_all_to_all_across_nodes() {
    if let Some(ranks) = child_comm() {
        for scale in [1usize, 3000, 70_000] {
            common::check_all_to_all(&ranks, scale, Drive::OneThread)
                .unwrap_or_else(|e| panic!("scale {scale}: {e}"));
        }
        return;
    }
    // Four connections per peer: a message smaller than 4 x 64 KiB leaves some idle across
    // nodes (enqueue::p2p::NET_MIN_PART) and uses them all inside a node.
    for (nodes, per_node) in [(2, 1), (2, 2), (3, 1), (3, 2)] {
        common::procs::run_nodes(nodes, per_node, &[LOOPBACK, ("NCCL_RS_SIM_P2P_CONNS", "4")]);
    }
}

/// NCCL_ALGO=allreduce:tree across nodes runs NCCL's double binary tree: each channel's CTA
/// in one of the two trees over the nodes (a chain inside each node), with up to two child
/// nodes. In each child: the tuner forces the tree, the kernels' tree places (read back from
/// the device) are the double binary tree's of the node list, and AllReduce is right for
/// random data, poisoned outputs, in and out of place, sizes that divide by nothing (one
/// element to many FIFO slots per channel), and the operators whose `pre` or `post` a rank
/// with two children must apply exactly once.
#[test]
fn double_binary_tree_all_reduce_across_nodes() {
    if std::env::var_os("DBT_TEST_LOG").is_some() {
        assert!(nccl::init_logging(), "no other logger in this process");
    }
    if let Some(ranks) = child_comm() {
        use nccl::{Algo, Coll, Proto};
        let c = &ranks.comms[0];
        // Forced LL (NCCL_PROTO=LL): the tree's one-peer LL steps at every size.
        let ll = std::env::var("NCCL_PROTO").is_ok_and(|p| p == "LL");
        for bytes in [8, 1 << 30] {
            let t = c.tuning(Coll::AllReduce, bytes).unwrap();
            assert_eq!(t.algo, Algo::Tree, "{bytes} B");
            if ll {
                assert_eq!(t.proto, Proto::Ll, "{bytes} B");
            } else if bytes > 8 {
                assert_eq!(t.proto, Proto::Simple, "{bytes} B");
            }
        }
        let per_node: usize = std::env::var("DBT_TEST_PER_NODE").unwrap().parse().unwrap();
        let (rank, nranks) = (c.rank(), c.count());
        let nodes: Vec<Vec<usize>> = (0..nranks / per_node)
            .map(|n| (n * per_node..(n + 1) * per_node).collect())
            .collect();
        let nch = c.shape().nchannels as usize;
        let want = nccl::graph::dbt_channels(&nodes, nch);
        let places = c
            .tree_places()
            .unwrap()
            .expect("a double binary tree across nodes");
        assert_eq!(places.len(), nch);
        for (ch, (up, down)) in places.iter().enumerate() {
            let node = &want[ch].nodes[rank];
            assert_eq!((up, down), (&node.up, &node.down), "channel {ch}");
        }
        for (i, count) in [1usize, 37, 4099, 70_001].into_iter().enumerate() {
            let (dt, op) = [
                (DataType::Float32, ReduceOp::SUM),
                (DataType::Float32, ReduceOp::pre_mul_sum(0)),
                (DataType::Int32, ReduceOp::AVG),
                (DataType::Float64, ReduceOp::AVG),
                (DataType::Int64, ReduceOp::PROD),
                (DataType::Bfloat16, ReduceOp::MAX),
            ][(i + rank_seed()) % 6];
            let op = common::typed_op(op, dt);
            for in_place in [false, true] {
                common::check_all_reduce(
                    &ranks,
                    count,
                    dt,
                    op,
                    in_place,
                    40 + i as u64,
                    Drive::OneThread,
                )
                .unwrap_or_else(|e| panic!("{dt:?} {op:?} count {count} in place {in_place}: {e}"));
            }
        }
        return;
    }
    // Odd node counts (a node with two child nodes in one tree, the shifted second tree), an
    // even one (the mirrored tree), and chains of two ranks inside the nodes. With chains, a
    // node head with two child nodes has three children: at the root in 3x2 (one step per
    // chunk over all six connections), below the root in 4x2 (three children's sums reduced
    // on the way up, the result sent to three children on the way down).
    let heads_of_three = |nodes: usize, per: usize| {
        let shape: Vec<Vec<usize>> = (0..nodes)
            .map(|n| (n * per..(n + 1) * per).collect())
            .collect();
        let trees = nccl::graph::dbt_channels(&shape, 2);
        let three = |root: bool| {
            trees.iter().any(|t| {
                t.nodes
                    .iter()
                    .any(|x| x.down.len() == 3 && x.up.is_none() == root)
            })
        };
        (three(true), three(false))
    };
    assert_eq!(heads_of_three(3, 2), (true, false));
    assert_eq!(heads_of_three(4, 2), (false, true));
    // NCCL's double binary tree (in 2x2 too, where the exchange would replace it), in the
    // tuner's protocol (Simple) and forced to LL: one peer per step there (a head with three
    // children takes three steps up and three down a chunk), on every shape with a fan.
    let simple = [(3, 1), (4, 1), (5, 1), (2, 2), (3, 2), (4, 2)];
    let ll = [(3, 1), (4, 1), (2, 2), (3, 2), (4, 2)];
    let runs = simple.map(|s| (s, None)).into_iter();
    for ((nodes, per_node), proto) in runs.chain(ll.map(|s| (s, Some("LL")))) {
        let per = per_node.to_string();
        let shape = format!("{nodes}");
        let mut env = vec![
            LOOPBACK,
            ("NCCL_ALGO", "allreduce:tree"),
            ("NCCL_RS_TREE_EXCHANGE", "0"),
            ("DBT_TEST_PER_NODE", per.as_str()),
            ("DBT_TEST_NODES", shape.as_str()),
        ];
        env.extend(proto.map(|p| ("NCCL_PROTO", p)));
        common::procs::run_nodes(nodes, per_node, &env);
    }
    // The chains inside the nodes through host shared memory instead of p2p.
    let env = [
        LOOPBACK,
        ("NCCL_ALGO", "allreduce:tree"),
        ("NCCL_P2P_DISABLE", "1"),
        ("DBT_TEST_PER_NODE", "2"),
        ("DBT_TEST_NODES", "3"),
    ];
    common::procs::run_nodes(3, 2, &env);
    check_tree_log();
}

/// The tree across two nodes exchanges at the top (`FLAG_TREE_EXCHANGE`): the two node heads
/// trade their nodes' sums, chains inside the nodes. The tuner offers it with LL (8 bytes) and
/// Simple (1 GiB), which only the exchange allows on a tree; forced to each protocol in turn,
/// AllReduce is right for random data, poisoned outputs, in and out of place, one element to
/// many chunks per channel, and operators with `pre` (PreMulSum, float Avg: a head reads its
/// node's sum back from its output without a second `pre`) or `post` (integer Avg). Every
/// rank's result is the same bit for bit (each head adds the same two sums, in either order).
#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_reduce_float_sum",
        nccl_rs_kernel = "nccl_all_reduce_float_premulsum",
        nccl_rs_kernel = "nccl_all_gather"
    )),
    ignore = "needs nccl_all_reduce_float_sum, nccl_all_reduce_float_premulsum, nccl_all_gather, which NCCL_RS_KERNELS left out"
)]
fn two_node_tree_exchanges_at_the_top() {
    if let Some(ranks) = child_comm() {
        use nccl::{Algo, Coll, Proto};
        let c = &ranks.comms[0];
        let forced = std::env::var("NCCL_PROTO").ok();
        let want = |bytes: usize| match forced.as_deref() {
            Some("LL") => Proto::Ll,
            Some(_) => Proto::Simple,
            None if bytes < 4096 => Proto::Ll,
            None => Proto::Simple,
        };
        for bytes in [8, 1 << 30] {
            let t = c.tuning(Coll::AllReduce, bytes).unwrap();
            assert_eq!((t.algo, t.proto), (Algo::Tree, want(bytes)), "{bytes} B");
        }
        let rank = c.rank();
        for (i, count) in [1usize, 37, 4099, 70_001].into_iter().enumerate() {
            for (j, (dt, op)) in [
                (DataType::Float32, ReduceOp::SUM),
                (DataType::Float32, ReduceOp::pre_mul_sum(0)),
                (DataType::Int32, ReduceOp::AVG),
                (DataType::Float64, ReduceOp::AVG),
                (DataType::Int64, ReduceOp::PROD),
                (DataType::Bfloat16, ReduceOp::MAX),
            ]
            .into_iter()
            .enumerate()
            {
                let op = common::typed_op(op, dt);
                let in_place = (i + j) % 2 == 1;
                common::check_all_reduce(
                    &ranks,
                    count,
                    dt,
                    op,
                    in_place,
                    60 + (i * 6 + j) as u64,
                    Drive::OneThread,
                )
                .unwrap_or_else(|e| panic!("rank {rank}: {dt:?} {op:?} count {count}: {e}"));
            }
        }
        for (count, op) in [(70_001, ReduceOp::SUM), (4099, ReduceOp::pre_mul_sum(0))] {
            results_agree_bitwise(&ranks, count, common::typed_op(op, DataType::Float32));
        }
        return;
    }
    for per_node in [1, 2, 3] {
        for proto in ["LL", "Simple", ""] {
            let mut env = vec![LOOPBACK, ("NCCL_ALGO", "allreduce:tree")];
            if !proto.is_empty() {
                env.push(("NCCL_PROTO", proto));
            }
            if proto.is_empty() && per_node != 2 {
                continue; // the tuner's own choice: once
            }
            common::procs::run_nodes(2, per_node, &env);
        }
    }
    // The chains through host shared memory (their LL FIFOs in the segment).
    let env = [
        LOOPBACK,
        ("NCCL_ALGO", "allreduce:tree"),
        ("NCCL_PROTO", "LL"),
        ("NCCL_P2P_DISABLE", "1"),
    ];
    common::procs::run_nodes(2, 2, &env);
}

/// One f32 AllReduce of random values, its result gathered to every rank: every rank's copy is
/// the same bit for bit.
fn results_agree_bitwise(ranks: &Ranks, count: usize, op: ReduceOp) {
    let (c, s) = (&ranks.comms[0], ranks.streams[0]);
    let (rank, n, dev) = (c.rank(), c.count(), c.device());
    // Inexact sums on purpose (not `common::input`'s exact ones): ranks that reduced in
    // different orders would get different bits.
    let mut rng = common::Rng::new(99 ^ ((rank as u64 + 1) << 32));
    let x: Vec<f32> = (0..count)
        .map(|_| match op.kind() {
            RedOpKind::Prod => rng.uniform(0.5, 1.5) as f32,
            _ => rng.uniform(-4.0, 4.0) as f32,
        })
        .collect();
    let send = dev.alloc(count * 4).unwrap();
    send.write(0, common::to_bytes(&x)).unwrap();
    let out = dev.alloc(count * 4).unwrap();
    out.write(0, &vec![0xA5u8; count * 4]).unwrap();
    let all = dev.alloc(n * count * 4).unwrap();
    all.write(0, &vec![0x5Au8; n * count * 4]).unwrap();
    // SAFETY: device buffers of the sizes the calls name, alive until the stream is synced.
    unsafe {
        c.all_reduce_raw(send.ptr(), out.ptr(), count, DataType::Float32, op, s)
            .unwrap();
        c.all_gather_raw(out.ptr(), all.ptr(), count, DataType::Float32, s)
            .unwrap();
    }
    dev.stream_sync(s).unwrap();
    let mut got = vec![0u8; n * count * 4];
    all.read(0, &mut got).unwrap();
    let mine = &got[rank * count * 4..(rank + 1) * count * 4];
    for (r, theirs) in got.chunks(count * 4).enumerate() {
        assert!(
            theirs == mine,
            "rank {r}'s {op:?} result differs from rank {rank}'s"
        );
    }
}

/// 3x1 again with NCCL_DEBUG=INFO into a file per rank: every rank's `Trees` line is the
/// double binary tree's, as NCCL prints it, and every tree edge is a network connection whose
/// two ends log it (`Channel 00/0 : 1[1] -> 0[0] [receive] via NET/Socket/0`).
fn check_tree_log() {
    let dir = std::env::temp_dir().join(format!("nccl-rs-dbt-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("rank.%p.log");
    let env = [
        LOOPBACK,
        ("NCCL_ALGO", "allreduce:tree"),
        ("DBT_TEST_PER_NODE", "1"),
        ("DBT_TEST_NODES", "3"),
        ("DBT_TEST_LOG", "1"),
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_DEBUG_FILE", file.to_str().unwrap()),
    ];
    common::procs::run_nodes(3, 1, &env);
    let mut text = String::new();
    for f in std::fs::read_dir(&dir).unwrap().flatten() {
        text.push_str(&std::fs::read_to_string(f.path()).unwrap());
    }
    std::fs::remove_dir_all(&dir).ok();
    let nodes = vec![vec![0], vec![1], vec![2]];
    let trees = nccl::graph::dbt_channels(&nodes, 2); // the simulator's two channels
    let mut got: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_once("NCCL INFO Trees"))
        .map(|(_, t)| t)
        .collect();
    got.sort();
    let mut want: Vec<String> = (0..3)
        .map(|r| {
            let places = trees.iter().enumerate().map(|(c, t)| {
                let x = &t.nodes[r];
                let d = |i: usize| x.down.get(i).map_or(-1, |&v| v as i64);
                let up = x.up.map_or(-1, |v| v as i64);
                format!(" [{c}] {}/{}/{}->{r}->{up}", d(0), d(1), d(2))
            });
            places.collect()
        })
        .collect();
    want.sort();
    assert_eq!(got, want, "the Trees lines:\n{text}");
    for (c, t) in trees.iter().enumerate() {
        for (child, x) in t.nodes.iter().enumerate() {
            let Some(parent) = x.up else { continue };
            for (from, to) in [(child, parent), (parent, child)] {
                for what in ["send", "receive"] {
                    let line = format!(
                        "Channel {c:02}/0 : {from}[{from}] -> {to}[{to}] [{what}] via NET/Socket/"
                    );
                    assert!(text.contains(&line), "no line {line:?} in:\n{text}");
                }
            }
        }
    }
}

/// Varies the (type, operator) per shape, so the five shapes together cover all six.
fn rank_seed() -> usize {
    std::env::var("DBT_TEST_NODES").map_or(0, |v| v.parse().unwrap_or(0))
        + std::env::var("DBT_TEST_PER_NODE").map_or(0, |v| v.parse().unwrap_or(0))
}

/// The latency lab's records: `NCCL_RS_PROXY_TIMELINE` (`tools/proxy-timeline.py`): each rank
/// process of 2 nodes writes its launches and network steps, and a two-rank AllReduce (the
/// exchange) costs one network step each way per call; `NCCL_RS_KERNEL_STAMPS`: each rank
/// writes one line per collective launch, its CTA 0's entry and exit in order.
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_float_sum"),
    ignore = "needs nccl_all_reduce_float_sum, which NCCL_RS_KERNELS left out"
)]
fn proxy_timeline_and_kernel_stamps_record_each_call() {
    const CALLS: usize = 4;
    if let Some(ranks) = child_comm() {
        for k in 0..CALLS {
            common::check_all_reduce(
                &ranks,
                2,
                DataType::Float32,
                ReduceOp::SUM,
                k % 2 == 1,
                70 + k as u64,
                Drive::OneThread,
            )
            .unwrap();
        }
        // The kernel reads LL lines by their flags, so the last call may end before the
        // proxy's pass that records its landing (it did once in the full suite: 3 of 4). The
        // proxy passes every few microseconds while busy; a moment lets it.
        std::thread::sleep(std::time::Duration::from_millis(200));
        return; // dropping the communicator stops the proxy, which writes the file
    }
    let dir = std::env::temp_dir().join(format!("nccl-rs-timeline-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let prefix_s = dir.join("tl").to_str().unwrap().to_string();
    let stamps_s = dir.join("kernels").to_str().unwrap().to_string();
    let env = [
        LOOPBACK,
        ("NCCL_RS_PROXY_TIMELINE", prefix_s.as_str()),
        ("NCCL_RS_KERNEL_STAMPS", stamps_s.as_str()),
    ];
    common::procs::run_nodes(2, 1, &env);
    let files = |stem: &str| -> Vec<_> {
        let mut v: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with(stem))
            .collect();
        v.sort();
        v
    };
    let timelines = files("tl.");
    assert_eq!(timelines.len(), 2, "{timelines:?}");
    for f in &timelines {
        let text = std::fs::read_to_string(f).unwrap();
        let count = |mark: &str| {
            text.lines()
                .filter(|l| l.split_whitespace().nth(1) == Some(mark))
                .count()
        };
        assert_eq!(count("Launch"), CALLS, "{}:\n{text}", f.display());
        assert_eq!(count("SendPosted"), CALLS, "{}:\n{text}", f.display());
        assert_eq!(count("SendDone"), CALLS, "{}:\n{text}", f.display());
        assert_eq!(count("RecvLanded"), CALLS, "{}:\n{text}", f.display());
    }
    // One file per rank (`kernels.<pid>-0.<rank>`), a line per launch: launch, entry, exit.
    let stamps = files("kernels.");
    assert_eq!(stamps.len(), 2, "{stamps:?}");
    for f in &stamps {
        let text = std::fs::read_to_string(f).unwrap();
        let rows: Vec<Vec<u64>> = text
            .lines()
            .map(|l| l.split_whitespace().map(|w| w.parse().unwrap()).collect())
            .collect();
        assert_eq!(rows.len(), CALLS, "{}:\n{text}", f.display());
        for (n, r) in rows.iter().enumerate() {
            assert_eq!(r[0], n as u64, "{}:\n{text}", f.display());
            assert!(r[1] <= r[2], "exit before entry: {}:\n{text}", f.display());
            if n > 0 {
                assert!(
                    rows[n - 1][2] <= r[1],
                    "overlapping launches: {}:\n{text}",
                    f.display()
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
