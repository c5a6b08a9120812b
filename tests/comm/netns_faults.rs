//! Real network stacks on one machine: every node is a network namespace of its own, joined to
//! the others by a veth pair and a bridge (`common::netns`), and its ranks are processes on the
//! CPU simulator inside that namespace, grouped into nodes by `NCCL_HOSTID`. The bootstrap root
//! sits at node 0's veth address (`NCCL_COMM_ID`) and the socket network uses the veth
//! interface (`NCCL_SOCKET_IFNAME`), so everything between nodes crosses a real, non-loopback
//! interface that the test can take down:
//!
//! - collectives across 2×1 and 2×2 ranks pass with random data;
//! - a rank killed in the middle of an AllReduce (3×1): every survivor gets an async error
//!   within a bound, and abort returns;
//! - the link of a node taken down in the middle of a loop of AllReduces (2×1, 2×2): every rank
//!   gets an async error within the configured peer timeout (`NCCL_RS_SOCKET_TIMEOUT_MS`; TCP
//!   keepalive probes, `net/socket/comm/`), and abort returns. Nothing hangs;
//! - the host of a rank that only receives vanishes (its link down: every packet dropped, no
//!   reset) while its peer is in the middle of a large send: the sender, whose sockets hold
//!   unacknowledged data (so keepalive never probes them), gets an async error within the
//!   bound on unacknowledged data (`NCCL_RS_SOCKET_SEND_TIMEOUT_MS`), with keepalive on and
//!   off. (No `tc netem` or `iptables` on the test hosts' kernels, so the link is taken down
//!   instead: the packets vanish all the same.)
//!
//! Addresses are fixed (10.213.x.y) and exist only inside the namespaces the tests make.
//! Where namespaces cannot be made (not root, no `ip`), each test is skipped visibly (a line
//! on stderr and the count at exit), saying why.
//!
//! No duration is asserted: the ranks' runs are bounded (`FAULT_BOUND`) so that a hang fails,
//! and each bound is shorter than the default of the setting under test, so that a setting
//! that was ignored fails too.

use crate::common::{self, netns, skip, Ranks};
use nccl::{Comm, DataType, ReduceOp};
use std::time::{Duration, Instant};

/// The bootstrap root's port at node 0's address (each fabric has namespaces of its own, so
/// one fixed port serves every test).
const ROOT_PORT: u16 = 29_413;
/// How long the ranks of a fault test may take to give up once the fault happened: generous
/// beside the 2 to 3 s the tests configure, shorter than the defaults they replace (60 s for
/// NCCL_RS_SOCKET_TIMEOUT_MS and NCCL_RS_SOCKET_SEND_TIMEOUT_MS; no heartbeats at all).
const FAULT_BOUND: Duration = Duration::from_secs(45);

/// In a rank process: its communicator, bootstrapped through NCCL_COMM_ID (the parent's unique
/// id would point into the parent's namespace, which the ranks cannot reach).
fn child_comm(rank: usize, nranks: usize) -> Comm {
    common::sim();
    let id = nccl::get_unique_id().expect("the unique id of NCCL_COMM_ID");
    let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
    Comm::init_rank_on(dev, nranks, &id, rank).expect("init_rank across namespaces")
}

/// Every collective across 2×1 and 2×2 ranks, nodes joined only by the veth link: the
/// bootstrap and the socket network work over a real interface, and the collectives' bytes
/// cross it (the interface's counters say so).
#[test]
fn collectives_across_namespaces() {
    if let Some((rank, nranks)) = netns::child() {
        let ranks = Ranks::new(vec![child_comm(rank, nranks)]);
        let (tx0, rx0) = netns::interface_bytes();
        let skipped = skip::total();
        common::every_collective(&ranks, 7);
        let (tx1, rx1) = netns::interface_bytes();
        let (tx, rx) = (tx1 - tx0, rx1 - rx0);
        eprintln!("rank {rank}/{nranks}: {tx} bytes sent and {rx} received over the veth link");
        if skip::total() > skipped {
            // Collectives left out of this build moved nothing: the volume says nothing.
            skip::record(skip::LEFT_OUT, "the bytes across the veth link");
            return;
        }
        // The node's interface (shared by its ranks) carried at least the 40 000-element
        // blocks each collective moves between the nodes, both ways.
        assert!(
            tx > 160_000 && rx > 160_000,
            "only {tx} bytes out and {rx} in crossed the link"
        );
        return;
    }
    for (tag, per_node, subnet) in [("c1", 1, 1), ("c2", 2, 2)] {
        let Some(f) = netns::fabric_or_skip(tag, 2, subnet) else {
            return;
        };
        let t0 = Instant::now();
        f.run(per_node, ROOT_PORT, &[]);
        eprintln!("2x{per_node} ranks: {:?}", t0.elapsed());
    }
}

/// Waits until the communicator reports an async error, at most `limit`.
fn wait_async_error(comm: &Comm, rank: usize, limit: Duration) -> (nccl::Error, Duration) {
    let t0 = Instant::now();
    loop {
        if let Err(e) = comm.get_async_error() {
            return (e, t0.elapsed());
        }
        assert!(
            t0.elapsed() < limit,
            "rank {rank}: no async error after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The error says what broke: a remote or system error naming a connection to a peer inside
/// the namespaces.
fn check_peer_error(err: &nccl::Error, rank: usize) {
    assert!(
        matches!(
            err.code,
            nccl::NcclResult::RemoteError | nccl::NcclResult::SystemError
        ),
        "rank {rank}: {err}"
    );
    assert!(
        err.message.contains("10.213."),
        "rank {rank}: the error names no peer address: {err}"
    );
}

/// A rank killed (SIGKILL) in the middle of an AllReduce on 3 nodes of one rank: both survivors
/// get an async error naming the dead rank (and a peer address) within the bound, and abort
/// returns.
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_float_sum"),
    ignore = "needs nccl_all_reduce_float_sum, which NCCL_RS_KERNELS left out"
)]
fn killed_peer_across_namespaces() {
    if let Some((rank, nranks)) = netns::child() {
        let comm = child_comm(rank, nranks);
        let victim = nranks - 1;
        let count = 1 << 20;
        let buf = comm.device().alloc(count * 4).expect("alloc");
        let stream = comm.device().stream_create().expect("stream");
        // SAFETY: `buf` holds `count` floats and outlives the AllReduce (the comm is aborted
        // and its kernels end before `buf` drops).
        unsafe {
            comm.all_reduce_raw(
                buf.ptr(),
                buf.ptr(),
                count,
                DataType::Float32,
                ReduceOp::SUM,
                stream,
            )
        }
        .expect("issue the AllReduce");
        if rank == victim {
            std::thread::sleep(Duration::from_millis(200));
            // SAFETY: kill(2) on our own pid.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        let (err, after) = wait_async_error(&comm, rank, Duration::from_secs(30));
        eprintln!("rank {rank}: async error after {after:?}: {err}");
        check_peer_error(&err, rank);
        assert!(
            err.message.contains(&format!("rank {victim}")),
            "rank {rank}: the error does not name the dead rank {victim}: {err}"
        );
        let t1 = Instant::now();
        comm.abort();
        let _ = comm.device().stream_sync(stream);
        drop(buf);
        comm.destroy().ok();
        eprintln!("rank {rank}: abort and destroy took {:?}", t1.elapsed());
        return;
    }
    // Every survivor here has a network connection to the victim. A survivor that reaches it
    // only through p2p on its own node (2x2) learns of the death from nothing yet (issue 23's
    // bootstrap-based detection), so 2x2 is not claimed, as in sim_multinode.
    let Some(f) = netns::fabric_or_skip("kp", 3, 3) else {
        return;
    };
    let victim = 2;
    let mut run = f.start(1, ROOT_PORT, &[]);
    let took = run.procs.wait(common::procs::limit(), &[victim]);
    run.procs.check(&[victim]);
    eprintln!("killed peer, 3x1: the survivors were done after {took:?}");
}

/// The peer timeout the downed-link test configures.
const PEER_TIMEOUT_MS: u64 = 3000;

/// The last node's veth link taken down while every rank loops over AllReduces (2×1, 2×2, and
/// 3×1 where nodes 0 and 1 still reach each other): no rank hears from the cut-off node again,
/// nor it from them (no reset, no close: the packets just vanish), so only the peer timeout
/// can tell. Every rank gets an async error naming a connection within it, and abort returns.
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_float_sum"),
    ignore = "needs nccl_all_reduce_float_sum, which NCCL_RS_KERNELS left out"
)]
fn downed_link_across_namespaces() {
    if let Some((rank, nranks)) = netns::child() {
        let comm = child_comm(rank, nranks);
        let count = 1 << 16;
        let buf = comm.device().alloc(count * 4).expect("alloc");
        let stream = comm.device().stream_create().expect("stream");
        // One thread issues, watches and aborts (a `Comm` is not shared across threads): an
        // AllReduce is issued, then polled until it completes or the async error comes.
        let t0 = Instant::now();
        let mut iterations = 0u64;
        let err = 'outer: loop {
            // SAFETY: `buf` holds `count` floats and outlives every AllReduce (the comm is
            // aborted and its kernels end before `buf` drops).
            let issued = unsafe {
                comm.all_reduce_raw(
                    buf.ptr(),
                    buf.ptr(),
                    count,
                    DataType::Float32,
                    ReduceOp::SUM,
                    stream,
                )
            };
            loop {
                if let Err(e) = comm.get_async_error().and(issued.clone()) {
                    break 'outer e;
                }
                match comm.device().stream_query(stream) {
                    Ok(true) => break,
                    Ok(false) => {}
                    Err(e) => break 'outer e,
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(60),
                    "rank {rank}: no async error after 60 s"
                );
                std::thread::sleep(Duration::from_micros(200));
            }
            iterations += 1;
            if iterations == 1 {
                netns::signal("looping", rank);
            }
        };
        eprintln!(
            "rank {rank}: async error {:?} into the loop: {err}",
            t0.elapsed()
        );
        check_peer_error(&err, rank);
        let t1 = Instant::now();
        comm.abort();
        eprintln!("rank {rank}: abort returned after {:?}", t1.elapsed());
        // The aborted kernel ends on its own; `buf` may go only after it did.
        let _ = comm.device().stream_sync(stream);
        eprintln!("rank {rank}: {iterations} AllReduces before the link went down");
        drop(buf);
        comm.destroy().ok();
        return;
    }
    for (tag, nodes, per_node, subnet) in [("d1", 2, 1, 4), ("d2", 2, 2, 5), ("d3", 3, 1, 7)] {
        if !downed_link(tag, nodes, per_node, subnet) {
            return;
        }
    }
}

/// The parent of [`downed_link_across_namespaces`] for `nodes` × `per_node` ranks: starts them,
/// takes the last node's link down once every rank finished an AllReduce, and checks that all
/// of them are done (within [`FAULT_BOUND`]: a hang, or the default timeout, fails). False
/// when skipped.
fn downed_link(tag: &str, nodes: usize, per_node: usize, subnet: u8) -> bool {
    let Some(f) = netns::fabric_or_skip(tag, nodes, subnet) else {
        return false;
    };
    let timeout = PEER_TIMEOUT_MS.to_string();
    let env = [("NCCL_RS_SOCKET_TIMEOUT_MS", timeout.as_str())];
    let mut run = f.start(per_node, ROOT_PORT, &env);
    let all: Vec<usize> = (0..nodes * per_node).collect();
    let looping = run.wait_signal("looping", &all, common::procs::limit());
    if looping {
        // A moment for AllReduces to be in flight when the link goes (no synchronisation).
        std::thread::sleep(Duration::from_millis(100));
        f.link_down(nodes - 1)
            .expect("take the last node's link down");
    }
    let took = run.procs.wait(FAULT_BOUND, &[]);
    run.procs.check(&[]);
    assert!(looping, "the ranks never reported their first AllReduce");
    eprintln!(
        "downed link, {nodes}x{per_node}: every rank was done {took:?} after the link went down"
    );
    true
}

/// The bound on unacknowledged data the vanished-host test configures.
const SEND_TIMEOUT_MS: u64 = 3000;

/// Rank 0 sends large messages to rank 1 in a loop (2×1); the parent takes rank 1's link down
/// in the middle of it. Rank 0's sockets then hold unacknowledged data, which TCP alone
/// retransmits for about 15 minutes; it must get an async error naming the connection within
/// the bound instead, and abort must return. Rank 1 (cut off) sees its link down and leaves.
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_p2p"),
    ignore = "needs nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn vanished_host_under_a_sender_across_namespaces() {
    if let Some((rank, nranks)) = netns::child() {
        let comm = child_comm(rank, nranks);
        let peer = 1 - rank;
        let count = 4 << 20;
        let buf = comm.device().alloc(count * 4).expect("alloc");
        let stream = comm.device().stream_create().expect("stream");
        let ifname = std::env::var("NCCL_RS_NETNS_IFNAME").expect("interface name");
        let link_down = || {
            std::fs::read_to_string(format!("/sys/class/net/{ifname}/operstate"))
                .map(|s| s.trim() == "down")
                .unwrap_or(false)
        };
        let t0 = Instant::now();
        let mut iterations = 0u64;
        let err = 'outer: loop {
            // SAFETY: `buf` holds `count` floats and outlives every send and receive (the
            // comm is aborted and its kernels end before `buf` drops).
            let issued = unsafe {
                if rank == 0 {
                    comm.send_raw(buf.ptr(), count, DataType::Float32, peer, stream)
                } else {
                    comm.recv_raw(buf.ptr(), count, DataType::Float32, peer, stream)
                }
            };
            loop {
                if let Err(e) = comm.get_async_error().and(issued.clone()) {
                    break 'outer Some(e);
                }
                if rank == 1 && link_down() {
                    break 'outer None;
                }
                match comm.device().stream_query(stream) {
                    Ok(true) => break,
                    Ok(false) => {}
                    Err(e) => break 'outer Some(e),
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(60),
                    "rank {rank}: no async error after 60 s ({iterations} messages)"
                );
                std::thread::sleep(Duration::from_micros(200));
            }
            iterations += 1;
            if iterations == 1 {
                netns::signal("looping", rank);
            }
        };
        match err {
            Some(err) => {
                eprintln!(
                    "rank {rank}: async error {:?} into the loop: {err}",
                    t0.elapsed()
                );
                check_peer_error(&err, rank);
            }
            None => {
                assert_eq!(rank, 1, "only the cut-off rank leaves without an error");
                eprintln!("rank {rank}: the link is down; leaving");
            }
        }
        let t1 = Instant::now();
        comm.abort();
        eprintln!("rank {rank}: abort returned after {:?}", t1.elapsed());
        let _ = comm.device().stream_sync(stream);
        eprintln!("rank {rank}: {iterations} messages before the link went down");
        drop(buf);
        comm.destroy().ok();
        return;
    }
    let bound = SEND_TIMEOUT_MS.to_string();
    // With keepalive (the default: rank 0's idle connections from rank 1, the bootstrap's and
    // the ring's receiving one, notice it too). Without keepalive only the bound on the sending
    // sockets can, and only if the link goes down while a socket holds unacknowledged data:
    // when it goes down while rank 0 waits for rank 1 to post a receive, nothing is in flight
    // and nothing can tell (NCCL's sockets neither). That case passed or hung depending on
    // timing (4 of 6 runs hung on a loaded 2-core machine), so it is not run here; the pieces
    // are unit-tested (`bootstrap::socket::connections_bound_a_silent_peer_host`, the socket
    // network's `a_receiver_late_past_the_send_timeout_is_no_fault`).
    let (tag, subnet, keepalive) = ("v1", 9, bound.as_str());
    let Some(f) = netns::fabric_or_skip(tag, 2, subnet) else {
        return;
    };
    let env = [
        ("NCCL_RS_SOCKET_TIMEOUT_MS", keepalive),
        ("NCCL_RS_SOCKET_SEND_TIMEOUT_MS", bound.as_str()),
    ];
    let mut run = f.start(1, ROOT_PORT, &env);
    let looping = run.wait_signal("looping", &[0, 1], common::procs::limit());
    if looping {
        // A moment for a send to be in flight when the link goes (no synchronisation).
        std::thread::sleep(Duration::from_millis(100));
        f.link_down(1).expect("take rank 1's link down");
    }
    let took = run.procs.wait(FAULT_BOUND, &[]);
    run.procs.check(&[]);
    assert!(looping, "the ranks never reported their first message");
    eprintln!("vanished host (keepalive {keepalive} ms): both ranks were done {took:?} after the link went down");
}

/// The heartbeat bound the quiet-link test configures.
const HANG_TIMEOUT_MS: u64 = 2000;

/// The case the vanished-host test cannot run: keepalive off, and the link cut while nothing
/// is in flight (rank 0's receive waits for a message rank 1 never sends). No
/// socket holds unacknowledged data and none probes, so TCP alone never tells; the opt-in
/// heartbeats (`NCCL_RS_PEER_HANG_TIMEOUT_MS`) do: rank 0 stops hearing rank 1's and gets an
/// async error naming it within the bound, and abort returns. Rank 1 (cut off) sees its link
/// down and leaves.
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_p2p"),
    ignore = "needs nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn quiet_link_cut_without_keepalive_is_seen_by_heartbeats() {
    if let Some((rank, nranks)) = netns::child() {
        let comm = child_comm(rank, nranks);
        let peer = 1 - rank;
        let count = 1 << 20;
        let buf = comm.device().alloc(count * 4).expect("alloc");
        let stream = comm.device().stream_create().expect("stream");
        let ifname = std::env::var("NCCL_RS_NETNS_IFNAME").expect("interface name");
        let link_down = || {
            std::fs::read_to_string(format!("/sys/class/net/{ifname}/operstate"))
                .map(|s| s.trim() == "down")
                .unwrap_or(false)
        };
        // One message each way sets their connections up; then rank 0 posts a receive that
        // rank 1 never matches. (A send would not do: one that fits the receiver's FIFOs and
        // socket buffers completes without a receiver, as it did once under load.)
        for from in [0, 1] {
            // SAFETY: `buf` holds `count` floats and outlives every send and receive (the comm
            // is aborted and its kernels end before `buf` drops).
            unsafe {
                if rank == from {
                    comm.send_raw(buf.ptr(), count, DataType::Float32, peer, stream)
                } else {
                    comm.recv_raw(buf.ptr(), count, DataType::Float32, peer, stream)
                }
            }
            .expect("issue a set-up message");
            comm.device().stream_sync(stream).expect("a set-up message");
        }
        if rank == 0 {
            // SAFETY: as above.
            unsafe { comm.recv_raw(buf.ptr(), count, DataType::Float32, peer, stream) }
                .expect("issue the receive");
        }
        // A few heartbeats go both ways before the link is cut (rank 1 never posts a receive).
        std::thread::sleep(Duration::from_millis(HANG_TIMEOUT_MS));
        netns::signal("quiet", rank);
        let t0 = Instant::now();
        let err = loop {
            if let Err(e) = comm.get_async_error() {
                break Some(e);
            }
            if rank == 1 && link_down() {
                break None;
            }
            if rank == 0 {
                assert!(
                    !comm.device().stream_query(stream).unwrap_or(false),
                    "rank 0: the receive completed without a sender"
                );
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "rank {rank}: no async error after 60 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        match err {
            Some(err) => {
                eprintln!(
                    "rank {rank}: async error {:?} after the signal: {err}",
                    t0.elapsed()
                );
                check_peer_error(&err, rank);
                assert!(
                    err.message.contains(&format!("rank {peer}")),
                    "rank {rank}: the error does not name rank {peer}: {err}"
                );
            }
            None => {
                assert_eq!(rank, 1, "only the cut-off rank leaves without an error");
                eprintln!("rank {rank}: the link is down; leaving");
            }
        }
        let t1 = Instant::now();
        comm.abort();
        let _ = comm.device().stream_sync(stream);
        eprintln!("rank {rank}: abort returned after {:?}", t1.elapsed());
        drop(buf);
        comm.destroy().ok();
        return;
    }
    let Some(f) = netns::fabric_or_skip("q1", 2, 11) else {
        return;
    };
    let hang = HANG_TIMEOUT_MS.to_string();
    let env = [
        ("NCCL_RS_SOCKET_TIMEOUT_MS", "0"),
        ("NCCL_RS_PEER_HANG_TIMEOUT_MS", hang.as_str()),
    ];
    let mut run = f.start(1, ROOT_PORT, &env);
    let quiet = run.wait_signal("quiet", &[0, 1], common::procs::limit());
    if quiet {
        f.link_down(1).expect("take rank 1's link down");
    }
    let took = run.procs.wait(FAULT_BOUND, &[]);
    run.procs.check(&[]);
    assert!(quiet, "the ranks never reported their quiet state");
    eprintln!(
        "quiet link cut, keepalive off, NCCL_RS_PEER_HANG_TIMEOUT_MS={HANG_TIMEOUT_MS}: both ranks \
         were done {took:?} after the link went down"
    );
}

/// Nodes with two NICs each (two veth rails on bridges of their own, two subnets): the socket
/// network takes both as devices, successive ring channels and send/recv connections leave
/// through successive NICs, and every collective's bytes cross both rails, both ways (each
/// interface's counters say so).
#[test]
fn traffic_spreads_over_two_nics_across_namespaces() {
    if let Some((rank, nranks)) = netns::child() {
        let ranks = Ranks::new(vec![child_comm(rank, nranks)]);
        let before = netns::rail_bytes();
        let skipped = skip::total();
        common::every_collective(&ranks, 11);
        let after = netns::rail_bytes();
        if skip::total() > skipped {
            // Collectives left out of this build moved nothing: the volume says nothing.
            skip::record(skip::LEFT_OUT, "the bytes across each rail");
            return;
        }
        for (k, (b, a)) in before.iter().zip(&after).enumerate() {
            let (tx, rx) = (a.0 - b.0, a.1 - b.1);
            eprintln!("rank {rank}/{nranks}: rail {k}: {tx} bytes sent and {rx} received");
            assert!(
                tx > 160_000 && rx > 160_000,
                "rank {rank}: rail {k} carried only {tx} bytes out and {rx} in"
            );
        }
        assert_eq!(after.len(), 2, "two rails");
        return;
    }
    let f = match netns::Fabric::with_rails("r2", 2, 20, 2) {
        Ok(f) => f,
        Err(why) => {
            let test = "traffic_spreads_over_two_nics_across_namespaces";
            skip::record(
                "network namespaces cannot be made here",
                &format!("{test}: {why}"),
            );
            return;
        }
    };
    f.run(1, ROOT_PORT, &[]);
}
