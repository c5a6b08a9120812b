//! Issue 23, failures 3 and 7: bootstrap waits after init take their bound from the environment
//! (`NCCL_RS_BOOTSTRAP_OP_TIMEOUT_MS`), and a unique id whose root is never used (or whose init
//! failed before its first message) does not keep its thread and socket for ever: the root
//! gives up after `NCCL_BOOTSTRAP_TIMEOUT_MS`. Loopback only (NCCL_SOCKET_IFNAME=lo).

use nccl::bootstrap::Bootstrap;
use nccl::{Backend, Comm, NcclResult};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The tests here change the environment and count the process's threads: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn setup() -> std::sync::MutexGuard<'static, ()> {
    let g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
    g
}

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

/// Runs `f` on its own thread; fails the test if it takes longer than `limit`.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("no answer within {limit:?}"))
}

#[test]
fn op_timeout_comes_from_the_environment() {
    let _g = setup();
    std::env::set_var("NCCL_RS_BOOTSTRAP_OP_TIMEOUT_MS", "500");
    let id = nccl::get_unique_id().expect("unique id");
    let peer = std::thread::spawn(move || {
        let b = Bootstrap::init(&id, 1, 2, Duration::from_secs(10)).expect("rank 1 init");
        // Stays alive, silent, until rank 0 is done waiting for it.
        std::thread::sleep(Duration::from_secs(3));
        drop(b);
    });
    let (elapsed, r) = within(Duration::from_secs(20), move || {
        let b = Bootstrap::init(&id, 0, 2, Duration::from_secs(10)).expect("rank 0 init");
        let t = Instant::now();
        let r = b.recv(1, 7); // rank 1 never sends
        (t.elapsed(), r.map(|_| ()))
    });
    std::env::remove_var("NCCL_RS_BOOTSTRAP_OP_TIMEOUT_MS");
    peer.join().unwrap();
    let e = r.expect_err("a receive nobody answers must time out");
    eprintln!(
        "a receive nobody answers (NCCL_RS_BOOTSTRAP_OP_TIMEOUT_MS=500): {:?} after {elapsed:?}: {e}",
        e.code
    );
    assert!(
        elapsed >= Duration::from_millis(400) && elapsed < Duration::from_secs(3),
        "the wait took {elapsed:?} with NCCL_RS_BOOTSTRAP_OP_TIMEOUT_MS=500: {e}"
    );
}

#[test]
fn unused_roots_end() {
    let _g = setup();
    std::env::set_var("NCCL_BOOTSTRAP_TIMEOUT_MS", "1000");
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
        let id = nccl::get_unique_id().expect("unique id");
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
    // Past the timeout, every root closed its listener and ended.
    let t = Instant::now();
    let (mut threads, mut fds) = (threads1, fds1);
    while t.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(100));
        (threads, fds) = (count("/proc/self/task"), count("/proc/self/fd"));
        if threads <= threads0 && fds <= fds0 {
            break;
        }
    }
    eprintln!(
        "50 unused ids (NCCL_BOOTSTRAP_TIMEOUT_MS=1000): threads {threads0} -> {threads1} -> \
         {threads}, descriptors {fds0} -> {fds1} -> {fds}, {:?} after the last id was made",
        t.elapsed()
    );
    assert!(
        threads <= threads0 && fds <= fds0,
        "{:?} after the 1 s timeout: threads {threads0} -> {threads}, descriptors {fds0} -> {fds} \
         (with 50 roots: {threads1}, {fds1})",
        t.elapsed()
    );
    // An init on an id whose root ended fails within its own timeout (a rank cannot tell a
    // root that ended from one not started yet, so it retries until then).
    let e = within(Duration::from_secs(20), move || {
        Comm::init_rank_on(dev, 1, &ids[1], 0).map(|_| ())
    })
    .unwrap_err();
    std::env::remove_var("NCCL_BOOTSTRAP_TIMEOUT_MS");
    assert_ne!(e.code, NcclResult::Success, "{e}");
}

/// Issue 23, failure 4: anyone who can reach a listener got a thread per connection. Now at
/// most 64 connections are in their handshake at once (the rest wait in the kernel's backlog)
/// and each has `NCCL_RS_BOOTSTRAP_HANDSHAKE_MS` to greet: 300 silent connections to a rank's
/// listener and 300 to a root hold a bounded number of threads, and the ranks still get
/// through once the silent ones are dropped.
#[test]
fn silent_connections_hold_few_threads() {
    let _g = setup();
    std::env::set_var("NCCL_RS_BOOTSTRAP_HANDSHAKE_MS", "300");
    let t = Duration::from_secs(30);
    let threads = || count("/proc/self/task");
    // A root under a flood before any rank arrives.
    let id = nccl::get_unique_id().expect("unique id");
    let (root, _) = id.decode().expect("a valid id");
    assert!(root.ip().is_loopback(), "{root}");
    let before = threads();
    let flood: Vec<_> = (0..300)
        .map(|_| std::net::TcpStream::connect(root).expect("connect to the root"))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let during = threads();
    eprintln!("300 silent connections to a root: threads {before} -> {during}");
    assert!(
        during <= before + 64 + 4,
        "300 silent connections to a root: threads {before} -> {during}"
    );
    let ranks: Vec<Bootstrap> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|r| {
                let id = &id;
                s.spawn(move || Bootstrap::init(id, r, 3, t).expect("init through the flood"))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    });
    drop(flood);
    // A rank's listener under a flood: rank 0 has no connection to rank 2 yet (the ring runs
    // 0 -> 1 -> 2 -> 0), so its first send must get through the flood.
    let target = ranks[2].peer_addresses()[2];
    let before = threads();
    let flood: Vec<_> = (0..300)
        .map(|_| std::net::TcpStream::connect(target).expect("connect to rank 2"))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let during = threads();
    eprintln!("300 silent connections to a rank: threads {before} -> {during}");
    assert!(
        during <= before + 64 + 4,
        "300 silent connections to a rank: threads {before} -> {during}"
    );
    let start = Instant::now();
    ranks[0]
        .send(2, 5, b"through")
        .expect("send through the flood");
    assert_eq!(ranks[2].recv(0, 5).expect("recv"), b"through");
    eprintln!(
        "a message through 300 silent connections: {:?}",
        start.elapsed()
    );
    drop(flood);
    std::env::remove_var("NCCL_RS_BOOTSTRAP_HANDSHAKE_MS");
}
