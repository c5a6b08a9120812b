//! NCCL network plugins (NCCL_NET_PLUGIN, NCCL_NET) on the CPU simulator: a plugin written for
//! these tests in C (`tests/c/plugins/net_plugin_tcp.c`, TCP over 127.0.0.1, host memory) is compiled
//! here with the system `cc` in several flavours, and rank processes with their own
//! `NCCL_HOSTID` (nodes) reach each other through it. Each rank checks its results and its own
//! NCCL_DEBUG=INFO log: which file and version were loaded, the devices, the plugin's own
//! (printf-formatted) lines, the network its connections use, v11's context finalized.
//!
//! Failure cases: a plugin whose init fails and one without a table are skipped for the next
//! network; NCCL_NET naming no loaded network fails init with the list of loaded networks.

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
                "NET/Plugin {net} : device 0: lo-test speed 12345 Mb/s latency 1.5 us ptrSupport HOST maxComms 65536 maxRecvs 1"
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
