//! Communicator creation that cannot complete: a rank that never arrives, an abort during
//! creation, a dead peer. Every case ends with an error, never a hang: each wait runs under a
//! bound (`BOUND`) that only turns a hang into a failure, shorter than the bootstrap's default
//! timeout (120 s), so that only the fault's own handling can end it in time. No duration is
//! asserted.

use crate::common::{self, procs};
use nccl::{Comm, Config, Device, NcclResult};
use std::time::{Duration, Instant};

/// Generous, yet shorter than NCCL_BOOTSTRAP_TIMEOUT_MS's default (120 s).
const BOUND: Duration = Duration::from_secs(60);

fn dev(i: usize) -> Device {
    common::sim_dev(i)
}

/// NCCL_BOOTSTRAP_TIMEOUT_MS=1500 (a child process of its own).
#[test]
fn a_rank_that_never_arrives_fails_every_other_rank_in_time() {
    procs::isolated(&[("NCCL_BOOTSTRAP_TIMEOUT_MS", "1500")], &[], never_arrives);
}

fn never_arrives() {
    common::sim();
    let id = common::loopback_id();
    let n = 4;
    let t = Instant::now();
    // Ranks 0..2 arrive, rank 3 never does.
    let res: Vec<_> = procs::within("the ranks' init", BOUND, move || {
        std::thread::scope(|s| {
            let id = &id;
            let hs: Vec<_> = (0..n - 1)
                .map(|r| s.spawn(move || Comm::init_rank_on(dev(r), n, id, r).map(|_| ())))
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("join"))
                .collect::<Vec<_>>()
        })
    });
    let took = t.elapsed();
    for r in res {
        let e = r.unwrap_err();
        eprintln!(
            "a rank that never arrives (NCCL_BOOTSTRAP_TIMEOUT_MS=1500): {:?} after {took:?}: {e}",
            e.code
        );
        assert_eq!(e.code, NcclResult::RemoteError, "{e}");
        assert!(e.message.contains("3 of 4"), "{e}");
    }
}

#[test]
fn abort_during_creation_returns_promptly() {
    common::sim();
    let id = common::loopback_id();
    // The default timeout (120 s) for this one: the abort, not the timeout, must end it.
    let config = Config::blocking(false);
    let p = Comm::start_init_rank_config_on(dev(4), 2, &id, 0, &config).expect("start");
    // A window for a wrong completion to show (no synchronisation).
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(p.state(), NcclResult::InProgress);
    let t = Instant::now();
    p.abort();
    let e = procs::within("the aborted creation", BOUND, move || p.wait().unwrap_err());
    eprintln!(
        "abort during creation: {:?} after {:?}: {e}",
        e.code,
        t.elapsed()
    );
    assert_eq!(e.code, NcclResult::InvalidUsage, "{e}");
    assert!(e.message.contains("aborted"), "{e}");
}

#[test]
fn a_dead_peer_fails_finalize_and_abort_is_prompt() {
    common::sim();
    let id = common::loopback_id();
    let comms: Vec<Comm> = std::thread::scope(|s| {
        let id = &id;
        let hs: Vec<_> = (0..2)
            .map(|r| s.spawn(move || Comm::init_rank_on(dev(6 + r), 2, id, r).expect("init")))
            .collect();
        hs.into_iter().map(|h| h.join().expect("join")).collect()
    });
    let mut comms = comms;
    let dead = comms.pop().expect("rank 1");
    dead.abort(); // rank 1 is gone: its sockets close
    drop(dead);
    let c = comms.pop().expect("rank 0");
    let t = Instant::now();
    let (c, e) = procs::within("finalize after the peer aborted", BOUND, move || {
        let e = c.finalize().unwrap_err();
        (c, e)
    });
    eprintln!(
        "finalize after the peer aborted: {:?} after {:?}: {e}",
        e.code,
        t.elapsed()
    );
    assert_eq!(e.code, NcclResult::RemoteError, "{e}");
    let t = Instant::now();
    procs::within("abort and destroy after the fault", BOUND, move || {
        c.abort();
        drop(c);
    });
    eprintln!("abort and destroy after the fault: {:?}", t.elapsed());
}

/// Issues rank 0's half of an AllReduce of 1 MiB on a stream of its own; the peer never
/// issues its half, so the kernel waits until an abort.
fn all_reduce_without_its_peer(c: &Comm) -> (nccl::StreamHandle, nccl::DevBuffer) {
    let stream = c.device().stream_create().unwrap();
    let buf = c.device().alloc(1 << 20).unwrap();
    unsafe {
        c.all_reduce_raw(
            buf.ptr(),
            buf.ptr(),
            1 << 18,
            nccl::DataType::Float32,
            nccl::ReduceOp::SUM,
            stream,
        )
    }
    .unwrap();
    (stream, buf)
}

/// A collective whose peer never launches its half: the kernel waits on the peer, and abort
/// ends that wait, so the stream drains and the communicators can go (no hang).
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_float_sum"),
    ignore = "needs nccl_all_reduce_float_sum, which NCCL_RS_KERNELS left out"
)]
fn abort_ends_a_collective_stuck_on_an_absent_peer() {
    common::sim();
    let comms = Comm::init_all(&[0, 1]).expect("init_all");
    let c = &comms[0];
    // Rank 1 never calls its AllReduce.
    let (stream, buf) = all_reduce_without_its_peer(c);
    // A window for a wrong completion to show (no synchronisation).
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !c.device().stream_query(stream).unwrap(),
        "the kernel cannot finish without its peer"
    );
    let t = Instant::now();
    c.abort();
    // A liveness bound, not a timing claim: without the abort this never ends.
    procs::wait_until("the aborted kernel ends", BOUND, || {
        c.device().stream_query(stream).unwrap()
    });
    eprintln!(
        "a collective stuck on an absent peer: its stream drained {:?} after the abort",
        t.elapsed()
    );
    drop(buf);
    c.device().stream_destroy(stream).unwrap();
    drop(comms);
}

/// Issue 23: `ncclCommDestroy` with no abort before it, on a rank whose collective is stuck on a
/// peer that went away (aborted: its connections end without a goodbye). The fault raises the
/// kernels' abort flag, so the destroy's wait for this rank's own work ends, and it returns the
/// fault (ncclRemoteError naming the peer) instead of waiting for ever.
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_float_sum"),
    ignore = "needs nccl_all_reduce_float_sum, which NCCL_RS_KERNELS left out"
)]
fn destroy_after_a_peer_fault_returns_the_error() {
    common::sim();
    let mut comms = Comm::init_all(&[4, 5]).expect("init_all");
    let dead = comms.pop().expect("rank 1");
    let c = comms.pop().expect("rank 0");
    // Rank 1 never calls its AllReduce; it goes away instead.
    let (stream, buf) = all_reduce_without_its_peer(&c);
    // A window for a wrong completion to show (no synchronisation).
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !c.device().stream_query(stream).unwrap(),
        "the kernel cannot finish without its peer"
    );
    let t = Instant::now();
    dead.abort();
    drop(dead);
    let dev = c.device().clone();
    let e = procs::within("destroy after the fault", BOUND, move || {
        c.destroy().expect_err("a destroy after a fault returns it")
    });
    eprintln!(
        "destroy with a collective stuck on a peer that aborted: {:?} after {:?}: {e}",
        e.code,
        t.elapsed()
    );
    assert_eq!(e.code, NcclResult::RemoteError, "{e}");
    assert!(e.message.contains("rank 1"), "{e}");
    // The kernel ended: the stream is drained and the buffer may go.
    assert!(dev.stream_query(stream).unwrap(), "the kernel still runs");
    drop(buf);
    dev.stream_destroy(stream).unwrap();
}

/// Where the rank processes of the root-killed test leave rank 0's pid.
const SIGNALS: &str = "NCCL_RS_TEST_SIGNALS";

/// Whether process `pid` is gone (or a zombie its parent has not reaped yet).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

/// The bootstrap root killed during init (issue 23's tests): rank 0 starts the root
/// (`NCCL_COMM_ID`, as launchers do) and dies once it listens, while rank 2 has not arrived
/// yet; rank 2 arrives once rank 0 is gone. Rank 1, waiting on the root (or arriving at a port
/// nobody listens on any more), and rank 2 both fail init, each wait under a bound that only
/// turns a hang into a failure.
#[test]
fn the_root_killed_during_init_fails_every_rank_in_time() {
    if let Some((rank, nranks, _)) = common::procs::child() {
        common::sim();
        let id = nccl::get_unique_id().expect("the id of NCCL_COMM_ID");
        let pid_file =
            std::path::Path::new(&std::env::var(SIGNALS).expect("signals")).join("rank0.pid");
        match rank {
            0 => {
                let addr = std::env::var("NCCL_COMM_ID").expect("NCCL_COMM_ID");
                std::fs::write(&pid_file, std::process::id().to_string()).expect("pid file");
                std::thread::spawn(move || {
                    procs::wait_until("rank 0's root listens", BOUND, || {
                        std::net::TcpStream::connect(&addr).is_ok()
                    });
                    // SAFETY: kill(2) on our own pid.
                    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
                });
                // Cannot complete: rank 2 comes only once this process is gone.
                let _ = Comm::init_rank_on(dev(0), nranks, &id, 0);
                loop {
                    std::thread::park();
                }
            }
            _ => {
                if rank == 2 {
                    procs::wait_until("rank 0 dies", BOUND, || {
                        std::fs::read_to_string(&pid_file)
                            .ok()
                            .and_then(|p| p.parse().ok())
                            .is_some_and(gone)
                    });
                }
                let t = Instant::now();
                let d = dev(rank);
                let e = procs::within("an init whose root died", BOUND, move || {
                    Comm::init_rank_on(d, nranks, &id, rank)
                        .map(|_| ())
                        .expect_err("an init whose root died must fail")
                });
                eprintln!("rank {rank}: {:?} after {:?}: {e}", e.code, t.elapsed());
                assert!(
                    matches!(e.code, NcclResult::RemoteError | NcclResult::SystemError),
                    "rank {rank}: {e}"
                );
            }
        }
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let comm_id = format!("127.0.0.1:{port}");
    let dir = common::plugins::scratch("root-killed");
    let dir_s = dir.to_string_lossy().into_owned();
    let env = [
        ("NCCL_COMM_ID", comm_id.as_str()),
        ("NCCL_BOOTSTRAP_TIMEOUT_MS", "3000"),
        (SIGNALS, dir_s.as_str()),
    ];
    common::procs::run_nodes_with_victim(1, 3, &env, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// NCCL's watchdog pattern with a `Comm` that is not `Sync`: the owner thread is blocked on a
/// collective whose peer never comes; another thread, holding only an `AbortHandle`, polls the
/// async error and aborts; the owner's wait ends.
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_float_sum"),
    ignore = "needs nccl_all_reduce_float_sum, which NCCL_RS_KERNELS left out"
)]
fn a_watchdog_thread_aborts_through_a_handle() {
    common::sim();
    let comms = Comm::init_all(&[2, 3]).expect("init_all");
    let c = &comms[0];
    let handle = c.abort_handle();
    let (stream, buf) = all_reduce_without_its_peer(c);
    let watchdog = std::thread::spawn(move || {
        assert!(handle.get_async_error().is_ok(), "no fault yet");
        assert!(!handle.is_aborted());
        handle.abort();
        handle
    });
    // Blocks until the watchdog's abort ends the kernel (a liveness bound, not timing).
    let dev = c.device().clone();
    let _ = procs::within("the owner's wait", BOUND, move || dev.stream_sync(stream));
    let handle = watchdog.join().expect("watchdog");
    assert!(c.is_aborted() && handle.is_aborted());
    let e = unsafe {
        c.all_reduce_raw(
            buf.ptr(),
            buf.ptr(),
            1,
            nccl::DataType::Float32,
            nccl::ReduceOp::SUM,
            stream,
        )
    }
    .unwrap_err();
    assert_eq!(e.code, NcclResult::InvalidUsage, "{e}");
    drop(buf);
    c.device().stream_destroy(stream).unwrap();
    drop(comms);
    // The handle outlives the communicator: aborting again does nothing.
    handle.abort();
}
