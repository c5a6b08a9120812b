//! Faults across nodes on the CPU simulator (ranks as processes, nodes by `NCCL_HOSTID`): a
//! killed peer, a stopped one, an idle proxy's CPU use, and settings that name no interface or
//! an address in use. Every case ends in an error naming the cause, never a hang.

use super::multinode::child_comm;
use crate::common::{self, Drive, LOOPBACK};
use nccl::{Comm, DataType, ReduceOp};

/// A rank killed (SIGKILL) in the middle of an AllReduce: every survivor's async error turns
/// into an error naming the connection to the dead peer within the bound, and abort then
/// returns. Nothing hangs.
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_float_sum"),
    ignore = "needs nccl_all_reduce_float_sum, which NCCL_RS_KERNELS left out"
)]
fn killed_peer_mid_collective_raises_async_errors() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        let dev = common::sim_dev(rank);
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
        common::procs::run_nodes_with_victim(nodes, per_node, &[LOOPBACK], nodes * per_node - 1);
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
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_float_sum"),
    ignore = "needs nccl_all_reduce_float_sum, which NCCL_RS_KERNELS left out"
)]
fn stopped_peer_raises_async_errors_when_hangs_are_watched() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        let dev = common::sim_dev(rank);
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
                ReduceOp::SUM,
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
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_p2p"),
    ignore = "needs nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn stopped_peer_is_reported_when_its_watcher_has_nothing_to_wait_for() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        let dev = common::sim_dev(rank);
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
            ReduceOp::SUM,
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
    common::procs::run_nodes(2, 1, &[LOOPBACK]);
}

/// An interface name that no host has.
const NO_SUCH_IF: &str = "nccl-rs-no-such-if";

/// `NCCL_SOCKET_IFNAME` naming no interface, through a real communicator init across nodes
/// (2x1, the bootstrap on loopback, where the parent's root is): init fails with
/// ncclInvalidUsage naming the value and the interfaces that exist (loopback at least).
#[test]
fn unmatched_socket_ifname_fails_init_naming_the_interfaces() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        let dev = common::sim_dev(rank);
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
    common::procs::run_nodes(2, 1, &env);
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
    common::procs::run_each(1, &env, |_| Vec::new());
}

/// `NCCL_COMM_ID` pointing at a loopback port this test already listens on (and never
/// answers): rank 0 cannot start the root there and fails with ncclSystemError naming the
/// address; rank 1 reaches the squatter, gets no answer and fails once the bootstrap timeout
/// (1 s here) is over, naming the address too. Nothing hangs (the supervisor's bound would
/// turn a hang into a failure; no time is asserted).
#[test]
fn comm_id_on_a_port_in_use_fails_init_naming_the_address() {
    if let Some((rank, nranks, _)) = common::procs::child() {
        common::sim();
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
        } else {
            // (After the 1 s bootstrap timeout: the supervisor's bound catches a hang.)
            assert_eq!(err.code, nccl::NcclResult::RemoteError, "{err}");
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
    common::procs::run_nodes(2, 1, &env);
    drop(squatter);
}
