//! The SHM transport on the CPU simulator. Ranks of one node that may not use p2p
//! (`NCCL_P2P_DISABLE=1`, `NCCL_P2P_LEVEL` below their path) meet in host shared memory; with
//! `NCCL_SHM_DISABLE=1` too they use the network; across nodes p2p (or SHM) inside and the
//! network between. Each case runs in child processes (the variables are read per process):
//! every collective with random data and poisoned outputs, send/recv between every pair, and
//! the transports each rank logged at `NCCL_DEBUG=INFO` (`Channel 00/0 : 1[1] -> 0[0] via
//! SHM/direct/direct`, as NCCL prints them).

use crate::common::{self, check_all_to_all, check_collective, Drive, Ranks};
use nccl::{Comm, DataType, ReduceOp};
use nccl_device::abi::Coll;

/// Loopback only: tests never leave this machine.
const LOOPBACK: (&str, &str) = ("NCCL_SOCKET_IFNAME", "lo");
const P2P_OFF: (&str, &str) = ("NCCL_P2P_DISABLE", "1");
const SHM_OFF: (&str, &str) = ("NCCL_SHM_DISABLE", "1");
/// In a child: run this many ranks in one process (`ncclCommInitAll`) instead of one.
const IN_PROCESS: &str = "NCCL_RS_TEST_SHM_IN_PROCESS";
/// In a child: `|`-separated texts its log must hold, and texts it must not.
const EXPECT: &str = "NCCL_RS_TEST_SHM_EXPECT";
const REFUSE: &str = "NCCL_RS_TEST_SHM_REFUSE";

/// The child's communicators, with NCCL's logger writing INIT lines to a file of its own.
fn child_ranks() -> Option<Ranks> {
    let (rank, nranks, id) = common::procs::child()?;
    common::sim();
    assert!(nccl::init_logging(), "no other logger in the child");
    let comms = match std::env::var(IN_PROCESS).ok().and_then(|v| v.parse().ok()) {
        Some(n) => {
            let devs: Vec<i32> = (0..n).collect();
            Comm::init_all(&devs).expect("init_all")
        }
        None => {
            let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
            vec![Comm::init_rank_on(dev, nranks, &id, rank).expect("init_rank")]
        }
    };
    check_log();
    check_unlinked();
    Some(Ranks::new(comms))
}

/// The log file of this process (`NCCL_DEBUG_FILE` with `%p`).
fn log_path() -> String {
    let pattern = std::env::var("NCCL_DEBUG_FILE").expect("NCCL_DEBUG_FILE in the child");
    pattern.replace("%p", &std::process::id().to_string())
}

/// The channel lines logged at init hold every expected transport and no refused one.
fn check_log() {
    log::logger().flush();
    let text = std::fs::read_to_string(log_path()).expect("read the child's log");
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("Channel ")).collect();
    let list = |var: &str| -> Vec<String> {
        std::env::var(var)
            .unwrap_or_default()
            .split('|')
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    };
    for want in list(EXPECT) {
        assert!(
            lines.iter().any(|l| l.contains(&want)),
            "no channel line with {want:?}:\n{}",
            lines.join("\n")
        );
    }
    for bad in list(REFUSE) {
        assert!(
            !lines.iter().any(|l| l.contains(&bad)),
            "a channel line with {bad:?}:\n{}",
            lines.join("\n")
        );
    }
    eprintln!("{}", lines.join("\n"));
}

/// No shared memory segment of this process is left linked once init is done (the opener of
/// each unlinks it).
fn check_unlinked() {
    let mine = format!("ncclrs-{}@", std::process::id());
    let left: Vec<String> = std::fs::read_dir("/dev/shm")
        .expect("/dev/shm")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&mine) && n.contains("-shm-"))
        .collect();
    assert!(left.is_empty(), "segments still linked: {left:?}");
}

/// Every collective in and out of place at a few sizes (LL and LL128 take several FIFO steps
/// at the largest), then send/recv between every pair in one group.
fn collectives(ranks: &Ranks, seed: u64) {
    let n = ranks.comms[0].count();
    for (i, coll) in Coll::ALL.into_iter().enumerate() {
        for (j, count) in [1usize, 3000, 70_000].into_iter().enumerate() {
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
    check_all_to_all(ranks, 5000, Drive::OneThread).unwrap_or_else(|e| panic!("all-to-all: {e}"));
}

/// The environment of a child: `env`, NCCL's logger at INFO into a file per process under
/// `dir`, and what its channel lines must and must not say.
fn child_env(
    dir: &std::path::Path,
    env: &[(&'static str, &'static str)],
    expect: &'static str,
    refuse: &'static str,
) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = env
        .iter()
        .map(|(k, val)| (k.to_string(), val.to_string()))
        .collect();
    v.push(("NCCL_DEBUG".into(), "INFO".into()));
    v.push(("NCCL_DEBUG_SUBSYS".into(), "INIT".into()));
    v.push((
        "NCCL_DEBUG_FILE".into(),
        dir.join("rank.%p.log").to_string_lossy().into_owned(),
    ));
    v.push((EXPECT.into(), expect.into()));
    v.push((REFUSE.into(), refuse.into()));
    v
}

/// A fresh directory for a test's logs.
fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("nccl-rs-sim-shm-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create a scratch directory");
    d
}

/// Runs `test` as `nodes` x `per_node` rank processes (one node: no NCCL_HOSTID) under `env`.
fn run(
    test: &str,
    nodes: usize,
    per_node: usize,
    env: &[(&'static str, &'static str)],
    expect: &'static str,
    refuse: &'static str,
) {
    let dir = scratch(test);
    let extra = child_env(&dir, env, expect, refuse);
    let extra: Vec<(&str, &str)> = extra.iter().map(|(k, v)| (&k[..], &v[..])).collect();
    common::procs::run_each(nodes * per_node, &extra, |r| {
        if nodes > 1 {
            vec![("NCCL_HOSTID".into(), format!("test-node-{}", r / per_node))]
        } else {
            Vec::new()
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_collective_and_protocol_over_shm_in_processes() {
    if let Some(ranks) = child_ranks() {
        collectives(&ranks, 11);
        return;
    }
    let t = "every_collective_and_protocol_over_shm_in_processes";
    for n in [2, 4] {
        for proto in ["LL", "LL128", "Simple"] {
            let env = [P2P_OFF, ("NCCL_PROTO", proto)];
            run(t, 1, n, &env, "via SHM/direct/direct", "via P2P|via NET");
        }
    }
    // The tree's chains (and its up links, send/recv connections) through SHM.
    let env = [P2P_OFF, ("NCCL_ALGO", "allreduce:tree")];
    run(t, 1, 4, &env, "via SHM/direct/direct", "via P2P|via NET");
    // NCCL_P2P_LEVEL below the path (the simulator's GPUs are NVLink peers) means SHM too.
    let env = [("NCCL_P2P_LEVEL", "LOC")];
    run(t, 1, 2, &env, "via SHM/direct/direct", "via P2P|via NET");
}

#[test]
fn every_collective_and_protocol_over_shm_in_one_process() {
    if let Some(ranks) = child_ranks() {
        collectives(&ranks, 12);
        return;
    }
    let t = "every_collective_and_protocol_over_shm_in_one_process";
    for (n, proto) in [
        ("2", "LL"),
        ("4", "LL128"),
        ("4", "Simple"),
        ("2", "Simple"),
    ] {
        let env = [P2P_OFF, ("NCCL_PROTO", proto), (IN_PROCESS, n)];
        run(t, 1, 1, &env, "via SHM/direct/direct", "via P2P|via NET");
    }
    // GPUs that cannot map each other (cuDeviceCanAccessPeer says no) take SHM with p2p on.
    for (n, proto) in [("2", "Simple"), ("4", "LL")] {
        let env = [
            ("NCCL_RS_SIM_NO_PEER_ACCESS", "1"),
            ("NCCL_PROTO", proto),
            (IN_PROCESS, n),
        ];
        run(t, 1, 1, &env, "via SHM/direct/direct", "via P2P|via NET");
    }
}

#[test]
fn p2p_and_shm_off_use_the_network_on_one_node() {
    if let Some(ranks) = child_ranks() {
        collectives(&ranks, 13);
        return;
    }
    let t = "p2p_and_shm_off_use_the_network_on_one_node";
    let env = [LOOPBACK, P2P_OFF, SHM_OFF];
    run(t, 1, 2, &env, "via NET/", "via P2P|via SHM");
}

#[test]
fn mixed_paths_across_nodes() {
    if let Some(ranks) = child_ranks() {
        collectives(&ranks, 14);
        return;
    }
    let t = "mixed_paths_across_nodes";
    // P2P off: SHM inside each node, the network between.
    run(
        t,
        2,
        2,
        &[LOOPBACK, P2P_OFF],
        "via SHM/|via NET/",
        "via P2P",
    );
    // P2P inside each node, the network between.
    run(t, 2, 2, &[LOOPBACK], "via P2P/IPC|via NET/", "via SHM");
}
