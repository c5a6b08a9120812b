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
//! One-sided puts and signals (`ncclPutSignal`, `ncclWaitSignal`) across the nodes travel
//! through the plugin as well (v9 and v10).
//!
//! Grouped receives: a flavour with maxRecvs 4 matches tags and groups receives; the send/recv
//! connections between two ranks then share one comm per direction, and the receiving proxy
//! posts several connections' awaited steps in one irecv.

use crate::common::{self, check_collective, Drive, Ranks};
use nccl::{Comm, DataType, ReduceOp};
use nccl_device::abi::Coll;
use std::path::{Path, PathBuf};

/// Loopback only: tests never leave this machine.
pub(crate) const LOOPBACK: (&str, &str) = ("NCCL_SOCKET_IFNAME", "lo");
/// What a child expects: the network's name, and the plugin version (0: the socket network).
pub(crate) const EXPECT_NET: &str = "PLUGIN_TEST_NET";
pub(crate) const EXPECT_VERSION: &str = "PLUGIN_TEST_VERSION";
/// A child expecting init to fail: text its error must contain.
pub(crate) const EXPECT_INIT_ERROR: &str = "PLUGIN_TEST_INIT_ERROR";
/// Text the child's log must contain ('|'-separated).
pub(crate) const EXPECT_LOG: &str = "PLUGIN_TEST_LOG";
/// The pointer support the child's log must name (default HOST).
pub(crate) const EXPECT_PTR: &str = "PLUGIN_TEST_PTR";
/// Where the FIFOs must be: "gpu-flush", "gpu" (no flush) or "host".
pub(crate) const EXPECT_PLACE: &str = "PLUGIN_TEST_PLACE";
/// The plugin's counters file (its own variable; `.<pid>` is appended).
pub(crate) const STATS: &str = "TEST_PLUGIN_STATS";
/// The maxRecvs the child's log must name (default 1).
pub(crate) const EXPECT_MAX_RECVS: &str = "PLUGIN_TEST_MAX_RECVS";

/// The test's folder of plugins and logs.
pub(crate) fn dir() -> PathBuf {
    common::plugins::scratch("net-plugin")
}

/// Compiles the test plugin with `defines` into `dir()/sub/file`.
pub(crate) fn build(sub: &str, file: &str, defines: &[&str]) -> PathBuf {
    let out = dir().join(sub).join(file);
    common::plugins::shared_library("tests/c/plugins/net_plugin_tcp.c", &out, defines)
}

/// The environment of every rank: loopback, INFO logs of INIT and NET into a file per process.
pub(crate) fn base_env(log_dir: &Path) -> Vec<(String, String)> {
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

/// The calling test's ranks, one per node, with `env`.
pub(crate) fn run(nodes: usize, env: &[(String, String)]) {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    common::procs::run_nodes(nodes, 1, &env);
}

/// This process's log so far.
pub(crate) fn own_log() -> String {
    let path = std::env::var("NCCL_DEBUG_FILE")
        .expect("NCCL_DEBUG_FILE set by the parent")
        .replace("%p", &std::process::id().to_string());
    std::fs::read_to_string(&path).unwrap_or_default()
}

pub(crate) fn assert_log_has(log: &str, what: &str) {
    assert!(
        log.contains(what),
        "the log lacks {what:?}; it reads:\n{log}"
    );
}

/// In a child: initialises its communicator (NCCL's logger installed) and checks what the
/// parent said to expect. `None` in the parent; `Some(None)` when init was expected to fail.
pub(crate) fn child() -> Option<Option<Ranks>> {
    let (rank, nranks, id) = common::procs::child()?;
    nccl::init_logging();
    let dev = common::sim_dev(rank);
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
pub(crate) fn plugin_stats() -> std::collections::HashMap<String, u64> {
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
pub(crate) fn assert_connections_via(net: &str) {
    assert_log_has(&own_log(), &format!("via NET/{net}/0"));
}

/// Every collective (in and out of place, two sizes, varied types) and an all-to-all of
/// send/recv.
pub(crate) fn traffic(ranks: &Ranks, seed: u64) {
    let n = ranks.comms[0].count();
    for (i, coll) in Coll::ALL.into_iter().enumerate() {
        for (j, count) in [37usize, 40_000].into_iter().enumerate() {
            let (dt, op) = [
                (DataType::Float32, ReduceOp::SUM),
                (DataType::Int32, ReduceOp::MAX),
                (DataType::Bfloat16, ReduceOp::SUM),
                (DataType::Int64, ReduceOp::PROD),
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
pub(crate) fn destroy(mut ranks: Ranks, v11: Option<&str>) {
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
pub(crate) fn traffic_child(seed: u64) -> bool {
    let Some(ranks) = child() else { return false };
    let ranks = ranks.expect("a communicator");
    let net = std::env::var(EXPECT_NET).expect("expected network");
    traffic(&ranks, seed);
    assert_connections_via(&net);
    let v11 = std::env::var(EXPECT_VERSION).is_ok_and(|v| v == "11");
    destroy(ranks, v11.then_some(net.as_str()));
    true
}

pub(crate) fn with(env: &[(String, String)], more: &[(&str, &str)]) -> Vec<(String, String)> {
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
        run(nodes, &env);
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
        run(nodes, &env);
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
            ReduceOp::SUM,
            false,
            3,
            Drive::OneThread,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        common::check_all_to_all(&ranks, 3000, Drive::OneThread).unwrap_or_else(|e| panic!("{e}"));
        // One-sided puts across the nodes go through the plugin too (two network chunks each).
        crate::common::onesided::all_to_all_by_puts(&ranks, 150_001, 2);
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
        run(2, &env);
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
            ReduceOp::SUM,
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
    run(2, &env);
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
    run(2, &env);
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
    run(2, &env);
    let env = with(
        &base_env(&logs),
        &[
            ("NCCL_NET_PLUGIN", "none"),
            ("NCCL_NET", "TestTCP"),
            (EXPECT_INIT_ERROR, "(networks loaded: Socket)"),
        ],
    );
    run(2, &env);
}
