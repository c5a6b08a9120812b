//! The examples' ranks on the simulator: as threads of this process (their rank functions),
//! and as processes (the example binaries `cargo test` built).

use nccl::{Backend, Comm, Module};
use nccl_device_api_examples::{all_reduce, copy_rate, fused, misuse, moe, RankBody};
use std::path::PathBuf;
use std::process::Command;

/// `body` on `n` simulated GPUs, a thread per rank.
fn on_threads(n: usize, body: RankBody) {
    nccl::cuda::set_backend(Backend::Sim).unwrap();
    let comms = Comm::init_all(&(0..n as i32).collect::<Vec<_>>()).unwrap();
    std::thread::scope(|s| {
        for comm in comms {
            s.spawn(move || {
                let module = Module::load(comm.device(), nccl_device_api_examples::PTX).unwrap();
                body(&comm, &module).unwrap_or_else(|e| panic!("{e}"));
            });
        }
    });
}

#[test]
fn one_shot_all_reduce_on_2_4_and_8_ranks() {
    for n in [2, 4, 8] {
        on_threads(n, all_reduce::rank);
    }
}

#[test]
fn fused_all_reduce_scale_add_on_1_and_3_ranks() {
    for n in [1, 3] {
        on_threads(n, fused::rank);
    }
}

#[test]
fn moe_dispatch_and_combine_on_2_and_3_ranks_of_one_node() {
    for n in [2, 3] {
        on_threads(n, moe::rank);
    }
}

#[test]
fn the_copy_ceilings_copy_every_word() {
    on_threads(1, copy_rate::rank);
}

#[test]
fn a_kernel_s_misuse_is_reported_on_every_rank() {
    on_threads(2, misuse::rank);
}

/// `target/<profile>/examples/NAME`, beside this test's `target/<profile>/deps/`.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>/deps");
    profile.join("examples").join(name)
}

/// `cmd`'s output; a run past the limit (a hang: minutes where seconds are needed) is killed,
/// its rank processes with it (their process group), and fails the test.
fn output_within(mut cmd: Command, what: &str) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    let limit = std::time::Duration::from_secs(600);
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let child = cmd.spawn().unwrap();
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(limit) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            // SAFETY: kill(2) of the process group this test started.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            panic!("{what}: still running after {limit:?}, killed");
        }
    }
}

#[test]
fn the_examples_run_as_rank_processes() {
    let cases: [(&str, &[&str]); 6] = [
        ("all_reduce", &["3"]),
        ("misuse", &["2"]),
        ("fused", &["2"]),
        // Across nodes: every put but a rank's own through GIN.
        ("moe", &["2", "--nodes", "2"]),
        ("moe", &["4", "--nodes", "2"]),
        // Its sizes capped below (the benchmark's numbers mean nothing on the simulator).
        ("put_bench", &["2", "--nodes", "2"]),
    ];
    for (name, args) in cases {
        let path = example(name);
        assert!(
            path.exists(),
            "{} is missing: `cargo test` builds it",
            path.display()
        );
        let mut cmd = Command::new(&path);
        cmd.args(args)
            .arg("--processes")
            .env("NCCL_RS_BACKEND", "sim")
            .env("GIN_BENCH_MAX_BYTES", "65536")
            // The ranks' bootstrap stays on this machine's loopback.
            .env("NCCL_SOCKET_IFNAME", "lo");
        let out = output_within(cmd, &format!("{name} {args:?}"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("correct on every rank"),
            "{name} {args:?}: {:?}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
