//! Every program in `examples/` runs on the simulator and reports a correct result. `cargo test`
//! builds the examples before it runs the tests; this test runs the binaries it built.

use crate::common::{self, procs};
use std::path::PathBuf;
use std::process::Command;

/// Each example, and the kernels it runs (an example whose kernels this build left out, by
/// NCCL_RS_KERNELS, is skipped visibly).
const EXAMPLES: &[(&str, &[&str])] = &[
    ("one_device_per_process", &["nccl_all_reduce_float_sum"]),
    ("one_device_per_thread", &["nccl_all_reduce_int64_max"]),
    (
        "several_devices_per_thread",
        &["nccl_all_reduce_double_avg"],
    ),
    ("split", &["nccl_all_reduce_uint32_sum"]),
    ("all_to_all", &["nccl_p2p"]),
    ("graph_capture", &["nccl_all_reduce_double_sum"]),
    (
        "user_buffer_registration",
        &["nccl_all_gather", "nccl_all_reduce_bfloat16_sum"],
    ),
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
    for &(name, kernels) in EXAMPLES {
        let missing: Vec<&str> = kernels
            .iter()
            .copied()
            .filter(|k| !nccl_device::kernel_set::built(k))
            .collect();
        if !missing.is_empty() {
            common::skip::record(
                common::skip::LEFT_OUT,
                &format!("example {name} ({missing:?})"),
            );
            continue;
        }
        let path = binary(name);
        assert!(
            path.exists(),
            "{} is missing: `cargo test` builds the examples (or run `cargo build --examples`)",
            path.display()
        );
        let mut cmd = Command::new(&path);
        cmd.env("NCCL_RS_BACKEND", "sim")
            // The ranks' bootstrap stays on this machine's loopback.
            .env("NCCL_SOCKET_IFNAME", "lo");
        let out = procs::Supervisor::output(name, cmd, procs::limit());
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        let status = out.status;
        match status {
            s if s.success() && stdout.contains("correct") => {}
            _ => failed.push(format!(
                "{name} ({status:?}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
            )),
        }
    }
    assert!(failed.is_empty(), "examples failed:\n{}", failed.join("\n"));
}
