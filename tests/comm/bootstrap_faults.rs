//! Issue 23, failures 3 and 7: bootstrap waits after init take their bound from the environment
//! (`NCCL_RS_BOOTSTRAP_OP_TIMEOUT_MS`), and a unique id whose root is never used (or whose init
//! failed before its first message) does not keep its thread and socket for ever: the root
//! gives up after `NCCL_BOOTSTRAP_TIMEOUT_MS`. Loopback only. Each test runs alone in a child
//! process started with its setting (they count the process's threads and descriptors, too).
//! The bounds below only turn a hang into a failure; each is shorter than the default the
//! setting replaces, so a setting that was ignored fails as well (no time is asserted).

use crate::common::{self, procs};
use nccl::bootstrap::Bootstrap;
use nccl::{Comm, NcclResult};
use std::time::{Duration, Instant};

/// Longer than any of the settings below, shorter than their defaults (120 s and 300 s).
const BOUND: Duration = Duration::from_secs(60);

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

#[test]
fn op_timeout_comes_from_the_environment() {
    procs::isolated(
        &[("NCCL_RS_BOOTSTRAP_OP_TIMEOUT_MS", "500")],
        &[],
        op_timeout,
    );
}

fn op_timeout() {
    common::sim();
    let id = common::loopback_id();
    let (done, wait_done) = std::sync::mpsc::channel::<()>();
    let peer = std::thread::spawn(move || {
        let b = Bootstrap::init(&id, 1, 2, Duration::from_secs(10)).expect("rank 1 init");
        // Stays alive, silent, until rank 0 is done waiting for it.
        let _ = wait_done.recv();
        drop(b);
    });
    let (elapsed, r) = procs::within("a receive nobody answers", BOUND, move || {
        let b = Bootstrap::init(&id, 0, 2, Duration::from_secs(10)).expect("rank 0 init");
        let t = Instant::now();
        let r = b.recv(1, 7); // rank 1 never sends
        (t.elapsed(), r.map(|_| ()))
    });
    let _ = done.send(());
    peer.join().unwrap();
    let e = r.expect_err("a receive nobody answers must time out");
    eprintln!(
        "a receive nobody answers (NCCL_RS_BOOTSTRAP_OP_TIMEOUT_MS=500): {:?} after {elapsed:?}: {e}",
        e.code
    );
    assert_eq!(e.code, NcclResult::RemoteError, "{e}");
    assert!(
        e.message
            .contains("timed out waiting for a message from rank 1"),
        "{e}"
    );
}

#[test]
fn unused_roots_end() {
    procs::isolated(&[("NCCL_BOOTSTRAP_TIMEOUT_MS", "1000")], &[], unused_roots);
}

fn unused_roots() {
    common::sim();
    // Devices and their stream threads live as long as the process: open them first.
    let dev = nccl::Device::open(0).expect("simulated device");
    // Threads of the tests before this one may still be ending: start from counts that held
    // still for 300 ms (at most 10 s), or the 50 roots' threads could hide among those ending.
    let now = || (count("/proc/self/task"), count("/proc/self/fd"));
    let (threads0, fds0) = {
        let (mut last, t) = (now(), Instant::now());
        while t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(300));
            let n = now();
            if n == last {
                break;
            }
            last = n;
        }
        last
    };
    let mut ids = Vec::new();
    for i in 0..50 {
        let id = common::loopback_id();
        if i % 10 == 0 {
            // An init that fails before its first message leaves its root unused.
            let e = Comm::init_rank_on(dev.clone(), 2, &id, 5).unwrap_err();
            assert_eq!(e.code, NcclResult::InvalidArgument, "{e}");
        }
        ids.push(id);
    }
    let (threads1, fds1) = (count("/proc/self/task"), count("/proc/self/fd"));
    assert!(
        threads1 >= threads0 + 50 && fds1 >= fds0 + 50,
        "50 roots running: threads {threads0} -> {threads1}, descriptors {fds0} -> {fds1}"
    );
    // Past the timeout, every root closed its listener and ended: wait for that.
    let t = Instant::now();
    procs::wait_until("every unused root ends", BOUND, || {
        count("/proc/self/task") <= threads0 && count("/proc/self/fd") <= fds0
    });
    eprintln!(
        "50 unused ids (NCCL_BOOTSTRAP_TIMEOUT_MS=1000): threads {threads0} -> {threads1}, \
         descriptors {fds0} -> {fds1}, back after {:?}",
        t.elapsed()
    );
    // An init on an id whose root ended fails within its own timeout (a rank cannot tell a
    // root that ended from one not started yet, so it retries until then).
    let e = procs::within("an init on an ended root", BOUND, move || {
        Comm::init_rank_on(dev, 1, &ids[1], 0).map(|_| ())
    })
    .unwrap_err();
    eprintln!("an init on an id whose root ended: {:?}: {e}", e.code);
    assert_eq!(e.code, NcclResult::RemoteError, "{e}");
}

/// Issue 23, failure 4, and issue 55: anyone who can reach a listener got a thread per
/// connection, then (64 at a time, 5 s each) held real ranks in the backlog. Now one thread
/// per listener challenges every connection and waits for its answer with poll, at most 256
/// from one address (1,024 in all), a newer one pushing out the oldest: 4,000 silent
/// connections held against the root, and then 4,000 against a rank's listener, with the
/// default deadlines, add no thread and a bounded number of descriptors, and a 16-rank init
/// and a first message go through while they are held.
#[test]
fn silent_connections_hold_few_threads() {
    procs::isolated(&[], &[], silent_connections);
}

/// Issue 55: 4,000 silent connections held against the root while 16 rank processes (2
/// simulated nodes of 8, so the socket network carries their traffic) create a communicator
/// through it and run an AllReduce; the root's process keeps its threads and descriptors
/// bounded meanwhile. The flood is held by the process of the root, which runs alone.
#[test]
fn sixteen_rank_processes_join_through_a_flood() {
    if let Some((rank, nranks, id)) = procs::child() {
        let comm = Comm::init_rank_on(common::sim_dev(rank % 8), nranks, &id, rank)
            .expect("init through the flood");
        let dev = comm.device().clone();
        let st = dev.stream_create().expect("stream");
        let buf = dev.alloc(4 * 1024).expect("buffer");
        let mine: Vec<u8> = (0..1024u32)
            .flat_map(|i| ((i + rank as u32) as f32).to_le_bytes())
            .collect();
        buf.write(0, &mine).expect("write");
        let (p, f32s, sum) = (buf.ptr(), nccl::DataType::Float32, nccl::ReduceOp::SUM);
        // SAFETY: `buf` holds 1024 floats and outlives the call (synchronized below).
        unsafe { comm.all_reduce_raw(p, p, 1024, f32s, sum, st) }.expect("all-reduce");
        dev.stream_sync(st).expect("sync");
        let mut got = vec![0u8; 4 * 1024];
        buf.read(0, &mut got).expect("read");
        let n = nranks as u32;
        for (i, w) in got.chunks(4).enumerate() {
            let want = (n * i as u32 + n * (n - 1) / 2) as f32;
            assert_eq!(
                f32::from_le_bytes(w.try_into().unwrap()),
                want,
                "element {i}"
            );
        }
        return;
    }
    procs::isolated(&[], &[], || {
        common::sim();
        common::allow_descriptors(20_000);
        let threads = || count("/proc/self/task");
        let fds = || count("/proc/self/fd");
        procs::run_nodes_holding(2, 8, &[common::LOOPBACK], &mut |id| {
            let (root, _) = id.decode().expect("a valid id");
            let (before, fds_before) = (threads(), fds());
            let flood: Vec<_> = (0..4000)
                .map(|_| std::net::TcpStream::connect(root).expect("connect to the root"))
                .collect();
            let (during, fds_during) = (threads(), fds());
            eprintln!(
                "4000 silent connections to the root: threads {before} -> {during}, \
                 descriptors {fds_before} -> {fds_during}"
            );
            assert!(
                during <= before + 2 && fds_during <= fds_before + 4000 + 1024 + 64,
                "threads {before} -> {during}, descriptors {fds_before} -> {fds_during}"
            );
            Box::new(flood)
        });
    });
}

fn silent_connections() {
    common::sim();
    common::allow_descriptors(20_000);
    let t = Duration::from_secs(60);
    let threads = || count("/proc/self/task");
    let fds = || count("/proc/self/fd");
    let flood_size = 4000;
    // A root under a flood before any rank arrives.
    let id = common::loopback_id();
    let (root, _) = id.decode().expect("a valid id");
    assert!(root.ip().is_loopback(), "{root}");
    let (before, fds_before) = (threads(), fds());
    let flood: Vec<_> = (0..flood_size)
        .map(|_| std::net::TcpStream::connect(root).expect("connect to the root"))
        .collect();
    let (during, fds_during) = (threads(), fds());
    eprintln!(
        "{flood_size} silent connections to a root: threads {before} -> {during}, descriptors \
         {fds_before} -> {fds_during} ({flood_size} of them the flood's own)"
    );
    assert!(
        during <= before + 2 && fds_during <= fds_before + flood_size + 1024 + 64,
        "threads {before} -> {during}, descriptors {fds_before} -> {fds_during}"
    );
    let start = Instant::now();
    let ranks: Vec<Bootstrap> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..16)
            .map(|r| {
                let id = &id;
                s.spawn(move || Bootstrap::init(id, r, 16, t).expect("init through the flood"))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    });
    eprintln!("16 ranks joined through the flood in {:?}", start.elapsed());
    drop(flood);
    // A rank's listener under a flood: rank 0 has no connection to rank 2 yet (the ring runs
    // 0 -> 1 -> 2 -> 0, the gather tree 1 -> 0, 2 -> 0), so its first send to rank 5 must get
    // through the flood.
    let target = ranks[5].peer_addresses()[5];
    let (before, fds_before) = (threads(), fds());
    let flood: Vec<_> = (0..flood_size)
        .map(|_| std::net::TcpStream::connect(target).expect("connect to rank 5"))
        .collect();
    let (during, fds_during) = (threads(), fds());
    eprintln!(
        "{flood_size} silent connections to a rank: threads {before} -> {during}, descriptors \
         {fds_before} -> {fds_during}"
    );
    assert!(
        during <= before + 2 && fds_during <= fds_before + flood_size + 1024 + 64,
        "threads {before} -> {during}, descriptors {fds_before} -> {fds_during}"
    );
    let start = Instant::now();
    ranks[0]
        .send(5, 5, b"through")
        .expect("send through the flood");
    assert_eq!(ranks[5].recv(0, 5).expect("recv"), b"through");
    eprintln!(
        "a message through {flood_size} silent connections: {:?}",
        start.elapsed()
    );
    drop(flood);
}
