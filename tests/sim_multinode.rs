//! Communicators across nodes on the CPU simulator: ranks are processes, grouped into nodes by
//! `NCCL_HOSTID`, so ranks of one node reach each other through p2p (simulated IPC) and ranks of
//! different nodes through the network transport (the socket network over loopback) and the
//! proxy threads. Every collective, protocol and algorithm is checked with random data and
//! poisoned outputs.

mod common;

use common::{Drive, Ranks};
use nccl::{Backend, Comm, DataType, ReduceOp};

/// Loopback only: tests never leave this machine.
const LOOPBACK: (&str, &str) = ("NCCL_SOCKET_IFNAME", "lo");

fn child_comm() -> Option<Ranks> {
    let (rank, nranks, id) = common::procs::child()?;
    nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
    let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
    let comm = Comm::init_rank_on(dev, nranks, &id, rank).expect("init_rank across nodes");
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
        common::procs::run_nodes(
            "ring_collectives_across_nodes",
            nodes,
            per_node,
            &[LOOPBACK],
        );
    }
    let env = [LOOPBACK, ("NCCL_MIN_NCHANNELS", "3")];
    common::procs::run_nodes("ring_collectives_across_nodes", 2, 2, &env);
}

#[test]
fn every_protocol_and_algorithm_across_nodes() {
    if let Some(ranks) = child_comm() {
        common::every_collective(&ranks, 2);
        return;
    }
    for proto in ["LL", "LL128", "Simple"] {
        let env = [LOOPBACK, ("NCCL_PROTO", proto)];
        common::procs::run_nodes("every_protocol_and_algorithm_across_nodes", 2, 2, &env);
    }
    // The small-message protocols where rings cross three and four nodes (two ranks each).
    for (nodes, proto) in [(3, "LL"), (3, "LL128"), (4, "LL"), (4, "LL128")] {
        let env = [LOOPBACK, ("NCCL_PROTO", proto)];
        common::procs::run_nodes("every_protocol_and_algorithm_across_nodes", nodes, 2, &env);
    }
    let env = [LOOPBACK, ("NCCL_ALGO", "allreduce:tree")];
    common::procs::run_nodes("every_protocol_and_algorithm_across_nodes", 2, 2, &env);
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
                    ReduceOp::Sum,
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
    common::procs::run_nodes(
        "ll_and_simple_steps_in_turn_across_nodes",
        2,
        1,
        &[LOOPBACK],
    );
}

/// A rank killed (SIGKILL) in the middle of an AllReduce: every survivor's async error turns
/// into an error naming the connection to the dead peer within the bound, and abort then
/// returns. Nothing hangs.
#[test]
fn killed_peer_mid_collective_raises_async_errors() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
        let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
        let comm = Comm::init_rank_on(dev, nranks, &id, rank).expect("init_rank across nodes");
        // Everyone starts a large AllReduce; the victim dies once its kernel runs.
        let limit = std::time::Duration::from_secs(30);
        common::faults::killed_mid_collective(comm, nranks - 1, 1 << 20, 8, limit);
        return;
    }
    // 2x1 and 3x1: every survivor has a network connection to the victim. 2x2 and 1x3: some
    // survivors reach it only through p2p on their node, and learn of its death from the
    // bootstrap (the rank that sees its connection end tells every rank).
    for (nodes, per_node) in [(2, 1), (3, 1), (2, 2), (1, 3)] {
        common::procs::run_nodes_with_victim(
            "killed_peer_mid_collective_raises_async_errors",
            nodes,
            per_node,
            &[LOOPBACK],
            nodes * per_node - 1,
        );
    }
}

/// How long a rank may go without a heartbeat in the stopped-peer test.
const HANG_TIMEOUT_MS: &str = "3000";

/// A rank whose process stops (SIGSTOP) without dying keeps its sockets open and its kernel
/// answering TCP, so nothing but its silence can tell. With `NCCL_RS_PEER_HANG_TIMEOUT_MS`,
/// the survivors' AllReduce, stuck on it, ends: each gets an async error naming the stopped
/// rank (its ring successor saw its heartbeats stop, and told the other), and abort and
/// destroy return. The parent kills the stopped rank once the others are done.
#[test]
fn stopped_peer_raises_async_errors_when_hangs_are_watched() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
        let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
        let comm = Comm::init_rank_on(dev, nranks, &id, rank).expect("init_rank across nodes");
        let victim = nranks - 1;
        if rank == victim {
            // Beat a while first (a rank's successor watches it once a heartbeat came), then
            // stop with nothing issued; the parent kills this process later.
            std::thread::sleep(std::time::Duration::from_secs(1));
            // SAFETY: raise(3) with a signal number; stops this process.
            unsafe { libc::raise(libc::SIGSTOP) };
            loop {
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
        }
        let count = 1 << 16;
        let buf = comm.device().alloc(count * 4).expect("alloc");
        let stream = comm.device().stream_create().expect("stream");
        // SAFETY: `buf` holds `count` floats and outlives the AllReduce (the comm is aborted
        // and its stream drained before `buf` drops).
        unsafe {
            comm.all_reduce_raw(
                buf.ptr(),
                buf.ptr(),
                count,
                DataType::Float32,
                ReduceOp::Sum,
                stream,
            )
        }
        .expect("issue the AllReduce");
        let t0 = std::time::Instant::now();
        let limit = std::time::Duration::from_secs(60);
        let err = loop {
            if let Err(e) = comm.get_async_error() {
                break Some((e, t0.elapsed()));
            }
            if t0.elapsed() > limit {
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let t1 = std::time::Instant::now();
        comm.abort();
        // The aborted kernel ends; only then may its buffer go (and a failed check unwind).
        let _ = comm.device().stream_sync(stream);
        drop(buf);
        comm.destroy().ok();
        eprintln!("rank {rank}: abort and destroy took {:?}", t1.elapsed());
        let (err, after) =
            err.unwrap_or_else(|| panic!("rank {rank}: no async error after {limit:?}"));
        eprintln!("rank {rank}: async error {after:?} after issuing: {err}");
        assert_eq!(err.code, nccl::NcclResult::RemoteError, "{err}");
        assert!(err.message.contains(&format!("rank {victim}")), "{err}");
        if rank == 0 {
            // The victim's ring successor saw its heartbeats stop.
            assert!(
                err.message
                    .contains(&format!("rank {victim} has not responded for")),
                "{err}"
            );
        }
        return;
    }
    common::procs::run_nodes_with_victim(
        "stopped_peer_raises_async_errors_when_hangs_are_watched",
        3,
        1,
        &[LOOPBACK, ("NCCL_RS_PEER_HANG_TIMEOUT_MS", HANG_TIMEOUT_MS)],
        2,
    );
}

/// The stopped rank's ring successor may have nothing to wait for while another rank waits on
/// it: here rank 1 waits to receive from the stopped rank 2, and rank 0 (rank 2's successor,
/// the only rank that hears its heartbeats) has nothing outstanding. The successor reports the
/// silence all the same once it lasted twice `NCCL_RS_PEER_HANG_TIMEOUT_MS`, so rank 1's receive
/// ends with an error naming rank 2, and abort and destroy return. (Before, rank 1 waited for
/// ever: only a busy successor reported.)
#[test]
fn stopped_peer_is_reported_when_its_watcher_has_nothing_to_wait_for() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
        let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
        let comm = Comm::init_rank_on(dev, nranks, &id, rank).expect("init_rank across nodes");
        let victim = nranks - 1;
        if rank == victim {
            // Beat a while first, then stop; the parent kills this process later.
            std::thread::sleep(std::time::Duration::from_secs(1));
            // SAFETY: raise(3) with a signal number; stops this process.
            unsafe { libc::raise(libc::SIGSTOP) };
            loop {
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
        }
        let count = 1 << 14;
        let buf = comm.device().alloc(count * 4).expect("alloc");
        let stream = comm.device().stream_create().expect("stream");
        let t0 = std::time::Instant::now();
        // The receive's first use of the connection to rank 2 sets it up, inside the call: the
        // error may come from the call itself (the set-up gives up once rank 2 is known gone).
        let issued = if rank == 1 {
            // SAFETY: `buf` holds `count` floats and outlives the receive (the comm is aborted
            // and its stream drained before `buf` drops).
            unsafe { comm.recv_raw(buf.ptr(), count, DataType::Float32, victim, stream) }
        } else {
            Ok(())
        };
        let limit = std::time::Duration::from_secs(60);
        let err = loop {
            if let Err(e) = issued.clone().and(comm.get_async_error()) {
                break Some((e, t0.elapsed()));
            }
            if t0.elapsed() > limit {
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let t1 = std::time::Instant::now();
        comm.abort();
        let _ = comm.device().stream_sync(stream);
        drop(buf);
        comm.destroy().ok();
        eprintln!("rank {rank}: abort and destroy took {:?}", t1.elapsed());
        let (err, after) =
            err.unwrap_or_else(|| panic!("rank {rank}: no async error after {limit:?}"));
        eprintln!("rank {rank}: error {after:?} after the wait began: {err}");
        assert_eq!(err.code, nccl::NcclResult::RemoteError, "{err}");
        assert!(
            err.message
                .contains(&format!("rank {victim} has not responded for")),
            "{err}"
        );
        return;
    }
    common::procs::run_nodes_with_victim(
        "stopped_peer_is_reported_when_its_watcher_has_nothing_to_wait_for",
        3,
        1,
        &[LOOPBACK, ("NCCL_RS_PEER_HANG_TIMEOUT_MS", "2000")],
        2,
    );
}

/// CPU time (clock ticks) of this process's proxy threads so far, from /proc.
fn proxy_ticks() -> u64 {
    nccl::debug::thread_cpu_ticks("nccl-proxy").0
}

/// Between collectives the proxy thread sleeps: over 3 idle seconds it uses a small fraction
/// of one core (a polling proxy would use all of it: ~300 ticks).
#[test]
fn idle_proxy_sleeps() {
    if let Some(ranks) = child_comm() {
        let c = &ranks.comms[0];
        common::check_all_reduce(
            &ranks,
            5000,
            DataType::Float32,
            ReduceOp::Sum,
            false,
            9,
            Drive::OneThread,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        std::thread::sleep(std::time::Duration::from_millis(500)); // past the hot window
        let before = proxy_ticks();
        std::thread::sleep(std::time::Duration::from_secs(3));
        let used = proxy_ticks() - before;
        eprintln!(
            "rank {}: proxy CPU while idle: {used} ticks in 3 s",
            c.rank()
        );
        assert!(used < 30, "the idle proxy used {used} clock ticks in 3 s");
        return;
    }
    common::procs::run_nodes("idle_proxy_sleeps", 2, 1, &[LOOPBACK]);
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
        common::procs::run_nodes(
            "send_recv_all_to_all_across_nodes",
            nodes,
            per_node,
            &[LOOPBACK, ("NCCL_RS_SIM_P2P_CONNS", "4")],
        );
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
                (DataType::Float32, ReduceOp::Sum),
                (DataType::Float32, ReduceOp::PreMulSum { scalar_bits: 0 }),
                (DataType::Int32, ReduceOp::Avg),
                (DataType::Float64, ReduceOp::Avg),
                (DataType::Int64, ReduceOp::Prod),
                (DataType::Bfloat16, ReduceOp::Max),
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
        common::procs::run_nodes(
            "double_binary_tree_all_reduce_across_nodes",
            nodes,
            per_node,
            &env,
        );
    }
    // The chains inside the nodes through host shared memory instead of p2p.
    let env = [
        LOOPBACK,
        ("NCCL_ALGO", "allreduce:tree"),
        ("NCCL_P2P_DISABLE", "1"),
        ("DBT_TEST_PER_NODE", "2"),
        ("DBT_TEST_NODES", "3"),
    ];
    common::procs::run_nodes("double_binary_tree_all_reduce_across_nodes", 3, 2, &env);
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
                (DataType::Float32, ReduceOp::Sum),
                (DataType::Float32, ReduceOp::PreMulSum { scalar_bits: 0 }),
                (DataType::Int32, ReduceOp::Avg),
                (DataType::Float64, ReduceOp::Avg),
                (DataType::Int64, ReduceOp::Prod),
                (DataType::Bfloat16, ReduceOp::Max),
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
        for (count, op) in [
            (70_001, ReduceOp::Sum),
            (4099, ReduceOp::PreMulSum { scalar_bits: 0 }),
        ] {
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
            common::procs::run_nodes("two_node_tree_exchanges_at_the_top", 2, per_node, &env);
        }
    }
    // The chains through host shared memory (their LL FIFOs in the segment).
    let env = [
        LOOPBACK,
        ("NCCL_ALGO", "allreduce:tree"),
        ("NCCL_PROTO", "LL"),
        ("NCCL_P2P_DISABLE", "1"),
    ];
    common::procs::run_nodes("two_node_tree_exchanges_at_the_top", 2, 2, &env);
}

/// One f32 AllReduce of random values, its result gathered to every rank: every rank's copy is
/// the same bit for bit.
fn results_agree_bitwise(ranks: &Ranks, count: usize, op: ReduceOp) {
    let (c, s) = (&ranks.comms[0], ranks.streams[0]);
    let (rank, n, dev) = (c.rank(), c.count(), c.device());
    let x = common::input::<f32>(count, op, 99, rank);
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
    common::procs::run_nodes("double_binary_tree_all_reduce_across_nodes", 3, 1, &env);
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
fn proxy_timeline_and_kernel_stamps_record_each_call() {
    const CALLS: usize = 4;
    if let Some(ranks) = child_comm() {
        for k in 0..CALLS {
            common::check_all_reduce(
                &ranks,
                2,
                DataType::Float32,
                ReduceOp::Sum,
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
    common::procs::run_nodes(
        "proxy_timeline_and_kernel_stamps_record_each_call",
        2,
        1,
        &env,
    );
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

/// A fixed mix of work for one rank of a communicator across nodes: an AllReduce (f32 sum), an
/// AllGather (i32), a ReduceScatter (f32 sum), a Broadcast (f64, from the last rank) and, in
/// one group, sends to the next rank and to the rank half the communicator away (on the other
/// node in 2x2) with the matching receives. Sizes differ, so several protocols and step counts
/// take part. Fresh random inputs and poisoned outputs before every run (`fill`); every output
/// checked against the host reference of every rank's inputs (`check`).
struct Work {
    rank: usize,
    n: usize,
    /// (input, output) per operation, in the order of [`Work::ops`].
    bufs: Vec<(nccl::DevBuffer, nccl::DevBuffer)>,
}

/// Element counts: AllReduce, AllGather (per rank), ReduceScatter (per rank), Broadcast,
/// send to the next rank, send to the far rank.
const WORK_COUNTS: [usize; 6] = [5000, 3001, 2000, 40_000, 10_000, 70_000];

/// The values of `v`, each to be matched exactly.
fn exact<T: Copy>(v: &[T]) -> Vec<(T, f64)> {
    v.iter().map(|&x| (x, 0.0)).collect()
}

/// One rank's inputs of one run of [`Work`].
struct WorkInputs {
    ar: Vec<f32>,
    ag: Vec<i32>,
    rs: Vec<f32>,
    bc: Vec<f64>,
    next: Vec<f32>,
    far: Vec<i32>,
}

impl Work {
    fn new(c: &Comm) -> Result<Work, String> {
        let (n, d) = (c.count(), c.device());
        let [ar, ag, rs, bc, next, far] = WORK_COUNTS;
        let sizes = [
            (ar * 4, ar * 4),
            (ag * 4, n * ag * 4),
            (n * rs * 4, rs * 4),
            (bc * 8, bc * 8),
            (next * 4, next * 4),
            (far * 4, far * 4),
        ];
        let bufs = sizes
            .iter()
            .map(|&(i, o)| Ok((d.alloc(i)?, d.alloc(o)?)))
            .collect::<nccl::Result<_>>()
            .map_err(|e| e.to_string())?;
        Ok(Work {
            rank: c.rank(),
            n,
            bufs,
        })
    }

    /// The ranks this one sends to and receives from: (next, prev, far_to, far_from).
    fn peers(&self, r: usize) -> (usize, usize, usize, usize) {
        let (n, h) = (self.n, (self.n / 2).max(1));
        ((r + 1) % n, (r + n - 1) % n, (r + h) % n, (r + n - h) % n)
    }

    /// Rank `r`'s inputs of run `seed` (any process computes any rank's).
    fn inputs(&self, seed: u64, r: usize) -> WorkInputs {
        let [ar, ag, rs, bc, next, far] = WORK_COUNTS;
        let s = |k: u64| seed * 8 + k;
        let op = ReduceOp::Sum;
        WorkInputs {
            ar: common::input(ar, op, s(0), r),
            ag: common::input(ag, op, s(1), r),
            rs: common::input(self.n * rs, op, s(2), r),
            bc: common::input(bc, op, s(3), r),
            next: common::input(next, op, s(4), r),
            far: common::input(far, op, s(5), r),
        }
    }

    /// Writes this rank's inputs of run `seed` and poisons every output.
    fn fill(&self, seed: u64) -> Result<(), String> {
        let x = self.inputs(seed, self.rank);
        let ins: [&[u8]; 6] = [
            common::to_bytes(&x.ar),
            common::to_bytes(&x.ag),
            common::to_bytes(&x.rs),
            common::to_bytes(&x.bc),
            common::to_bytes(&x.next),
            common::to_bytes(&x.far),
        ];
        for ((i, o), data) in self.bufs.iter().zip(ins) {
            i.write(0, data).map_err(|e| e.to_string())?;
            o.write(0, &vec![0xA5u8; o.bytes()])
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Issues the whole mix on `s` (into a capture, if `s` captures).
    fn issue(&self, c: &Comm, s: nccl::StreamHandle) -> nccl::Result<()> {
        let [ar, ag, rs, bc, next, far] = WORK_COUNTS;
        let b = |k: usize| (self.bufs[k].0.ptr(), self.bufs[k].1.ptr());
        let (f32_, i32_, f64_) = (DataType::Float32, DataType::Int32, DataType::Float64);
        let (to_next, from_prev, far_to, far_from) = self.peers(self.rank);
        // SAFETY: every buffer holds the counts named (see `new`) and lives in `self`, which the
        // callers keep until the stream (or the graph's replays) drained.
        unsafe {
            c.all_reduce_raw(b(0).0, b(0).1, ar, f32_, ReduceOp::Sum, s)?;
            c.all_gather_raw(b(1).0, b(1).1, ag, i32_, s)?;
            c.reduce_scatter_raw(b(2).0, b(2).1, rs, f32_, ReduceOp::Sum, s)?;
            c.broadcast_raw(b(3).0, b(3).1, bc, f64_, self.n - 1, s)?;
            nccl::group_start();
            let queued = c
                .send_raw(b(4).0, next, f32_, to_next, s)
                .and_then(|_| c.recv_raw(b(4).1, next, f32_, from_prev, s))
                .and_then(|_| c.send_raw(b(5).0, far, i32_, far_to, s))
                .and_then(|_| c.recv_raw(b(5).1, far, i32_, far_from, s));
            let ended = nccl::group_end();
            queued?;
            if ended? == nccl::GroupStatus::InProgress {
                // A non-blocking communicator issues the group in the background: wait for it
                // before the stream may be synchronized.
                poll_progress("a non-blocking send/recv group", || c.async_state());
                c.get_async_error()?;
            }
        }
        Ok(())
    }

    /// Checks every output of run `seed`.
    fn check(&self, seed: u64, what: &str) -> Result<(), String> {
        let [_, ag, rs, _, _, _] = WORK_COUNTS;
        let all: Vec<WorkInputs> = (0..self.n).map(|r| self.inputs(seed, r)).collect();
        let (r, f32_) = (self.rank, DataType::Float32);
        let (_, from_prev, _, far_from) = self.peers(r);
        let read = |k: usize| -> Result<Vec<u8>, String> {
            let o = &self.bufs[k].1;
            let mut out = vec![0u8; o.bytes()];
            o.read(0, &mut out).map_err(|e| e.to_string())?;
            Ok(out)
        };
        let ctx = |op: &str| format!("{what} (seed {seed}): rank {r} {op}");
        let ar_in: Vec<Vec<f32>> = all.iter().map(|x| x.ar.clone()).collect();
        let want = common::reference(&ar_in, ReduceOp::Sum, f32_);
        common::compare(
            &common::from_bytes::<f32>(&read(0)?),
            &want,
            &ctx("AllReduce"),
        )?;
        let gathered: Vec<i32> = all.iter().flat_map(|x| x.ag.clone()).collect();
        let got = common::from_bytes::<i32>(&read(1)?);
        common::compare(&got, &exact(&gathered), &ctx("AllGather"))?;
        debug_assert_eq!(gathered.len(), self.n * ag);
        let rs_in: Vec<Vec<f32>> = all.iter().map(|x| x.rs.clone()).collect();
        let want = common::reference(&rs_in, ReduceOp::Sum, f32_);
        let got = common::from_bytes::<f32>(&read(2)?);
        common::compare(&got, &want[r * rs..(r + 1) * rs], &ctx("ReduceScatter"))?;
        let got = common::from_bytes::<f64>(&read(3)?);
        common::compare(&got, &exact(&all[self.n - 1].bc), &ctx("Broadcast"))?;
        let got = common::from_bytes::<f32>(&read(4)?);
        let what_next = ctx(&format!("recv from rank {from_prev}"));
        common::compare(&got, &exact(&all[from_prev].next), &what_next)?;
        let got = common::from_bytes::<i32>(&read(5)?);
        let what_far = ctx(&format!("recv from rank {far_from}"));
        common::compare(&got, &exact(&all[far_from].far), &what_far)?;
        Ok(())
    }
}

/// CUDA graphs across nodes (2x2): each rank captures [`Work`] (four collectives and a group
/// of sends and receives, to a rank on its node and to one on the other) on its stream and
/// replays the graph several times, every replay with fresh random inputs and poisoned
/// outputs, checked; a direct run of the same work on another stream comes in between. With
/// `GRAPH_TEST_FIRST_USE=inside` the capture is the communicator's first use (the send/recv
/// connections across nodes are made while it is open); otherwise a direct run comes first.
/// Every other replay follows a pause longer than the proxy's hot window; each replay's time
/// is printed beside the direct runs' (`NCCL_RS_TEST_SHOW_RANKS=1` shows them).
#[test]
fn graphs_replay_across_nodes() {
    const REPLAYS: u64 = 6;
    if let Some(ranks) = child_comm() {
        let (c, s) = (&ranks.comms[0], ranks.streams[0]);
        let d = c.device();
        let other = d.stream_create().expect("a second stream");
        let work = Work::new(c).unwrap_or_else(|e| panic!("{e}"));
        let inside = std::env::var("GRAPH_TEST_FIRST_USE").is_ok_and(|v| v == "inside");
        let direct = |seed: u64| -> std::time::Duration {
            work.fill(seed).unwrap_or_else(|e| panic!("{e}"));
            let t = std::time::Instant::now();
            work.issue(c, other).expect("issue directly");
            d.stream_sync(other).expect("sync the direct run");
            let took = t.elapsed();
            work.check(seed, "direct run")
                .unwrap_or_else(|e| panic!("{e}"));
            took
        };
        let mut direct_times = Vec::new();
        if !inside {
            direct_times.push(direct(1000));
        }
        // Direct calls leave the proxy its long naps; a captured launch shortens them, since
        // the graph's replays will not wake it.
        let nap = || c.proxy_max_nap().expect("a proxy across nodes");
        let long_nap = nap();
        d.capture_begin(s).expect("begin the capture");
        let issued = work.issue(c, s);
        let graph = d.capture_end(s);
        issued.expect("issue into the capture");
        let graph = graph.expect("end the capture");
        assert!(
            nap() < long_nap,
            "the proxy's longest nap after a capture: {:?} (before: {long_nap:?})",
            nap()
        );
        let mut replay_times = Vec::new();
        for it in 0..REPLAYS {
            if it % 2 == 1 {
                // Past the proxy's hot window (50 ms): it naps when the replay starts.
                std::thread::sleep(std::time::Duration::from_millis(150));
            }
            work.fill(it).unwrap_or_else(|e| panic!("{e}"));
            let t = std::time::Instant::now();
            graph.launch(s).expect("launch the graph");
            d.stream_sync(s).expect("sync the replay");
            replay_times.push(t.elapsed());
            work.check(it, &format!("replay {it}"))
                .unwrap_or_else(|e| panic!("{e}"));
            if it == 2 {
                std::thread::sleep(std::time::Duration::from_millis(150));
                direct_times.push(direct(500 + it));
            }
        }
        eprintln!(
            "rank {}: replays {replay_times:?} (odd ones after 150 ms idle); direct runs \
             {direct_times:?} (the last after 150 ms idle)",
            c.rank()
        );
        drop(graph);
        d.stream_destroy(other).expect("destroy the second stream");
        return;
    }
    for first in ["before", "inside"] {
        let env = [LOOPBACK, ("GRAPH_TEST_FIRST_USE", first)];
        common::procs::run_nodes("graphs_replay_across_nodes", 2, 2, &env);
    }
    // Three nodes: rings and trees whose every node is entered and left across the network.
    let env = [LOOPBACK, ("GRAPH_TEST_FIRST_USE", "before")];
    common::procs::run_nodes("graphs_replay_across_nodes", 3, 2, &env);
}

/// Runs [`Work`] once on `c` (every rank of `c` at once) on a stream of its own and checks it.
fn run_work(c: &Comm, seed: u64, what: &str) {
    let d = c.device();
    let s = d.stream_create().expect("a stream");
    let w = Work::new(c).unwrap_or_else(|e| panic!("{what}: {e}"));
    w.fill(seed).unwrap_or_else(|e| panic!("{what}: {e}"));
    w.issue(c, s)
        .unwrap_or_else(|e| panic!("{what}: issuing: {e}"));
    d.stream_sync(s).unwrap_or_else(|e| panic!("{what}: {e}"));
    w.check(seed, what).unwrap_or_else(|e| panic!("{e}"));
    d.stream_destroy(s).expect("destroy the stream");
}

/// The tuned time of a 256 MiB AllReduce, µs: across nodes it counts the network (over
/// 20 ms at the 10 GB/s the tuner gives loopback), on one node the simulated GPU links.
fn big_all_reduce_us(c: &Comm) -> f64 {
    c.tuning(nccl::Coll::AllReduce, 256 << 20)
        .expect("tuning")
        .est_time_us
}

/// ncclCommSplit and ncclCommShrink of a 2x2 communicator (node 0: ranks 0 and 1, node 1:
/// ranks 2 and 3). Even/odd ranks, keys reversed: children {2, 0} and {3, 1}, each across both
/// nodes; by node: {0, 1} and {2, 3}, each on one; a shrink without rank 1: {0, 2, 3}, one rank
/// on node 0 and two on node 1. Each child has the ranks and the nodes it should (its tuner
/// counts the network or not) and runs [`Work`] (four collectives, sends and receives) and a
/// Reduce, checked; the parent runs it last, still usable after the splits and the shrink.
#[test]
fn split_and_shrink_across_nodes() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        assert_eq!(nranks, 4, "a 2x2 test");
        nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
        let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
        let parent = Comm::init_rank_on(dev, nranks, &id, rank).expect("init_rank across nodes");
        let net_us = big_all_reduce_us(&parent);
        assert!(net_us > 20_000.0, "the parent's tuner: {net_us} µs");

        let across = parent
            .split((rank % 2) as i32, -(rank as i32), None)
            .expect("split even/odd")
            .expect("a color");
        assert_eq!((across.count(), across.rank()), (2, 1 - rank / 2));
        let t = big_all_reduce_us(&across);
        assert!(
            t > 20_000.0,
            "rank {rank}: an even/odd child spans two nodes: {t} µs"
        );
        run_work(&across, 10, "even/odd child");
        let ranks = Ranks::new(vec![across]);
        for coll in nccl_device::abi::Coll::ALL {
            common::check_collective(
                &ranks,
                coll,
                4099,
                DataType::Int64,
                ReduceOp::Max,
                1,
                true,
                11,
                Drive::OneThread,
            )
            .unwrap_or_else(|e| panic!("even/odd child: {e}"));
        }
        drop(ranks);

        let by_node = parent
            .split((rank / 2) as i32, rank as i32, None)
            .expect("split by node")
            .expect("a color");
        assert_eq!((by_node.count(), by_node.rank()), (2, rank % 2));
        let t = big_all_reduce_us(&by_node);
        assert!(t < net_us / 2.0, "rank {rank}: a child on one node: {t} µs");
        run_work(&by_node, 12, "child of one node");
        drop(by_node);

        if rank != 1 {
            let shrunk = parent
                .shrink(&[1], None, nccl::SHRINK_DEFAULT)
                .expect("shrink without rank 1");
            let want = [0, usize::MAX, 1, 2][rank];
            assert_eq!((shrunk.count(), shrunk.rank()), (3, want));
            let t = big_all_reduce_us(&shrunk);
            assert!(
                t > 20_000.0,
                "rank {rank}: the shrunk comm spans two nodes: {t} µs"
            );
            run_work(&shrunk, 13, "shrunk comm");
            let ranks = Ranks::new(vec![shrunk]);
            common::check_collective(
                &ranks,
                nccl_device::abi::Coll::Reduce,
                70_001,
                DataType::Float32,
                ReduceOp::Sum,
                2,
                false,
                14,
                Drive::OneThread,
            )
            .unwrap_or_else(|e| panic!("shrunk comm: {e}"));
        }

        run_work(&parent, 15, "the parent after the splits and the shrink");
        parent.finalize().expect("finalize the parent");
        parent.destroy().expect("destroy the parent");
        return;
    }
    common::procs::run_nodes("split_and_shrink_across_nodes", 2, 2, &[LOOPBACK]);
}

/// Polls `state` until it is no longer `InProgress` (within a minute), and returns it.
fn poll_progress(what: &str, state: impl Fn() -> nccl::NcclResult) -> nccl::NcclResult {
    let t = std::time::Instant::now();
    loop {
        let s = state();
        if s != nccl::NcclResult::InProgress {
            return s;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(60),
            "{what}: still in progress after a minute"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// [`Work`] issued in one group on a non-blocking communicator: ncclGroupEnd answers
/// InProgress, the communicator reports InProgress until the group was issued and then
/// Success; the results are checked.
fn nonblocking_group(c: &Comm, seed: u64, what: &str) {
    let d = c.device();
    let s = d.stream_create().expect("a stream");
    let w = Work::new(c).unwrap_or_else(|e| panic!("{what}: {e}"));
    w.fill(seed).unwrap_or_else(|e| panic!("{what}: {e}"));
    nccl::group_start();
    let queued = w.issue(c, s);
    let ended = nccl::group_end();
    queued.unwrap_or_else(|e| panic!("{what}: queueing: {e}"));
    let status = ended.unwrap_or_else(|e| panic!("{what}: group end: {e}"));
    assert_eq!(status, nccl::GroupStatus::InProgress, "{what}");
    let state = poll_progress(what, || c.async_state());
    assert_eq!(
        state,
        nccl::NcclResult::Success,
        "{what}: {:?}",
        c.get_async_error()
    );
    d.stream_sync(s).unwrap_or_else(|e| panic!("{what}: {e}"));
    w.check(seed, what).unwrap_or_else(|e| panic!("{e}"));
    d.stream_destroy(s).expect("destroy the stream");
}

/// Non-blocking communicators across nodes (2x2): init with `blocking = false` returns at once
/// (InProgress) and is polled to Success; a group of collectives and sends/receives across
/// nodes is issued in the background (InProgress, polled) and checked; collectives outside a
/// group run as usual; a non-blocking split (even/odd: each child across both nodes) is
/// polled to completion and its collectives checked too.
#[test]
fn nonblocking_comms_across_nodes() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        use nccl::NcclResult;
        nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
        let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
        let cfg = nccl::Config::blocking(false);
        let pending = Comm::start_init_rank_config_on(dev, nranks, &id, rank, &cfg)
            .expect("start a non-blocking init");
        // It needs every rank's bootstrap and network connections: never done at once.
        assert_eq!(pending.state(), NcclResult::InProgress);
        let state = poll_progress("init", || pending.state());
        assert_eq!(state, NcclResult::Success);
        let comm = pending
            .try_take()
            .expect("done")
            .expect("init across nodes");
        assert!(!comm.config().blocking);
        nonblocking_group(&comm, 20, "non-blocking comm");
        run_work(&comm, 21, "non-blocking comm, outside a group");

        // start_split takes an Arc (the split may outlive the call); it stays on this thread.
        #[allow(clippy::arc_with_non_send_sync)]
        let parent = std::sync::Arc::new(comm);
        let pending = Comm::start_split(&parent, (rank % 2) as i32, rank as i32, None)
            .expect("start a non-blocking split")
            .expect("a color");
        let state = poll_progress("split", || pending.state());
        assert_eq!(state, NcclResult::Success);
        let child = pending
            .try_take()
            .expect("done")
            .expect("split across nodes");
        assert!(!child.config().blocking, "the child inherits non-blocking");
        assert_eq!((child.count(), child.rank()), (2, rank / 2));
        nonblocking_group(&child, 22, "non-blocking child");
        let ranks = Ranks::new(vec![child]);
        for (i, coll) in nccl_device::abi::Coll::ALL.into_iter().enumerate() {
            common::check_collective(
                &ranks,
                coll,
                3000,
                DataType::Float32,
                ReduceOp::Sum,
                i % 2,
                false,
                23 + i as u64,
                Drive::OneThread,
            )
            .unwrap_or_else(|e| panic!("non-blocking child: {e}"));
        }
        drop(ranks);
        run_work(&parent, 30, "non-blocking parent after the split");
        return;
    }
    common::procs::run_nodes("nonblocking_comms_across_nodes", 2, 2, &[LOOPBACK]);
}

/// An interface name that no host has.
const NO_SUCH_IF: &str = "nccl-rs-no-such-if";

/// `NCCL_SOCKET_IFNAME` naming no interface, through a real communicator init across nodes
/// (2x1, the bootstrap on loopback, where the parent's root is): init fails with
/// ncclInvalidUsage naming the value and the interfaces that exist (loopback at least).
#[test]
fn unmatched_socket_ifname_fails_init_naming_the_interfaces() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
        let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
        let t = std::time::Instant::now();
        let err = Comm::init_rank_on(dev, nranks, &id, rank)
            .expect_err("init across nodes with an interface that matches nothing");
        eprintln!("rank {rank}: init failed after {:?}: {err}", t.elapsed());
        assert_eq!(err.code, nccl::NcclResult::InvalidUsage, "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("NCCL_SOCKET_IFNAME={NO_SUCH_IF}")),
            "{msg}"
        );
        assert!(
            msg.contains("lo (127.0.0.1"),
            "the interfaces that exist: {msg}"
        );
        return;
    }
    let env = [("NCCL_SOCKET_IFNAME", NO_SUCH_IF)];
    common::procs::run_nodes(
        "unmatched_socket_ifname_fails_init_naming_the_interfaces",
        2,
        1,
        &env,
    );
}

/// The unique id's side of the same setting: `ncclGetUniqueId` with `NCCL_SOCKET_IFNAME`
/// matching no interface fails, naming the value and the interfaces that exist, as NCCL's
/// does ("no socket interface found"). An id that silently names the loopback address instead
/// leads the ranks of other hosts to their own loopback, where no root listens: their error
/// then names neither the setting nor the interfaces.
#[test]
fn unmatched_socket_ifname_fails_get_unique_id() {
    if common::procs::child().is_some() {
        match nccl::get_unique_id() {
            Ok(id) => panic!(
                "NCCL_SOCKET_IFNAME={NO_SUCH_IF}: get_unique_id succeeded, its root at {:?}",
                id.decode().map(|(root, _)| root)
            ),
            Err(err) => {
                assert_eq!(err.code, nccl::NcclResult::InvalidUsage, "{err}");
                let msg = err.to_string();
                assert!(msg.contains(NO_SUCH_IF), "the setting: {msg}");
                assert!(
                    msg.contains("127.0.0.1"),
                    "the interfaces that exist: {msg}"
                );
            }
        }
        return;
    }
    let env = [("NCCL_SOCKET_IFNAME", NO_SUCH_IF)];
    common::procs::run_each(
        "unmatched_socket_ifname_fails_get_unique_id",
        1,
        &env,
        |_| Vec::new(),
    );
}

/// `NCCL_COMM_ID` pointing at a loopback port this test already listens on (and never
/// answers): rank 0 cannot start the root there and fails at once with ncclSystemError naming
/// the address; rank 1 reaches the squatter, gets no answer and fails once the bootstrap
/// timeout (1 s here) is over, naming the address too. Nothing hangs.
#[test]
fn comm_id_on_a_port_in_use_fails_init_naming_the_address() {
    if let Some((rank, nranks, _)) = common::procs::child() {
        nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
        let addr = std::env::var("NCCL_COMM_ID").expect("NCCL_COMM_ID");
        let id = nccl::get_unique_id().expect("an id from NCCL_COMM_ID");
        let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
        let t = std::time::Instant::now();
        let err = Comm::init_rank_on(dev, nranks, &id, rank)
            .expect_err("init with NCCL_COMM_ID on a port in use");
        let took = t.elapsed();
        eprintln!("rank {rank}: init failed after {took:?}: {err}");
        let msg = err.to_string();
        assert!(msg.contains(&addr), "rank {rank}: the address: {msg}");
        if rank == 0 {
            assert_eq!(err.code, nccl::NcclResult::SystemError, "{err}");
            assert!(msg.contains("NCCL_COMM_ID"), "{msg}");
            assert!(msg.contains("in use"), "{msg}");
            assert!(!msg.contains("bootstrap: bootstrap"), "one prefix: {msg}");
            assert!(took < std::time::Duration::from_secs(1), "{took:?}");
        } else {
            assert_eq!(err.code, nccl::NcclResult::RemoteError, "{err}");
            assert!(took < std::time::Duration::from_secs(10), "{took:?}");
        }
        return;
    }
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").expect("listen on loopback");
    let addr = squatter.local_addr().expect("its address").to_string();
    let env = [
        LOOPBACK,
        ("NCCL_COMM_ID", addr.as_str()),
        ("NCCL_BOOTSTRAP_TIMEOUT_MS", "1000"),
    ];
    common::procs::run_nodes(
        "comm_id_on_a_port_in_use_fails_init_naming_the_address",
        2,
        1,
        &env,
    );
    drop(squatter);
}
