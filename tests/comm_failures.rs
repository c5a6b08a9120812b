//! Communicator creation that cannot complete: a rank that never arrives, an abort during
//! creation, a dead peer. Every case ends with an error in bounded time, never a hang. (A test
//! binary of its own: it shortens NCCL_BOOTSTRAP_TIMEOUT_MS for the whole process.)

use nccl::{Backend, Comm, Config, Device, NcclResult};
use std::time::{Duration, Instant};

fn sim() {
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
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(e.code, NcclResult::RemoteError, "{e}");
    let t = Instant::now();
    c.abort();
    drop(comms);
    assert!(t.elapsed() < Duration::from_secs(1));
}

/// A collective whose peer never launches its half: the kernel waits on the peer, and abort
/// ends that wait, so the stream drains and the communicators can go (no hang).
#[test]
fn abort_ends_a_collective_stuck_on_an_absent_peer() {
    sim();
    let comms = Comm::init_all(&[0, 1]).expect("init_all");
    let c = &comms[0];
    let stream = c.device().stream_create().unwrap();
    let buf = c.device().alloc(1 << 20).unwrap();
    // Rank 1 never calls its AllReduce.
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
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !c.device().stream_query(stream).unwrap(),
        "the kernel cannot finish without its peer"
    );
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
    drop(buf);
    c.device().stream_destroy(stream).unwrap();
    drop(comms);
}
