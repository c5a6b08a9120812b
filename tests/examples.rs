//! Every program in `examples/` runs on the simulator and reports a correct result. `cargo test`
//! builds the examples before it runs the tests; this test runs the binaries it built.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const EXAMPLES: &[&str] = &[
    "one_device_per_process",
    "one_device_per_thread",
    "several_devices_per_thread",
    "split",
    "all_to_all",
    "graph_capture",
    "user_buffer_registration",
];

/// `target/<profile>/examples/NAME`, beside this test's `target/<profile>/deps/`.
fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary lives in target/<profile>/deps");
    profile_dir.join("examples").join(name)
}

#[test]
fn examples_run_on_the_simulator() {
    let mut failed = Vec::new();
    for name in EXAMPLES {
        let path = binary(name);
        assert!(
            path.exists(),
            "{} is missing: `cargo test` builds the examples (or run `cargo build --examples`)",
            path.display()
        );
        let mut child = Command::new(&path)
            .env("NCCL_RS_BACKEND", "sim")
            // The ranks' bootstrap stays on this machine's loopback.
            .env("NCCL_SOCKET_IFNAME", "lo")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", path.display()));
        let deadline = Instant::now() + Duration::from_secs(120);
        let status = loop {
            if let Some(s) = child.try_wait().expect("waiting for an example") {
                break Some(s);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let out = child.wait_with_output().expect("the example's output");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        match status {
            Some(s) if s.success() && stdout.contains("correct") => {}
            _ => failed.push(format!(
                "{name} ({status:?}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
            )),
        }
    }
    assert!(failed.is_empty(), "examples failed:\n{}", failed.join("\n"));
}
