//! Network plugins and GPU Direct RDMA on the CPU simulator (the plugin and its helpers are
//! `net_plugin`'s): a flavour of the test plugin claims NCCL_PTR_CUDA and counts its
//! registrations, receives and flushes; NCCL_NET_GDR_LEVEL decides where the FIFOs live and
//! which steps are flushed; a plugin's speed moves the tuner; grouped receives share comms.

use super::net_plugin::*;
use crate::common::{self, check_collective, Drive};
use nccl::{Comm, DataType, ReduceOp};
use nccl_device::abi::Coll;
use std::path::Path;

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
            ReduceOp::SUM,
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
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_reduce_float_sum",
        nccl_rs_kernel = "nccl_p2p"
    )),
    ignore = "needs nccl_all_reduce_float_sum, nccl_p2p, which NCCL_RS_KERNELS left out"
)]
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
    run(2, &env);
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
    run(2, &env);
}

/// The same plugin where NCCL_NET_GDR_LEVEL forbids GPU Direct RDMA (explicitly LOC, or the
/// default PXB against the PHB path): host memory, no flush; allowed on a compute capability
/// 9.0 GPU without a forced flush: GPU memory, no flush.
#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_reduce_float_sum",
        nccl_rs_kernel = "nccl_p2p"
    )),
    ignore = "needs nccl_all_reduce_float_sum, nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn gdr_level_decides_placement_and_flush() {
    if gdr_child(6, false) {
        return;
    }
    let v11 = build(
        "gdr11b",
        "libgdr-v11.so",
        &["NET_VERSION=11", "CUDA_PTR", "PLUGIN_NAME=\"TestGDR\""],
    );
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
    run(2, &forbid);
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
    run(2, &default);
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
    run(2, &no_flush);
}

/// A network's speed feeds the tuner: one process loads a slow (1 Gb/s) and a fast
/// (400 Gb/s) flavour of the plugin and makes a communicator over each (NCCL_NET through the
/// config's netName); their AllReduce choices differ, and the slow network's estimate of a
/// large AllReduce is the longer.
#[test]
fn plugin_speed_moves_the_tuner() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        nccl::init_logging();
        let dev = common::sim_dev(rank);
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
    run(2, &env);
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
                ReduceOp::SUM,
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
        run(2, &env);
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
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_p2p"),
    ignore = "needs nccl_p2p, which NCCL_RS_KERNELS left out"
)]
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
            run(nodes, &env);
        }
    }
}
