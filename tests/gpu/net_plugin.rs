//! Network plugins on a real GPU (issue 21): the C test plugin (`tests/c/plugins/net_plugin_tcp.c`,
//! TCP over 127.0.0.1), compiled here with `cc`, carries the traffic between 2 rank processes
//! that are 2 nodes (`NCCL_HOSTID` each) on one GPU (`NCCL_RS_SHARED_GPUS=1`, start the MPS
//! daemon first) or on two. Ignored where there is no GPU (run them on the GPU host through
//! the GPU bundle (docs/gpu-hosts.md), which passes --include-ignored).
//!
//! - The CUDA flavour (`-DCUDA_PTR -DDMABUF`) takes CUDA pointers for real: it loads the CUDA
//!   driver and copies device memory through it (cuMemcpy*Async on a stream of its own), and
//!   asks the driver whether each region registered as CUDA memory is device memory. With
//!   `NCCL_NET_GDR_LEVEL=SYS` every FIFO is then GPU memory (GPU Direct RDMA placement,
//!   registered with regMr, or regMrDmaBuf where the driver exports dmabufs), and the plugin's
//!   counters prove it: every GPU registration confirmed device memory by the driver, every
//!   receive posted into it, bytes copied both ways, no call made without the GPU's context
//!   current on the calling (proxy) thread. With `NCCL_NET_FORCE_FLUSH=1`, Simple steps are
//!   flushed and LL / LL128 steps never (ring collectives with each protocol forced).
//! - A flavour with maxRecvs 4 groups receives: the send/recv connections between the two ranks
//!   share one comm per direction and the receiving proxy posts several steps in one irecv
//!   (kernels on blocking streams there: the plugin's copies must not wait for them).
//! - The host-memory flavour: FIFOs in pinned host memory, nothing registered as CUDA memory,
//!   no flush, no copy through the driver; single and grouped receives.
//!
//! Every run: every collective in and out of place with random data and poisoned outputs, and
//! all-to-alls and ring shifts of send/recv (not where a protocol is forced: send/recv steps are
//! Simple); each rank checks its results, its NCCL_DEBUG=INFO log and its plugin's counters.
//!
//! The plugin's source and `include/` are found through `NCCL_RS_SOURCE_DIR`, else the
//! directory this test was built in, else the current directory (the GPU host runs the bundled
//! binary from a copy of the working tree).

use crate::common::{self, check_collective, Drive, Ranks};
use nccl::{Backend, Comm, DataType, ReduceOp};
use nccl_device::abi::Coll;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

const PLUGIN_SRC: &str = "tests/c/plugins/net_plugin_tcp.c";
/// Where the child's FIFOs must be: "gpu" or "host".
const EXPECT_PLACE: &str = "GPU_PLUGIN_TEST_PLACE";
/// The child's flushes: "none" or "some".
const EXPECT_FLUSHES: &str = "GPU_PLUGIN_TEST_FLUSHES";
/// The plugin's maxRecvs (1: no grouped receive may happen; more: some must).
const EXPECT_MAX_RECVS: &str = "GPU_PLUGIN_TEST_MAX_RECVS";
/// Set: the child's streams are blocking ones.
const BLOCKING: &str = "GPU_PLUGIN_TEST_BLOCKING";
/// The plugin's counters file (its own variable; `.<pid>` is appended).
const STATS: &str = "TEST_PLUGIN_STATS";
/// Set: a dry run of these tests' logic on the CPU simulator (for their authors: the CUDA
/// flavour then copies the simulator's GPU memory as host memory, or goes through a stand-in
/// libcuda.so.1 found on the loader's path). Never a GPU result.
const ON_SIM: &str = "NCCL_RS_GPU_TEST_ON_SIM";
/// The network's name in every flavour.
const NET: &str = "TestTCP";

/// The test's folder of plugins, logs and counters.
fn dir() -> PathBuf {
    common::plugins::scratch("gpu-net-plugin")
}

/// Compiles the test plugin with `defines` into `dir()/file`.
fn build(file: &str, defines: &[&str]) -> PathBuf {
    common::plugins::shared_library(PLUGIN_SRC, &dir().join(file), defines)
}

/// The devices of `n` ranks: rank r on GPU r, or on GPU r % visible with NCCL_RS_SHARED_GPUS=1
/// (stderr says so).
fn device_of(rank: usize, n: usize) -> i32 {
    if std::env::var_os(ON_SIM).is_some() {
        eprintln!("{ON_SIM}: a dry run on the CPU simulator, not a GPU run");
        nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
        return rank as i32;
    }
    nccl::cuda::set_backend(Backend::Cuda).expect("choose the CUDA backend");
    let have = nccl::cuda::device_count().unwrap_or_else(|e| panic!("no GPUs: {e}"));
    if std::env::var("NCCL_RS_SHARED_GPUS").is_ok_and(|v| v.trim() == "1") && have < n {
        eprintln!("NCCL_RS_SHARED_GPUS=1: {n} ranks share {have} GPU(s)");
        return (rank % have.max(1)) as i32;
    }
    assert!(
        have >= n,
        "this test needs {n} GPUs, {have} visible (or NCCL_RS_SHARED_GPUS=1)"
    );
    rank as i32
}

/// This process's log so far.
fn own_log() -> String {
    let path = std::env::var("NCCL_DEBUG_FILE")
        .expect("NCCL_DEBUG_FILE set by the parent")
        .replace("%p", &std::process::id().to_string());
    std::fs::read_to_string(&path).unwrap_or_default()
}

fn assert_log_has(log: &str, what: &str) {
    assert!(
        log.contains(what),
        "the log lacks {what:?}; it reads:\n{log}"
    );
}

/// This process's plugin counters (written at each comm close), by name.
fn plugin_stats() -> HashMap<String, u64> {
    let path = format!(
        "{}.{}",
        std::env::var(STATS).expect("the stats path set by the parent"),
        std::process::id()
    );
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("the plugin's counters {path}: {e}"));
    text.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().expect("a count")))
        .collect()
}

/// Every collective (in and out of place, three sizes, varied types), with random data and
/// poisoned outputs, then (where `p2p`) all-to-alls of send/recv.
fn traffic(ranks: &Ranks, seed: u64, p2p: bool) {
    let n = ranks.comms[0].count();
    let t0 = std::time::Instant::now();
    for (i, coll) in Coll::ALL.into_iter().enumerate() {
        for (j, count) in [37usize, 40_000, (1 << 20) + 5].into_iter().enumerate() {
            let (dt, op) = [
                (DataType::Float32, ReduceOp::SUM),
                (DataType::Int32, ReduceOp::MAX),
                (DataType::Bfloat16, ReduceOp::SUM),
                (DataType::Int64, ReduceOp::PROD),
            ][(i + j) % 4];
            for in_place in [false, true] {
                // Progress, shown if the harness kills a rank that is stuck.
                eprintln!(
                    "[{:?}] {} count {count} in_place {in_place}",
                    t0.elapsed(),
                    coll.name()
                );
                check_collective(
                    ranks,
                    coll,
                    count,
                    dt,
                    op,
                    (i + j) % n,
                    in_place,
                    seed + (i * 10 + j) as u64,
                    Drive::OneThread,
                )
                .unwrap_or_else(|e| panic!("{} count {count}: {e}", coll.name()));
            }
        }
    }
    if !p2p {
        return;
    }
    for scale in [1usize, 100_000] {
        eprintln!("[{:?}] all-to-all scale {scale}", t0.elapsed());
        common::check_all_to_all(ranks, scale, Drive::OneThread)
            .unwrap_or_else(|e| panic!("all-to-all at scale {scale}: {e}"));
    }
    // Every rank sends to the next and receives from the previous: many steps in flight on
    // every connection at once (what grouped receives gather).
    for (i, count) in [3usize, 250_000, 4 << 20].into_iter().enumerate() {
        eprintln!("[{:?}] ring shift of {count} i32", t0.elapsed());
        common::check_ring_shift(ranks, count, seed + 100 + i as u64);
    }
}

/// A rank process: its communicator through the plugin, traffic, then its log and counters
/// against what the parent said to expect. False in the parent.
fn child(seed: u64) -> bool {
    let Some((rank, nranks, id)) = common::procs::child() else {
        return false;
    };
    nccl::init_logging();
    let dev = nccl::Device::open(device_of(rank, nranks)).expect("open the GPU");
    let comm = Comm::init_rank_on(dev, nranks, &id, rank)
        .unwrap_or_else(|e| panic!("rank {rank}: init across nodes through the plugin: {e}"));
    let ranks = if std::env::var_os(BLOCKING).is_some() {
        Ranks::blocking(vec![comm])
    } else {
        Ranks::new(vec![comm])
    };
    // A forced protocol is the tuner's choice for every collective.
    if let Ok(p) = std::env::var("NCCL_PROTO") {
        let want = match p.as_str() {
            "LL" => nccl::Proto::Ll,
            "LL128" => nccl::Proto::Ll128,
            _ => nccl::Proto::Simple,
        };
        for coll in nccl::Coll::ALL {
            let choice = ranks.comms[0]
                .tuning(coll, 4 << 20)
                .expect("the tuner's choice");
            assert_eq!(choice.proto, want, "{coll:?}: {choice:?}");
        }
    }
    // Send/recv steps are Simple whatever NCCL_PROTO says: with a protocol forced, the
    // flushes counted must be the collectives' own.
    traffic(&ranks, seed, std::env::var_os("NCCL_PROTO").is_none());
    let log = own_log();
    let mut ranks = ranks;
    for s in std::mem::take(&mut ranks.streams) {
        let _ = ranks.comms[0].device().stream_destroy(s);
    }
    for c in std::mem::take(&mut ranks.comms) {
        c.destroy().expect("destroy");
    }
    check_expectations(&log);
    true
}

/// The log's and the counters' story against the parent's expectations.
fn check_expectations(log: &str) {
    assert_log_has(
        log,
        &format!("Loaded net plugin {NET} (ncclNetPlugin_v11) from /"),
    );
    assert_log_has(
        log,
        &format!("NET/Plugin: Using network {NET} (ncclNetPlugin_v11"),
    );
    assert_log_has(log, &format!("via NET/{NET}/0"));
    // No FIFO fell back to host memory for want of GPU memory or a registration.
    assert!(!log.contains("GPU memory for its FIFO failed"), "{log}");
    let st = plugin_stats();
    let get = |k: &str| *st.get(k).unwrap_or_else(|| panic!("no {k} in {st:?}"));
    eprintln!("plugin counters: {st:?}");
    assert_eq!(get("flush_host"), 0, "{st:?}");
    assert_eq!(
        get("no_ctx"),
        0,
        "a plugin call without the GPU's context current: {st:?}"
    );
    match std::env::var(EXPECT_PLACE)
        .expect("expected placement")
        .as_str()
    {
        "gpu" => {
            assert_log_has(log, &format!("{NET}: CUDA driver loaded"));
            for side in ["send", "receive"] {
                assert_log_has(log, &format!("[{side}] via NET/{NET}/0/GDRDMA"));
            }
            assert_log_has(log, "GPU Direct RDMA on");
            // Every FIFO is device memory, and the driver said so of every registration: none
            // as host memory, every receive posted into GPU memory, bytes moved both ways.
            assert_eq!(get("reg_host"), 0, "{st:?}");
            assert!(get("reg_gpu") > 0, "{st:?}");
            assert_eq!(
                get("reg_gpu"),
                get("reg_cuda") + get("reg_dmabuf"),
                "{st:?}"
            );
            assert!(get("recv_cuda") > 0 && get("recv_host") == 0, "{st:?}");
            assert!(get("copy_dtoh") > 0 && get("copy_htod") > 0, "{st:?}");
        }
        "host" => {
            assert!(!log.contains("GDRDMA"), "GPU Direct RDMA used:\n{log}");
            assert!(get("reg_host") > 0, "{st:?}");
            assert_eq!(
                get("reg_cuda") + get("reg_dmabuf") + get("reg_gpu"),
                0,
                "{st:?}"
            );
            assert!(get("recv_host") > 0 && get("recv_cuda") == 0, "{st:?}");
            assert_eq!(get("copy_dtoh") + get("copy_htod"), 0, "{st:?}");
        }
        other => panic!("unknown placement {other}"),
    }
    match std::env::var(EXPECT_FLUSHES)
        .expect("expected flushes")
        .as_str()
    {
        "none" => assert_eq!(get("flush_cuda"), 0, "steps were flushed: {st:?}"),
        _ => {
            assert!(get("flush_cuda") > 0, "no step was flushed: {st:?}");
            assert!(get("flush_cuda") <= get("recv_cuda"), "{st:?}");
        }
    }
    let max: u64 = std::env::var(EXPECT_MAX_RECVS)
        .expect("expected maxRecvs")
        .parse()
        .expect("a number");
    assert!(get("recv_max_n") <= max, "{st:?}");
    if max > 1 {
        // The send/recv connections to the peer share one comm per direction, and several
        // of their steps were posted in one irecv.
        assert_log_has(log, "receive connections with rank");
        assert_log_has(log, &format!("share one comm (maxRecvs {max})"));
        assert!(
            get("recv_multi") > 0,
            "no grouped receive was posted: {st:?}"
        );
    } else {
        assert_eq!(get("recv_multi"), 0, "{st:?}");
    }
}

/// Runs the test's 2 rank processes as 2 nodes through plugin `so`, logs and counters under
/// `name`, with `more` environment.
fn run(so: &Path, name: &str, more: &[(&str, &str)]) {
    let logs = dir().join(name);
    std::fs::create_dir_all(&logs).expect("log folder");
    let log_file = logs.join("rank-%p.log").to_string_lossy().into_owned();
    let stats = logs.join("stats").to_string_lossy().into_owned();
    let mut env: Vec<(&str, &str)> = vec![
        ("NCCL_SOCKET_IFNAME", "lo"),
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_DEBUG_SUBSYS", "INIT,NET"),
        ("NCCL_DEBUG_FILE", &log_file),
        ("NCCL_NET_PLUGIN", so.to_str().expect("utf-8 path")),
        ("NCCL_NET", NET),
        (STATS, &stats),
    ];
    env.extend_from_slice(more);
    eprintln!("{}: {name}", common::procs::current_test());
    common::procs::run_nodes(2, 1, &env);
}

/// The CUDA flavour (a helper thread per comm, as benchmarked) with GPU Direct RDMA allowed and
/// flushes forced: ring collectives with LL, LL128 and Simple forced; FIFOs in GPU memory
/// copied through the driver, only Simple steps flushed.
#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn cuda_pointer_plugin_on_gpu_flushes_simple_steps_only() {
    if child(21) {
        return;
    }
    // The flavour tools/gpu-plugin-bench.sh measures: a helper thread per comm.
    let so = build(
        "libgpu-cuda.so",
        &["NET_VERSION=11", "CUDA_PTR", "DMABUF", "HELPER_THREAD"],
    );
    for (proto, flushes) in [("LL", "none"), ("LL128", "none"), ("Simple", "some")] {
        run(
            &so,
            &format!("cuda-{proto}"),
            &[
                ("NCCL_NET_GDR_LEVEL", "SYS"),
                ("NCCL_NET_FORCE_FLUSH", "1"),
                ("NCCL_ALGO", "Ring"),
                ("NCCL_PROTO", proto),
                (EXPECT_PLACE, "gpu"),
                (EXPECT_FLUSHES, flushes),
                (EXPECT_MAX_RECVS, "1"),
            ],
        );
    }
}

/// The CUDA flavour with maxRecvs 4: 4 send/recv connections to the peer share one comm per
/// direction, receives are grouped; the tuner's own choices; kernels on blocking streams.
#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn cuda_pointer_plugin_on_gpu_groups_receives() {
    if child(22) {
        return;
    }
    let so = build(
        "libgpu-cuda-grp4.so",
        &["NET_VERSION=11", "CUDA_PTR", "DMABUF", "MAX_RECVS=4"],
    );
    run(
        &so,
        "cuda-grp4",
        &[
            ("NCCL_NET_GDR_LEVEL", "SYS"),
            ("NCCL_NET_FORCE_FLUSH", "1"),
            ("NCCL_RS_P2P_CONNS", "4"),
            ("NCCL_RS_SIM_P2P_CONNS", "4"), // the same in a dry run on the simulator
            // Small send/recv steps: many per connection and message.
            ("NCCL_P2P_NVL_CHUNKSIZE", "4096"),
            (BLOCKING, "1"),
            (EXPECT_PLACE, "gpu"),
            (EXPECT_FLUSHES, "some"),
            (EXPECT_MAX_RECVS, "4"),
        ],
    );
}

/// The host-memory flavour, single receives (with a helper thread per comm, as benchmarked) and
/// grouped ones: FIFOs in host memory, nothing registered as GPU memory, no flush, no copy
/// through the driver.
#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn host_memory_plugin_on_gpu() {
    if child(23) {
        return;
    }
    let single = build("libgpu-host.so", &["NET_VERSION=11", "HELPER_THREAD"]);
    let grouped = build("libgpu-host-grp4.so", &["NET_VERSION=11", "MAX_RECVS=4"]);
    run(
        &single,
        "host-1",
        &[
            (EXPECT_PLACE, "host"),
            (EXPECT_FLUSHES, "none"),
            (EXPECT_MAX_RECVS, "1"),
        ],
    );
    run(
        &grouped,
        "host-grp4",
        &[
            ("NCCL_RS_P2P_CONNS", "4"),
            ("NCCL_RS_SIM_P2P_CONNS", "4"),
            ("NCCL_P2P_NVL_CHUNKSIZE", "4096"),
            (EXPECT_PLACE, "host"),
            (EXPECT_FLUSHES, "none"),
            (EXPECT_MAX_RECVS, "4"),
        ],
    );
}
