//! NCCL network plugins (NCCL_NET_PLUGIN, NCCL_NET) on the CPU simulator: a plugin written for
//! these tests in C (`tests/c/plugins/net_plugin_tcp.c`, TCP over 127.0.0.1, host memory) is compiled
//! here with the system `cc` in several flavours, and rank processes with their own
//! `NCCL_HOSTID` (nodes) reach each other through it. Each rank checks its results and its own
//! NCCL_DEBUG=INFO log: which file and version were loaded, the devices, the plugin's own
//! (printf-formatted) lines, the network its connections use, v11's context finalized.
//!
//! Failure cases: a plugin whose init fails and one without a table are skipped for the next
//! network; NCCL_NET naming no loaded network fails init with the list of loaded networks.
//!
//! GPU Direct RDMA: a flavour of the plugin claims NCCL_PTR_CUDA (the simulator's GPU memory is
//! host memory, so it copies it as is) and counts, in a file per process, its registrations by
//! memory type, its receives into GPU and host regions and its flushes. Where
//! NCCL_NET_GDR_LEVEL allows, every FIFO is GPU memory and received Simple steps are flushed
//! (where asked: NCCL_NET_FORCE_FLUSH or forceFlush, the simulator being a compute capability
//! 9.0 GPU), LL and LL128 steps never; where it forbids, host memory and no flush. A plugin's
//! speed moves the tuner's choice.
//!
//! Grouped receives: a flavour with maxRecvs 4 matches tags and groups receives; the send/recv
//! connections between two ranks then share one comm per direction, and the receiving proxy
//! posts several connections' awaited steps in one irecv.

mod common;

use common::{check_collective, Drive, Ranks};
use nccl::{Backend, Comm, DataType, ReduceOp};
use nccl_device::abi::Coll;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Loopback only: tests never leave this machine.
const LOOPBACK: (&str, &str) = ("NCCL_SOCKET_IFNAME", "lo");
/// What a child expects: the network's name, and the plugin version (0: the socket network).
const EXPECT_NET: &str = "PLUGIN_TEST_NET";
const EXPECT_VERSION: &str = "PLUGIN_TEST_VERSION";
/// A child expecting init to fail: text its error must contain.
const EXPECT_INIT_ERROR: &str = "PLUGIN_TEST_INIT_ERROR";
/// Text the child's log must contain ('|'-separated).
const EXPECT_LOG: &str = "PLUGIN_TEST_LOG";
/// The pointer support the child's log must name (default HOST).
const EXPECT_PTR: &str = "PLUGIN_TEST_PTR";
/// Where the FIFOs must be: "gpu-flush", "gpu" (no flush) or "host".
const EXPECT_PLACE: &str = "PLUGIN_TEST_PLACE";
/// The plugin's counters file (its own variable; `.<pid>` is appended).
const STATS: &str = "TEST_PLUGIN_STATS";
/// The maxRecvs the child's log must name (default 1).
const EXPECT_MAX_RECVS: &str = "PLUGIN_TEST_MAX_RECVS";

/// The test's folder of plugins and logs.
fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("nccl-rs-net-plugin-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("create a temporary folder");
    d
}

/// Compiles the test plugin with `defines` into `dir()/sub/file`.
fn build(sub: &str, file: &str, defines: &[&str]) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out_dir = dir().join(sub);
    std::fs::create_dir_all(&out_dir).expect("create the plugin folder");
    let out = out_dir.join(file);
    let mut cmd = Command::new("cc");
    cmd.args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-I"])
        .arg(root.join("include"))
        .arg("-o")
        .arg(&out)
        .arg(root.join("tests/c/plugins/net_plugin_tcp.c"));
    for d in defines {
        cmd.arg(format!("-D{d}"));
    }
    match cmd.status() {
        Ok(s) if s.success() => out,
        Ok(s) => panic!("cc failed ({s}) building {file} with {defines:?}"),
        // A missing compiler is a failure, not a silent pass: CI and the GPU hosts have one.
        Err(e) => panic!("no C compiler ({e}): the network plugin tests need `cc`"),
    }
}

/// The environment of every rank: loopback, INFO logs of INIT and NET into a file per process.
fn base_env(log_dir: &Path) -> Vec<(String, String)> {
    vec![
        (LOOPBACK.0.into(), LOOPBACK.1.into()),
        ("NCCL_DEBUG".into(), "INFO".into()),
        ("NCCL_DEBUG_SUBSYS".into(), "INIT,NET".into()),
        (
            "NCCL_DEBUG_FILE".into(),
            log_dir.join("rank-%p.log").to_string_lossy().into_owned(),
        ),
    ]
}

fn run(test: &str, nodes: usize, env: &[(String, String)]) {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    common::procs::run_nodes(test, nodes, 1, &env);
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

/// In a child: initialises its communicator (NCCL's logger installed) and checks what the
/// parent said to expect. `None` in the parent; `Some(None)` when init was expected to fail.
fn child() -> Option<Option<Ranks>> {
    let (rank, nranks, id) = common::procs::child()?;
    nccl::init_logging();
    nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
    let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
    let got = Comm::init_rank_on(dev, nranks, &id, rank);
    if let Ok(want) = std::env::var(EXPECT_INIT_ERROR) {
        let Err(e) = got else {
            panic!("init should fail with {want:?}");
        };
        assert_eq!(e.code, nccl::NcclResult::InvalidUsage, "{e}");
        assert!(e.message.contains(&want), "{e} lacks {want:?}");
        return Some(None);
    }
    let comm = got.unwrap_or_else(|e| panic!("rank {rank}: init across nodes: {e}"));
    let log = own_log();
    let net = std::env::var(EXPECT_NET).expect("expected network");
    let version: u32 = std::env::var(EXPECT_VERSION)
        .expect("expected version")
        .parse()
        .expect("a version number");
    if version > 0 {
        assert_log_has(
            &log,
            &format!("Loaded net plugin {net} (ncclNetPlugin_v{version}) from /"),
        );
        assert_log_has(
            &log,
            &format!(
                "NET/Plugin {net} : device 0: lo-test speed 12345 Mb/s latency 1.5 us ptrSupport {} maxComms 65536 maxRecvs {}",
                std::env::var(EXPECT_PTR).unwrap_or_else(|_| "HOST".into()),
                std::env::var(EXPECT_MAX_RECVS).unwrap_or_else(|_| "1".into())
            ),
        );
        // The plugin's own line, printf-formatted by our logger.
        assert_log_has(
            &log,
            &format!("{net}: init v{version}, 1 device on 127.0.0.1"),
        );
        assert_log_has(
            &log,
            &format!("NET/Plugin: Using network {net} (ncclNetPlugin_v{version}"),
        );
    }
    if let Ok(extra) = std::env::var(EXPECT_LOG) {
        for what in extra.split('|') {
            assert_log_has(&log, what);
        }
    }
    Some(Some(Ranks::new(vec![comm])))
}

/// This process's plugin counters (written at each comm close), by name.
fn plugin_stats() -> std::collections::HashMap<String, u64> {
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

/// The ring connections of a communicator went through `net`.
fn assert_connections_via(net: &str) {
    assert_log_has(&own_log(), &format!("via NET/{net}/0"));
}

/// Every collective (in and out of place, two sizes, varied types) and an all-to-all of
/// send/recv.
fn traffic(ranks: &Ranks, seed: u64) {
    let n = ranks.comms[0].count();
    for (i, coll) in Coll::ALL.into_iter().enumerate() {
        for (j, count) in [37usize, 40_000].into_iter().enumerate() {
            let (dt, op) = [
                (DataType::Float32, ReduceOp::Sum),
                (DataType::Int32, ReduceOp::Max),
                (DataType::Bfloat16, ReduceOp::Sum),
                (DataType::Int64, ReduceOp::Prod),
            ][(i + j) % 4];
            for in_place in [false, true] {
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
    for scale in [1usize, 30_000] {
        common::check_all_to_all(ranks, scale, Drive::OneThread)
            .unwrap_or_else(|e| panic!("all-to-all at scale {scale}: {e}"));
    }
}

/// Destroys the communicators; for a v11 plugin, its context is then finalized.
fn destroy(mut ranks: Ranks, v11: Option<&str>) {
    for s in std::mem::take(&mut ranks.streams) {
        let _ = ranks.comms[0].device().stream_destroy(s);
    }
    for c in std::mem::take(&mut ranks.comms) {
        c.destroy().expect("destroy");
    }
    if let Some(net) = v11 {
        assert_log_has(&own_log(), &format!("{net}: finalized comm"));
        assert_log_has(&own_log(), "(0 alive)");
    }
}

/// The child's side of the traffic tests: traffic through the expected network, then destroy.
fn traffic_child(seed: u64) -> bool {
    let Some(ranks) = child() else { return false };
    let ranks = ranks.expect("a communicator");
    let net = std::env::var(EXPECT_NET).expect("expected network");
    traffic(&ranks, seed);
    assert_connections_via(&net);
    let v11 = std::env::var(EXPECT_VERSION).is_ok_and(|v| v == "11");
    destroy(ranks, v11.then_some(net.as_str()));
    true
}

fn with(env: &[(String, String)], more: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut e = env.to_vec();
    e.extend(more.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    e
}

/// A v8 plugin loaded by path (int sizes, process-wide init), on 2 and 3 nodes.
#[test]
fn v8_plugin_by_path_across_2_and_3_nodes() {
    if traffic_child(1) {
        return;
    }
    let so = build("v8", "libtcp-v8.so", &["NET_VERSION=8"]);
    let logs = dir().join("logs-v8");
    std::fs::create_dir_all(&logs).expect("log folder");
    let env = with(
        &base_env(&logs),
        &[
            ("NCCL_NET_PLUGIN", so.to_str().expect("utf-8 path")),
            (EXPECT_NET, "TestTCP"),
            (EXPECT_VERSION, "8"),
        ],
    );
    for nodes in [2, 3] {
        run("v8_plugin_by_path_across_2_and_3_nodes", nodes, &env);
    }
}

/// A v11 plugin loaded by name (`NCCL_NET_PLUGIN=tcp11` finds libnccl-net-tcp11.so on the
/// loader's path), chosen by NCCL_NET, on 2 and 3 nodes; its per-communicator context is
/// finalized at destroy; its CollNet table is reported.
#[test]
fn v11_plugin_by_name_across_2_and_3_nodes() {
    if traffic_child(2) {
        return;
    }
    let so = build(
        "v11",
        "libnccl-net-tcp11.so",
        &[
            "NET_VERSION=11",
            "WITH_COLLNET",
            "PLUGIN_NAME=\"TestTCP11\"",
        ],
    );
    let logs = dir().join("logs-v11");
    std::fs::create_dir_all(&logs).expect("log folder");
    let lib_dir = so
        .parent()
        .expect("plugin folder")
        .to_string_lossy()
        .into_owned();
    let env = with(
        &base_env(&logs),
        &[
            ("LD_LIBRARY_PATH", lib_dir.as_str()),
            ("NCCL_NET_PLUGIN", "tcp11"),
            ("NCCL_NET", "testtcp11"), // names match case-insensitively, as NCCL's
            (EXPECT_NET, "TestTCP11"),
            (EXPECT_VERSION, "11"),
            (
                EXPECT_LOG,
                "libnccl-net-tcp11.so also exports ncclCollNetPlugin_v8 (TestTCP11-collnet)|TestTCP11: context for comm",
            ),
        ],
    );
    for nodes in [2, 3] {
        run("v11_plugin_by_name_across_2_and_3_nodes", nodes, &env);
    }
}

/// v9 and v10 tables (size_t sizes; v10's profiler callback and connect config) on 2 nodes.
#[test]
fn v9_and_v10_plugins_across_2_nodes() {
    if let Some(ranks) = child() {
        let ranks = ranks.expect("a communicator");
        common::check_all_reduce(
            &ranks,
            40_000,
            DataType::Float32,
            ReduceOp::Sum,
            false,
            3,
            Drive::OneThread,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        common::check_all_to_all(&ranks, 3000, Drive::OneThread).unwrap_or_else(|e| panic!("{e}"));
        assert_connections_via(&std::env::var(EXPECT_NET).expect("expected network"));
        destroy(ranks, None);
        return;
    }
    for v in ["9", "10"] {
        let so = build(
            &format!("v{v}"),
            &format!("libtcp-v{v}.so"),
            &[&format!("NET_VERSION={v}")],
        );
        let logs = dir().join(format!("logs-v{v}"));
        std::fs::create_dir_all(&logs).expect("log folder");
        let env = with(
            &base_env(&logs),
            &[
                ("NCCL_NET_PLUGIN", so.to_str().expect("utf-8 path")),
                (EXPECT_NET, "TestTCP"),
                (EXPECT_VERSION, v),
            ],
        );
        run("v9_and_v10_plugins_across_2_nodes", 2, &env);
    }
}

/// A plugin whose init fails, and one that exports no table, are skipped with warnings saying
/// why; the next network in line is used (the socket network after the failing one, the v8
/// plugin after the one without a table).
#[test]
fn broken_plugins_are_skipped_for_the_next_network() {
    if let Some(ranks) = child() {
        let ranks = ranks.expect("a communicator");
        common::check_all_reduce(
            &ranks,
            5000,
            DataType::Float32,
            ReduceOp::Sum,
            false,
            4,
            Drive::OneThread,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_connections_via(&std::env::var(EXPECT_NET).expect("expected network"));
        destroy(ranks, None);
        return;
    }
    let fail = build(
        "fail",
        "libtcp-fail.so",
        &["FAIL_INIT", "PLUGIN_NAME=\"Failing\""],
    );
    let nosym = build("nosym", "libtcp-nosym.so", &["NO_SYMBOL"]);
    let v8 = build("v8b", "libtcp-v8.so", &["NET_VERSION=8"]);
    let logs = dir().join("logs-broken");
    std::fs::create_dir_all(&logs).expect("log folder");
    let (fail, nosym, v8) = (
        fail.to_string_lossy().into_owned(),
        nosym.to_string_lossy().into_owned(),
        v8.to_string_lossy().into_owned(),
    );
    // init fails: the socket network carries the traffic.
    let env = with(
        &base_env(&logs),
        &[
            ("NCCL_NET_PLUGIN", fail.as_str()),
            (EXPECT_NET, "Socket"),
            (EXPECT_VERSION, "0"),
            (
                EXPECT_LOG,
                "Failing: failing init on purpose (v11)|NET/Plugin: Failing (|init failed|skipped, trying the next network",
            ),
        ],
    );
    run("broken_plugins_are_skipped_for_the_next_network", 2, &env);
    // No table, a library that does not exist, then a working plugin: the working one is used.
    let list = format!("{nosym},nccl-rs-no-such-plugin,{v8}");
    let env = with(
        &base_env(&logs),
        &[
            ("NCCL_NET_PLUGIN", list.as_str()),
            (EXPECT_NET, "TestTCP"),
            (EXPECT_VERSION, "8"),
            (
                EXPECT_LOG,
                "it exports no ncclNetPlugin_v11, _v10, _v9 or _v8 symbol; skipped|entry nccl-rs-no-such-plugin: could not find nccl-rs-no-such-plugin or libnccl-net-nccl-rs-no-such-plugin.so; skipped",
            ),
        ],
    );
    run("broken_plugins_are_skipped_for_the_next_network", 2, &env);
}

/// NCCL_NET naming no loaded network fails init (ncclInvalidUsage) with the loaded networks'
/// names; with NCCL_NET_PLUGIN=none only the socket network is loaded.
#[test]
fn wrong_net_name_fails_init_with_the_loaded_networks() {
    if child().is_some() {
        return;
    }
    let v8 = build("v8w", "libtcp-v8.so", &["NET_VERSION=8"]);
    let logs = dir().join("logs-wrong");
    std::fs::create_dir_all(&logs).expect("log folder");
    let env = with(
        &base_env(&logs),
        &[
            ("NCCL_NET_PLUGIN", v8.to_str().expect("utf-8 path")),
            ("NCCL_NET", "NoSuchNet"),
            (
                EXPECT_INIT_ERROR,
                "NCCL_NET=NoSuchNet: no network of that name is available (networks loaded: TestTCP, Socket)",
            ),
        ],
    );
    run(
        "wrong_net_name_fails_init_with_the_loaded_networks",
        2,
        &env,
    );
    let env = with(
        &base_env(&logs),
        &[
            ("NCCL_NET_PLUGIN", "none"),
            ("NCCL_NET", "TestTCP"),
            (EXPECT_INIT_ERROR, "(networks loaded: Socket)"),
        ],
    );
    run(
        "wrong_net_name_fails_init_with_the_loaded_networks",
        2,
        &env,
    );
}

/// The child of the GPU Direct RDMA tests: traffic (every collective and an all-to-all where
/// `full`, else an AllReduce and an all-to-all), then the log's connection lines and the
/// plugin's counters against EXPECT_PLACE.
fn gdr_child(seed: u64, full: bool) -> bool {
    let Some(ranks) = child() else { return false };
    let ranks = ranks.expect("a communicator");
    let net = std::env::var(EXPECT_NET).expect("expected network");
    if full {
        traffic(&ranks, seed);
    } else {
        common::check_all_reduce(
            &ranks,
            300_000,
            DataType::Float32,
            ReduceOp::Sum,
            false,
            seed,
            Drive::OneThread,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        common::check_all_to_all(&ranks, 20_000, Drive::OneThread)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let log = own_log();
    destroy(ranks, None);
    let st = plugin_stats();
    let get = |k: &str| *st.get(k).unwrap_or_else(|| panic!("no {k} in {st:?}"));
    let place = std::env::var(EXPECT_PLACE).expect("expected placement");
    // Neither a flush of host memory nor a dmabuf (the simulator has none) ever.
    assert_eq!(get("flush_host"), 0, "{st:?}");
    assert_eq!(get("reg_dmabuf"), 0, "{st:?}");
    match place.as_str() {
        "gpu" | "gpu-flush" => {
            for dir in ["send", "receive"] {
                assert_log_has(&log, &format!("[{dir}] via NET/{net}/0/GDRDMA"));
            }
            assert_log_has(&log, "GPU Direct RDMA on");
            // Every FIFO is GPU memory: nothing registered as host memory, every receive
            // posted into GPU memory.
            assert!(get("reg_cuda") > 0 && get("reg_host") == 0, "{st:?}");
            assert!(get("recv_cuda") > 0 && get("recv_host") == 0, "{st:?}");
            if place == "gpu-flush" {
                // Landed Simple steps are flushed (LL and LL128 ones, and the receives still
                // posted at close, are not): see only_simple_steps_are_flushed.
                assert!(get("flush_cuda") > 0, "{st:?}");
                assert!(get("flush_cuda") <= get("recv_cuda"), "{st:?}");
            } else {
                assert_eq!(get("flush_cuda"), 0, "{st:?}");
            }
        }
        "host" => {
            assert!(!log.contains("GDRDMA"), "GPU Direct RDMA used:\n{log}");
            assert_log_has(&log, "GPU Direct RDMA off");
            assert!(get("reg_cuda") == 0 && get("reg_host") > 0, "{st:?}");
            assert!(get("recv_cuda") == 0 && get("recv_host") > 0, "{st:?}");
            assert_eq!(get("flush_cuda"), 0, "{st:?}");
        }
        other => panic!("unknown placement {other}"),
    }
    true
}

/// The environment of a GPU Direct RDMA run of plugin `so` (named `net`, version `v`).
fn gdr_env(
    so: &Path,
    logs: &str,
    net: &str,
    v: &str,
    place: &str,
    more: &[(&str, &str)],
) -> Vec<(String, String)> {
    let logs = dir().join(logs);
    std::fs::create_dir_all(&logs).expect("log folder");
    let stats = logs.join("stats").to_string_lossy().into_owned();
    let mut env = with(
        &base_env(&logs),
        &[
            ("NCCL_NET_PLUGIN", so.to_str().expect("utf-8 path")),
            (EXPECT_NET, net),
            (EXPECT_VERSION, v),
            (EXPECT_PTR, "HOST|CUDA"),
            (EXPECT_PLACE, place),
            (STATS, stats.as_str()),
        ],
    );
    env.extend(more.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env
}

/// A plugin that takes CUDA pointers, with GPU Direct RDMA allowed (the plugin's device has no
/// PCI path, so it hangs off the CPU: PHB from the GPU, beyond the default PXB): every FIFO in
/// GPU memory, registered as PTR_CUDA, received steps flushed; every collective and an
/// all-to-all right. v11 (a helper thread per comm) flushes on NCCL_NET_FORCE_FLUSH=1, v9 on its
/// forceFlush property,
/// with NCCL_PROTO=Simple (so the flushes counted are Simple receives').
#[test]
fn cuda_pointer_plugin_uses_gpu_memory_and_flushes() {
    if gdr_child(5, true) {
        return;
    }
    // With a helper thread per comm (the flavour tools/gpu-plugin-bench.sh measures): receives
    // into GPU memory are copied there by test(), on the proxy thread.
    let v11 = build(
        "gdr11",
        "libgdr-v11.so",
        &[
            "NET_VERSION=11",
            "CUDA_PTR",
            "HELPER_THREAD",
            "PLUGIN_NAME=\"TestGDR\"",
        ],
    );
    let env = gdr_env(
        &v11,
        "logs-gdr11",
        "TestGDR",
        "11",
        "gpu-flush",
        &[("NCCL_NET_GDR_LEVEL", "SYS"), ("NCCL_NET_FORCE_FLUSH", "1")],
    );
    run("cuda_pointer_plugin_uses_gpu_memory_and_flushes", 2, &env);
    let v9 = build(
        "gdr9",
        "libgdr-v9.so",
        &[
            "NET_VERSION=9",
            "CUDA_PTR",
            "FORCE_FLUSH",
            "PLUGIN_NAME=\"TestGDR\"",
        ],
    );
    let env = gdr_env(
        &v9,
        "logs-gdr9",
        "TestGDR",
        "9",
        "gpu-flush",
        &[
            ("NCCL_NET_GDR_LEVEL", "PHB"),
            ("NCCL_PROTO", "Simple"),
            (EXPECT_LOG, "forceFlush"),
        ],
    );
    run("cuda_pointer_plugin_uses_gpu_memory_and_flushes", 2, &env);
}

/// The same plugin where NCCL_NET_GDR_LEVEL forbids GPU Direct RDMA (explicitly LOC, or the
/// default PXB against the PHB path): host memory, no flush; allowed on a compute capability
/// 9.0 GPU without a forced flush: GPU memory, no flush.
#[test]
fn gdr_level_decides_placement_and_flush() {
    if gdr_child(6, false) {
        return;
    }
    let v11 = build(
        "gdr11b",
        "libgdr-v11.so",
        &["NET_VERSION=11", "CUDA_PTR", "PLUGIN_NAME=\"TestGDR\""],
    );
    let name = "gdr_level_decides_placement_and_flush";
    let forbid = gdr_env(
        &v11,
        "logs-gdr-loc",
        "TestGDR",
        "11",
        "host",
        &[
            ("NCCL_NET_GDR_LEVEL", "LOC"),
            ("NCCL_NET_FORCE_FLUSH", "1"),
            (
                EXPECT_LOG,
                "GPU-NIC path PHB is farther than NCCL_NET_GDR_LEVEL LOC",
            ),
        ],
    );
    run(name, 2, &forbid);
    let default = gdr_env(
        &v11,
        "logs-gdr-default",
        "TestGDR",
        "11",
        "host",
        &[(
            EXPECT_LOG,
            "GPU-NIC path PHB is farther than NCCL_NET_GDR_LEVEL PXB",
        )],
    );
    run(name, 2, &default);
    let no_flush = gdr_env(
        &v11,
        "logs-gdr-noflush",
        "TestGDR",
        "11",
        "gpu",
        &[
            ("NCCL_NET_GDR_LEVEL", "PHB"),
            (
                EXPECT_LOG,
                "receives in GPU memory, sends from GPU memory, registered with regMr",
            ),
        ],
    );
    run(name, 2, &no_flush);
}

/// A network's speed feeds the tuner: one process loads a slow (1 Gb/s) and a fast
/// (400 Gb/s) flavour of the plugin and makes a communicator over each (NCCL_NET through the
/// config's netName); their AllReduce choices differ, and the slow network's estimate of a
/// large AllReduce is the longer.
#[test]
fn plugin_speed_moves_the_tuner() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        nccl::init_logging();
        nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
        let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
        let mut slow_cfg = nccl::Config::default();
        slow_cfg.net_name = Some("TestSlow".into());
        let slow = Comm::init_rank_config_on(dev, nranks, &id, rank, &slow_cfg)
            .unwrap_or_else(|e| panic!("init over TestSlow: {e}"));
        let mut fast_cfg = nccl::Config::default();
        fast_cfg.net_name = Some("TestFast".into());
        let fast = slow
            .split(0, rank as i32, Some(&fast_cfg))
            .unwrap_or_else(|e| panic!("split over TestFast: {e}"))
            .expect("a child communicator");
        let log = own_log();
        assert_log_has(
            &log,
            "NET/Plugin TestSlow : device 0: lo-test speed 1000 Mb/s",
        );
        assert_log_has(
            &log,
            "NET/Plugin TestFast : device 0: lo-test speed 400000 Mb/s",
        );
        let mut differ = Vec::new();
        for shift in 10..=30 {
            let bytes = 1usize << shift;
            let s = slow
                .tuning(nccl::Coll::AllReduce, bytes)
                .expect("slow choice");
            let f = fast
                .tuning(nccl::Coll::AllReduce, bytes)
                .expect("fast choice");
            if (s.algo, s.proto) != (f.algo, f.proto) {
                differ.push(format!("{bytes}: {s:?} / {f:?}"));
            }
            if shift == 30 {
                assert!(
                    s.est_time_us > 10.0 * f.est_time_us,
                    "1 GiB over 1 Gb/s estimated {} us, over 400 Gb/s {} us",
                    s.est_time_us,
                    f.est_time_us
                );
            }
        }
        assert!(
            !differ.is_empty(),
            "the network's speed changed no AllReduce choice from 1 KiB to 1 GiB"
        );
        eprintln!("rank {rank}: choices that differ (slow / fast): {differ:#?}");
        fast.destroy().expect("destroy");
        slow.destroy().expect("destroy");
        return;
    }
    let slow = build(
        "slow",
        "libslow.so",
        &["NET_VERSION=11", "SPEED=1000", "PLUGIN_NAME=\"TestSlow\""],
    );
    let fast = build(
        "fast",
        "libfast.so",
        &["NET_VERSION=11", "SPEED=400000", "PLUGIN_NAME=\"TestFast\""],
    );
    let logs = dir().join("logs-speed");
    std::fs::create_dir_all(&logs).expect("log folder");
    let list = format!("{},{}", slow.display(), fast.display());
    let env = with(&base_env(&logs), &[("NCCL_NET_PLUGIN", list.as_str())]);
    run("plugin_speed_moves_the_tuner", 2, &env);
}

/// What the protocol-flush test's child expects of the plugin's flushes: "none" or "some".
const EXPECT_FLUSHES: &str = "PLUGIN_TEST_FLUSHES";

/// The child of the protocol-flush test: ring collectives with the one protocol NCCL_PROTO
/// allows (the tuner's choice is checked first), every collective in and out of place, then
/// the plugin's counters: receives posted into GPU memory, and flushes as EXPECT_FLUSHES says.
fn flush_proto_child(seed: u64) -> bool {
    let Some(ranks) = child() else { return false };
    let ranks = ranks.expect("a communicator");
    let want = match std::env::var("NCCL_PROTO")
        .expect("a forced protocol")
        .as_str()
    {
        "LL" => nccl::Proto::Ll,
        "LL128" => nccl::Proto::Ll128,
        _ => nccl::Proto::Simple,
    };
    for coll in nccl::Coll::ALL {
        let choice = ranks.comms[0]
            .tuning(coll, 4 * 50_000)
            .expect("the tuner's choice");
        assert_eq!(choice.proto, want, "{coll:?}: {choice:?}");
    }
    for (i, coll) in Coll::ALL.into_iter().enumerate() {
        for in_place in [false, true] {
            check_collective(
                &ranks,
                coll,
                50_000,
                DataType::Float32,
                ReduceOp::Sum,
                i % ranks.comms[0].count(),
                in_place,
                seed + i as u64,
                Drive::OneThread,
            )
            .unwrap_or_else(|e| panic!("{} with {want:?}: {e}", coll.name()));
        }
    }
    let log = own_log();
    destroy(ranks, None);
    assert_log_has(&log, "/GDRDMA");
    let st = plugin_stats();
    let get = |k: &str| *st.get(k).unwrap_or_else(|| panic!("no {k} in {st:?}"));
    assert!(get("recv_cuda") > 0 && get("recv_host") == 0, "{st:?}");
    assert_eq!(get("flush_host"), 0, "{st:?}");
    match std::env::var(EXPECT_FLUSHES)
        .expect("expected flushes")
        .as_str()
    {
        "none" => assert_eq!(get("flush_cuda"), 0, "{want:?} steps were flushed: {st:?}"),
        _ => assert!(
            get("flush_cuda") > 0,
            "{want:?} steps were not flushed: {st:?}"
        ),
    }
    true
}

/// Only Simple receives into GPU memory are flushed (NCCL's rule: LL and LL128 lines carry
/// their own flags). A plugin that takes CUDA pointers, GPU Direct RDMA allowed and flushes
/// forced (NCCL_NET_FORCE_FLUSH=1), ring collectives across 2 nodes with NCCL_PROTO forced to
/// LL, LL128 and Simple: no flush for LL or LL128, flushes for Simple, results right.
#[test]
fn only_simple_steps_are_flushed() {
    if flush_proto_child(7) {
        return;
    }
    let v11 = build(
        "gdr11p",
        "libgdr-v11.so",
        &["NET_VERSION=11", "CUDA_PTR", "PLUGIN_NAME=\"TestGDR\""],
    );
    for (proto, flushes) in [("LL", "none"), ("LL128", "none"), ("Simple", "some")] {
        let env = gdr_env(
            &v11,
            &format!("logs-gdr-{proto}"),
            "TestGDR",
            "11",
            "gpu-flush",
            &[
                ("NCCL_NET_GDR_LEVEL", "SYS"),
                ("NCCL_NET_FORCE_FLUSH", "1"),
                ("NCCL_ALGO", "Ring"),
                ("NCCL_PROTO", proto),
                (EXPECT_FLUSHES, flushes),
            ],
        );
        run("only_simple_steps_are_flushed", 2, &env);
    }
}

/// The child of the grouped-receive test: all-to-alls (small, and many FIFO steps per
/// connection) and ring shifts through the plugin, then its counters: grouped (multi-buffer)
/// receives where maxRecvs > 1 and one comm per peer and direction, none otherwise.
fn grouped_child(seed: u64) -> bool {
    let Some(ranks) = child() else { return false };
    let ranks = ranks.expect("a communicator");
    for scale in [1usize, 100_000] {
        common::check_all_to_all(&ranks, scale, Drive::OneThread)
            .unwrap_or_else(|e| panic!("all-to-all at scale {scale}: {e}"));
    }
    for (i, count) in [3usize, 250_000].into_iter().enumerate() {
        common::check_ring_shift(&ranks, count, seed + i as u64);
    }
    let log = own_log();
    destroy(ranks, None);
    let st = plugin_stats();
    let get = |k: &str| *st.get(k).unwrap_or_else(|| panic!("no {k} in {st:?}"));
    let max: u64 = std::env::var(EXPECT_MAX_RECVS)
        .expect("expected maxRecvs")
        .parse()
        .expect("a number");
    assert!(get("recv_max_n") <= max, "{st:?}");
    if std::env::var_os("NCCL_NET_GDR_LEVEL").is_some() {
        // The CUDA-pointer flavour: every receive into GPU memory, Simple steps flushed.
        assert_log_has(&log, "/GDRDMA");
        assert!(get("recv_cuda") > 0 && get("recv_host") == 0, "{st:?}");
        assert!(get("flush_cuda") > 0 && get("flush_host") == 0, "{st:?}");
    }
    if max > 1 {
        // The 4 send/recv connections to each peer share one comm per direction.
        assert_log_has(&log, "4 receive connections with rank");
        assert!(
            get("recv_multi") > 0,
            "no grouped receive was posted: {st:?}"
        );
    } else {
        assert!(!log.contains("share one comm"), "{log}");
        assert_eq!(get("recv_multi"), 0, "{st:?}");
    }
    true
}

/// Grouped receives (maxRecvs 4): the 4 send/recv connections (NCCL_RS_SIM_P2P_CONNS) between
/// two ranks share one network comm per direction, each tagging its messages, and the
/// receiving proxy posts the steps its kernels wait for of several connections in one irecv
/// (the plugin matches tags and counts multi-buffer receives). All-to-alls and ring shifts
/// across 2 and 3 nodes, right with maxRecvs 4 (v11 and v8 tables, and a v11 flavour taking
/// CUDA pointers: FIFOs in GPU memory, Simple steps flushed) and with maxRecvs 1 (a comm per
/// connection, no grouped receive).
#[test]
fn grouped_receives_over_shared_comms() {
    if grouped_child(11) {
        return;
    }
    let grouped = build(
        "grp4",
        "libgrp4.so",
        &["NET_VERSION=11", "MAX_RECVS=4", "PLUGIN_NAME=\"TestGroup\""],
    );
    // v8's table: int sizes, the adapter converting each buffer's.
    let grouped_v8 = build(
        "grp4v8",
        "libgrp4v8.so",
        &["NET_VERSION=8", "MAX_RECVS=4", "PLUGIN_NAME=\"TestGroup\""],
    );
    let single = build(
        "grp1",
        "libgrp1.so",
        &["NET_VERSION=11", "PLUGIN_NAME=\"TestGroup\""],
    );
    // CUDA pointers too: FIFOs in (simulated) GPU memory, Simple steps flushed, so a grouped
    // receive's steps are flushed one by one (under a stand-in libcuda.so.1 on the loader's
    // path, this flavour's staging copies run as they do on a GPU).
    let grouped_gdr = build(
        "grp4gdr",
        "libgrp4gdr.so",
        &[
            "NET_VERSION=11",
            "MAX_RECVS=4",
            "CUDA_PTR",
            "PLUGIN_NAME=\"TestGroup\"",
        ],
    );
    let gdr: &[(&str, &str)] = &[
        ("NCCL_NET_GDR_LEVEL", "SYS"),
        ("NCCL_NET_FORCE_FLUSH", "1"),
        (EXPECT_PTR, "HOST|CUDA"),
    ];
    for (so, version, max, more, tag) in [
        (&grouped, "11", "4", &[][..], ""),
        (&grouped_v8, "8", "4", &[][..], ""),
        (&single, "11", "1", &[][..], ""),
        (&grouped_gdr, "11", "4", gdr, "-gdr"),
    ] {
        let logs = dir().join(format!("logs-grp{max}-v{version}{tag}"));
        std::fs::create_dir_all(&logs).expect("log folder");
        let stats = logs.join("stats").to_string_lossy().into_owned();
        let env = with(
            &base_env(&logs),
            &[
                ("NCCL_NET_PLUGIN", so.to_str().expect("utf-8 path")),
                ("NCCL_RS_SIM_P2P_CONNS", "4"),
                // Small send/recv slots: many steps per connection and message.
                ("NCCL_P2P_NVL_CHUNKSIZE", "4096"),
                (EXPECT_NET, "TestGroup"),
                (EXPECT_VERSION, version),
                (EXPECT_MAX_RECVS, max),
                (STATS, stats.as_str()),
            ],
        );
        let env = with(&env, more);
        for nodes in [2, 3] {
            run("grouped_receives_over_shared_comms", nodes, &env);
        }
    }
}
