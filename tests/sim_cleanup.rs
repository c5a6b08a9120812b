//! The simulator removes device memory that dead processes left in /dev/shm, and only theirs.
//! (A binary of its own: the sweep runs once per process, at the first device opened.)

use nccl::Backend;
use std::path::Path;

#[test]
fn regions_of_dead_processes_are_removed() {
    if !Path::new("/dev/shm").is_dir() {
        return; // no POSIX shared memory directory: nothing is left behind there either
    }
    // A pid that existed and is gone now.
    let mut child = std::process::Command::new("true")
        .spawn()
        .expect("run `true`");
    let dead = child.id();
    child.wait().expect("wait for `true`");
    let stale = format!("/dev/shm/ncclrs-{dead}-0-1");
    let live = format!("/dev/shm/ncclrs-{}-0-999999", std::process::id());
    std::fs::write(&stale, b"left behind").expect("plant a stale region");
    std::fs::write(&live, b"ours").expect("plant a live region");
    nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
    let _dev = nccl::Device::open(0).expect("open a simulated device");
    let stale_left = Path::new(&stale).exists();
    let live_left = Path::new(&live).exists();
    let _ = std::fs::remove_file(&stale);
    let _ = std::fs::remove_file(&live);
    assert!(!stale_left, "{stale} of a dead process was kept");
    assert!(live_left, "{live} of a live process was removed");
}
