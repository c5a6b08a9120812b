//! Communicator creation that cannot complete: a rank that never arrives, an abort during
//! creation, a dead peer. Every case ends with an error in bounded time, never a hang. (A test
//! binary of its own: it shortens NCCL_BOOTSTRAP_TIMEOUT_MS for the whole process.)

mod common;

use nccl::{Backend, Comm, Config, Device, NcclResult};
use std::time::{Duration, Instant};

fn sim() {
    // Loopback only (without it the bootstrap used the machine's own interface address).
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    std::env::set_var("NCCL_BOOTSTRAP_TIMEOUT_MS", "1500");
    nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
}

fn dev(i: usize) -> Device {
    Device::open(i as i32).expect("open a simulated device")
}

#[test]
fn a_rank_that_never_arrives_fails_every_other_rank_in_time() {
    sim();
    let id = nccl::get_unique_id().unwrap();
    let n = 4;
    let t = Instant::now();
    // Ranks 0..2 arrive, rank 3 never does.
    let res: Vec<_> = std::thread::scope(|s| {
        let id = &id;
        let hs: Vec<_> = (0..n - 1)
            .map(|r| s.spawn(move || Comm::init_rank_on(dev(r), n, id, r)))
            .collect();
        hs.into_iter().map(|h| h.join().expect("join")).collect()
    });
    let took = t.elapsed();
    assert!(took < Duration::from_secs(5), "took {took:?}");
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
    sim();
    let id = nccl::get_unique_id().unwrap();
    // A long timeout for this one: the abort, not the timeout, must end it.
    let config = Config::blocking(false);
    let p = Comm::start_init_rank_config_on(dev(4), 2, &id, 0, &config).expect("start");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(p.state(), NcclResult::InProgress);
    let t = Instant::now();
    p.abort();
    let e = p.wait().unwrap_err();
    eprintln!(
        "abort during creation: {:?} after {:?}: {e}",
        e.code,
        t.elapsed()
    );
    assert!(
        t.elapsed() < Duration::from_millis(1000),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(e.code, NcclResult::InvalidUsage, "{e}");
    assert!(e.message.contains("aborted"), "{e}");
}

#[test]
fn a_dead_peer_fails_finalize_and_abort_is_prompt() {
    sim();
    let id = nccl::get_unique_id().unwrap();
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
    let c = &comms[0];
    let t = Instant::now();
    let e = c.finalize().unwrap_err();
    eprintln!(
        "finalize after the peer aborted: {:?} after {:?}: {e}",
        e.code,
        t.elapsed()
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(e.code, NcclResult::RemoteError, "{e}");
    let t = Instant::now();
    c.abort();
    drop(comms);
    eprintln!("abort and destroy after the fault: {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(1));
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
            nccl::ReduceOp::Sum,
            stream,
        )
    }
    .unwrap();
    (stream, buf)
}

/// A collective whose peer never launches its half: the kernel waits on the peer, and abort
/// ends that wait, so the stream drains and the communicators can go (no hang).
#[test]
fn abort_ends_a_collective_stuck_on_an_absent_peer() {
    sim();
    let comms = Comm::init_all(&[0, 1]).expect("init_all");
    let c = &comms[0];
    // Rank 1 never calls its AllReduce.
    let (stream, buf) = all_reduce_without_its_peer(c);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !c.device().stream_query(stream).unwrap(),
        "the kernel cannot finish without its peer"
    );
    let t = Instant::now();
    c.abort();
    // A liveness bound, not a timing claim: without the abort this never ends.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !c.device().stream_query(stream).unwrap() {
        assert!(
            Instant::now() < deadline,
            "the aborted kernel is still waiting"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
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
fn destroy_after_a_peer_fault_returns_the_error() {
    sim();
    let mut comms = Comm::init_all(&[4, 5]).expect("init_all");
    let dead = comms.pop().expect("rank 1");
    let c = comms.pop().expect("rank 0");
    // Rank 1 never calls its AllReduce; it goes away instead.
    let (stream, buf) = all_reduce_without_its_peer(&c);
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !c.device().stream_query(stream).unwrap(),
        "the kernel cannot finish without its peer"
    );
    let t = Instant::now();
    dead.abort();
    drop(dead);
    let dev = c.device().clone();
    let e = c.destroy().expect_err("a destroy after a fault returns it");
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

/// The bootstrap root killed during init (issue 23's tests): rank 0 starts the root
/// (`NCCL_COMM_ID`, as launchers do) and dies while rank 2 has not arrived yet. Rank 1, waiting
/// on the root, and rank 2, arriving at a port nobody listens on any more, both fail init with
/// an error in bounded time.
#[test]
fn the_root_killed_during_init_fails_every_rank_in_time() {
    if let Some((rank, nranks, _)) = common::procs::child() {
        nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
        let id = nccl::get_unique_id().expect("the id of NCCL_COMM_ID");
        match rank {
            0 => {
                std::thread::spawn(|| {
                    std::thread::sleep(Duration::from_millis(500));
                    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
                });
                let _ = Comm::init_rank_on(dev(0), nranks, &id, 0);
                std::thread::sleep(Duration::from_secs(60));
                unreachable!("rank 0 was to die during its init");
            }
            _ => {
                if rank == 2 {
                    std::thread::sleep(Duration::from_millis(1500));
                }
                let t = Instant::now();
                let e = Comm::init_rank_on(dev(rank), nranks, &id, rank)
                    .expect_err("an init whose root died must fail");
                let took = t.elapsed();
                eprintln!("rank {rank}: {:?} after {took:?}: {e}", e.code);
                assert_ne!(e.code, NcclResult::Success);
                // A liveness bound (the bootstrap timeout is 3 s here), not a timing claim.
                assert!(took < Duration::from_secs(20), "rank {rank}: {took:?}");
            }
        }
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let comm_id = format!("127.0.0.1:{port}");
    let env = [
        ("NCCL_SOCKET_IFNAME", "lo"),
        ("NCCL_COMM_ID", comm_id.as_str()),
        ("NCCL_BOOTSTRAP_TIMEOUT_MS", "3000"),
    ];
    common::procs::run_nodes_with_victim(
        "the_root_killed_during_init_fails_every_rank_in_time",
        1,
        3,
        &env,
        0,
    );
}

/// NCCL's watchdog pattern with a `Comm` that is not `Sync`: the owner thread is blocked on a
/// collective whose peer never comes; another thread, holding only an `AbortHandle`, polls the
/// async error and aborts; the owner's wait ends.
#[test]
fn a_watchdog_thread_aborts_through_a_handle() {
    sim();
    let comms = Comm::init_all(&[2, 3]).expect("init_all");
    let c = &comms[0];
    let handle = c.abort_handle();
    let watchdog = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        assert!(handle.get_async_error().is_ok(), "no fault yet");
        assert!(!handle.is_aborted());
        handle.abort();
        handle
    });
    let (stream, buf) = all_reduce_without_its_peer(c);
    // Blocks until the watchdog's abort ends the kernel (a liveness bound, not timing).
    let t = Instant::now();
    let _ = c.device().stream_sync(stream);
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    let handle = watchdog.join().expect("watchdog");
    assert!(c.is_aborted() && handle.is_aborted());
    let e = unsafe {
        c.all_reduce_raw(
            buf.ptr(),
            buf.ptr(),
            1,
            nccl::DataType::Float32,
            nccl::ReduceOp::Sum,
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
