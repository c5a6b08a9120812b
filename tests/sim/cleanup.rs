//! The simulator removes device memory that dead processes of its pid namespace left in
//! /dev/shm, and only theirs.
//! (A child process of its own: the sweep runs once per process, at the first device opened.)

use crate::common;
use std::path::Path;

#[test]
fn regions_of_dead_processes_are_removed() {
    if !Path::new("/dev/shm").is_dir() {
        // No POSIX shared memory directory: nothing is left behind there either.
        common::skip::record("no /dev/shm here", "regions_of_dead_processes_are_removed");
        return;
    }
    common::procs::isolated(&[], &[], sweep);
}

fn sweep() {
    // A pid that existed and is gone now.
    let mut child = std::process::Command::new("true")
        .spawn()
        .expect("run `true`");
    let dead = child.id();
    child.wait().expect("wait for `true`");
    use std::os::unix::fs::MetadataExt;
    let ns = std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino());
    let stale = format!("/dev/shm/ncclrs-{dead}@{ns}-0-1");
    let legacy = format!("/dev/shm/ncclrs-{dead}-0-2");
    // The same dead pid in another pid namespace may be a live process there.
    let foreign = format!("/dev/shm/ncclrs-{dead}@{}-0-3", ns + 1);
    let live = format!("/dev/shm/ncclrs-{}@{ns}-0-999999", std::process::id());
    for (path, what) in [
        (&stale, "stale"),
        (&legacy, "legacy"),
        (&foreign, "foreign"),
        (&live, "live"),
    ] {
        std::fs::write(path, what).unwrap_or_else(|e| panic!("plant a {what} region: {e}"));
    }
    let _dev = common::sim_dev(0);
    let left: Vec<bool> = [&stale, &legacy, &foreign, &live]
        .iter()
        .map(|p| {
            let there = Path::new(p).exists();
            let _ = std::fs::remove_file(p);
            there
        })
        .collect();
    assert!(!left[0], "{stale} of a dead process was kept");
    assert!(
        left[1],
        "{legacy} (no namespace: maybe another container's live process) was removed"
    );
    assert!(left[2], "{foreign} of another pid namespace was removed");
    assert!(left[3], "{live} of a live process was removed");
}
