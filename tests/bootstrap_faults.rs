//! Issue 23, failure 7: bootstrap waits after init take their bound from the environment
//! (`NCCL_RS_BOOTSTRAP_OP_TIMEOUT_MS`). Loopback only (NCCL_SOCKET_IFNAME=lo).

use nccl::bootstrap::Bootstrap;
use nccl::Backend;
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
    assert!(
        elapsed >= Duration::from_millis(400) && elapsed < Duration::from_secs(3),
        "the wait took {elapsed:?} with NCCL_RS_BOOTSTRAP_OP_TIMEOUT_MS=500: {e}"
    );
}
