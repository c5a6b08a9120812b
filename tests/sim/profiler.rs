//! NCCL's profiler plugin ABI on the simulator: a plugin written for these tests in C
//! (`tests/c/plugins/profiler_record.c`), built as ABI versions 4, 5 and 6, writes every call it
//! gets as a line; each test runs in a child process of its own (the plugin is loaded once per
//! process, as NCCL loads it), then reads the lines back and checks the events, their fields
//! and their parents, what the activation mask lets through, and that a failed init or no
//! plugin leaves the collectives working.

use crate::common::{self, from_bytes, input, reference, to_bytes, Ranks};
use nccl::{DataType, ReduceOp};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Every event type of version 6.
const ALL: &str = "0x7fff";

/// The test plugin of ABI version `v`, built for the calling test (tests running side by side
/// must not rewrite a library another one's child has loaded).
pub(crate) fn plugin(v: u32) -> PathBuf {
    let test = common::procs::current_test().replace("::", "-");
    let out =
        common::plugins::scratch("profiler").join(format!("{test}/v{v}/libnccl-profiler-rec.so"));
    if !out.exists() {
        let define = format!("PROFILER_VERSION={v}");
        common::plugins::shared_library("tests/c/plugins/profiler_record.c", &out, &[&define]);
    }
    out
}

/// One line of a plugin log: its kind (`init`, `start`, `stop`, `record`, `finalize`) and its
/// `key=value` fields.
#[derive(Clone, Debug)]
pub(crate) struct Line {
    pub(crate) kind: String,
    pub(crate) f: HashMap<String, String>,
}

impl Line {
    pub(crate) fn get(&self, k: &str) -> &str {
        self.f.get(k).map_or("", |v| v.as_str())
    }
}

/// The lines of every log under `prefix` (one per communicator), by rank.
pub(crate) fn logs(prefix: &Path) -> HashMap<usize, Vec<Line>> {
    let dir = prefix.parent().expect("a folder");
    let stem = prefix.file_name().unwrap().to_string_lossy().into_owned();
    let mut out = HashMap::new();
    for e in std::fs::read_dir(dir).expect("the logs' folder") {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with(&stem) || !name.ends_with(".log") {
            continue;
        }
        let lines: Vec<Line> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| {
                let mut it = l.split(' ');
                let kind = it.next().unwrap_or("").to_string();
                let f = it
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                Line { kind, f }
            })
            .collect();
        let rank: usize = lines[0].get("rank").parse().expect("an init line first");
        out.insert(rank, lines);
    }
    out
}

/// The started events of `lines`: by handle, the start line.
pub(crate) fn starts(lines: &[Line]) -> HashMap<String, Line> {
    lines
        .iter()
        .filter(|l| l.kind == "start")
        .map(|l| (l.get("h").to_string(), l.clone()))
        .collect()
}

/// The start lines of type `ty`, in order.
pub(crate) fn of_type<'a>(lines: &'a [Line], ty: &str) -> Vec<&'a Line> {
    lines
        .iter()
        .filter(|l| l.kind == "start" && l.get("type") == ty)
        .collect()
}

/// Every event started is stopped exactly once, after its start.
pub(crate) fn stopped_once(lines: &[Line]) {
    let mut open: HashMap<&str, usize> = HashMap::new();
    for l in lines {
        match l.kind.as_str() {
            "start" => assert!(open.insert(l.get("h"), 0).is_none(), "{l:?} twice"),
            "stop" => {
                let n = open
                    .get_mut(l.get("h"))
                    .unwrap_or_else(|| panic!("{l:?} never started"));
                *n += 1;
                assert_eq!(*n, 1, "{l:?}: stopped twice");
            }
            _ => {}
        }
    }
    assert!(
        open.values().all(|&n| n == 1),
        "an event never stopped: {open:?}"
    );
}

/// What each rank runs: an AllReduce outside any group, then one group of an AllGather and a
/// send to the next rank with a receive from the previous one; results checked.
fn traffic(ranks: &Ranks) {
    let n = ranks.comms.len();
    let count = 1001;
    let x: Vec<Vec<f32>> = (0..n)
        .map(|r| input::<f32>(count, ReduceOp::SUM, 5, r, n))
        .collect();
    let want = reference(&x, ReduceOp::SUM, DataType::Float32);
    std::thread::scope(|s| {
        for (r, (c, &st)) in common::lend(&ranks.comms)
            .into_iter()
            .zip(&ranks.streams)
            .enumerate()
        {
            let (x, want) = (&x, &want);
            s.spawn(move || {
                let d = c.device();
                let buf = d.alloc(count * 4).unwrap();
                buf.write(0, to_bytes(&x[r])).unwrap();
                unsafe {
                    c.all_reduce_raw(
                        buf.ptr(),
                        buf.ptr(),
                        count,
                        DataType::Float32,
                        ReduceOp::SUM,
                        st,
                    )
                }
                .unwrap();
                let gathered = d.alloc(n * count * 4).unwrap();
                let got = d.alloc(count * 4).unwrap();
                nccl::group_start();
                unsafe {
                    c.all_gather_raw(buf.ptr(), gathered.ptr(), count, DataType::Float32, st)
                        .unwrap();
                    c.send_raw(buf.ptr(), count, DataType::Float32, (r + 1) % n, st)
                        .unwrap();
                    c.recv_raw(got.ptr(), count, DataType::Float32, (r + n - 1) % n, st)
                        .unwrap();
                }
                nccl::group_end().unwrap();
                d.stream_sync(st).unwrap();
                let mut out = vec![0u8; count * 4];
                buf.read(0, &mut out).unwrap();
                common::compare(&from_bytes::<f32>(&out), want, &format!("rank {r}"))
                    .unwrap_or_else(|e| panic!("{e}"));
                got.read(0, &mut out).unwrap();
                common::compare(
                    &from_bytes::<f32>(&out),
                    want,
                    &format!("rank {r}: received"),
                )
                .unwrap_or_else(|e| panic!("{e}"));
            });
        }
    });
}

/// A child's environment: the plugin of version `v`, the mask, the logs' prefix.
pub(crate) fn env(v: u32, mask: &str, prefix: &Path) -> Vec<(String, String)> {
    std::fs::create_dir_all(prefix.parent().unwrap()).expect("the logs' folder");
    vec![
        (
            "NCCL_PROFILER_PLUGIN".into(),
            plugin(v).to_string_lossy().into_owned(),
        ),
        ("NCCL_RS_TEST_PROFILER_MASK".into(), mask.into()),
        (
            "NCCL_RS_TEST_PROFILER_OUT".into(),
            prefix.to_string_lossy().into_owned(),
        ),
    ]
}

/// The label of the case this process runs, in a child of [`run_case`].
const CASE: &str = "NCCL_RS_TEST_PROFILER_CASE";

/// In a child of [`run_case`]: its case's label.
fn child_case() -> Option<String> {
    common::procs::is_child_for(&common::procs::current_test())
        .then(|| std::env::var(CASE).expect("the case of a profiler child"))
}

/// Runs the calling test in a child of its own for case `label`, with `vars`; fails with the
/// child's output if the child fails.
fn run_case(label: &str, vars: &[(String, String)]) {
    let test = common::procs::current_test();
    let mut cmd = common::procs::test_command(&test);
    cmd.envs(vars.iter().map(|(k, v)| (k, v))).env(CASE, label);
    let mut s = common::procs::Supervisor::start(vec![(format!("{test}, {label}"), cmd)]);
    s.wait(common::procs::limit(), &[]);
    s.check(&[]);
}

/// A child's work: two ranks' traffic on the simulator.
fn two_ranks() {
    common::sim();
    traffic(&Ranks::new(common::sim_comms(2)));
}

/// The events of two ranks' traffic for plugin version `v`, every type asked for.
fn events_of_version(v: u32) {
    let prefix = common::plugins::scratch("profiler").join(format!("all-v{v}/log"));
    run_case("traffic", &env(v, ALL, &prefix));
    let logs = logs(&prefix);
    assert_eq!(logs.len(), 2, "a log per rank");
    for (r, lines) in &logs {
        let init = &lines[0];
        assert_eq!(init.kind, "init");
        assert_eq!(init.get("v"), v.to_string());
        assert_eq!(init.get("nranks"), "2");
        assert_eq!(init.get("nodes"), "1");
        assert_eq!(
            init.get("mask"),
            "32767",
            "rank {r}: the mask the plugin set"
        );
        // No event of a type the plugin's version lacks (its build names only its own).
        assert!(
            lines.iter().all(|l| !l.get("type").starts_with("Unknown")),
            "rank {r}: an event of a type v{v} does not have"
        );
        assert_eq!(
            lines.last().unwrap().kind,
            "finalize",
            "rank {r}: finalized last"
        );
        stopped_once(lines);
        let by_handle = starts(lines);
        let parent_type = |l: &Line, key: &str| {
            by_handle
                .get(l.get(key))
                .map_or("none".to_string(), |p| p.get("type").to_string())
        };
        let colls = of_type(lines, "Coll");
        let funcs: Vec<&str> = colls.iter().map(|c| c.get("func")).collect();
        assert_eq!(funcs, ["AllReduce", "AllGather"], "rank {r}");
        let (ar, ag) = (colls[0], colls[1]);
        assert_eq!((ar.get("count"), ar.get("dtype")), ("1001", "ncclFloat32"));
        // The copies in bytes of int8, as NCCL reports them.
        assert_eq!((ag.get("count"), ag.get("dtype")), ("4004", "ncclInt8"));
        assert_eq!(
            (ar.get("seq"), ag.get("seq")),
            ("0", "0"),
            "a counter per collective"
        );
        assert_eq!(ar.get("rank"), r.to_string());
        for c in &colls {
            assert!(
                ["RING", "TREE", "SYMMETRIC"].contains(&c.get("algo")),
                "{c:?}"
            );
            assert!(["LL", "LL128", "SIMPLE"].contains(&c.get("proto")), "{c:?}");
            assert!(c.get("nch").parse::<u32>().unwrap() >= 1, "{c:?}");
            assert!(c.get("nwarps").parse::<u32>().unwrap() >= 1, "{c:?}");
        }
        // Each CTA (channel) of a collective's launch: a KernelCh under its Coll, with the
        // GPU's timer at its start and, as the KernelChStop state, at its stop.
        let channels = of_type(lines, "KernelCh");
        for c in &colls {
            let mut chans: Vec<u32> = channels
                .iter()
                .filter(|k| k.get("parent") == c.get("h"))
                .map(|k| k.get("ch").parse().unwrap())
                .collect();
            chans.sort_unstable();
            let nch: u32 = c.get("nch").parse().unwrap();
            assert_eq!(chans, (0..nch).collect::<Vec<_>>(), "rank {r}: {c:?}");
        }
        assert_eq!(
            channels.len(),
            colls
                .iter()
                .map(|c| c.get("nch").parse::<usize>().unwrap())
                .sum::<usize>()
        );
        for k in &channels {
            let start: u64 = k.get("ptimer").parse().unwrap();
            let stop = lines
                .iter()
                .find(|l| l.kind == "record" && l.get("h") == k.get("h"))
                .unwrap_or_else(|| panic!("rank {r}: {k:?} has no KernelChStop"));
            assert_eq!(stop.get("state"), "22");
            let stop: u64 = stop.get("arg").parse().unwrap();
            assert!(
                start > 0 && stop >= start,
                "rank {r}: {k:?} ran {start}..{stop}"
            );
        }
        let p2ps = of_type(lines, "P2p");
        let dirs: Vec<(&str, &str)> = p2ps
            .iter()
            .map(|p| (p.get("func"), p.get("peer")))
            .collect();
        let other = (1 - r).to_string();
        assert_eq!(
            dirs,
            [("Send", other.as_str()), ("Recv", other.as_str())],
            "rank {r}"
        );
        // The user's count and type, as NCCL reports a P2p.
        for p in &p2ps {
            assert_eq!(
                (p.get("count"), p.get("dtype")),
                ("1001", "ncclFloat32"),
                "{p:?}"
            );
        }
        if v == 4 {
            // No API events; a collective's parent is its launch's group.
            for t in ["GroupApi", "CollApi", "P2pApi", "KernelLaunch"] {
                assert!(of_type(lines, t).is_empty(), "rank {r}: {t} in v4");
            }
            for e in colls.iter().chain(&p2ps) {
                assert_eq!(parent_type(e, "parent"), "Group", "{e:?}");
            }
            continue;
        }
        // Two groups: the AllReduce's own (depth 1) and the user's (depth 2).
        let groups = of_type(lines, "GroupApi");
        let depths: Vec<&str> = groups.iter().map(|g| g.get("depth")).collect();
        assert_eq!(depths, ["1", "2"], "rank {r}");
        for g in &groups {
            let states: Vec<&str> = lines
                .iter()
                .filter(|l| l.kind == "record" && l.get("h") == g.get("h"))
                .map(|l| l.get("state"))
                .collect();
            assert_eq!(states, ["23", "24"], "rank {r}: the group's API states");
        }
        let apis = of_type(lines, "CollApi");
        let api_funcs: Vec<(&str, &str)> = apis
            .iter()
            .map(|a| (a.get("func"), a.get("count")))
            .collect();
        assert_eq!(api_funcs, [("AllReduce", "1001"), ("AllGather", "1001")]);
        for (c, a) in colls.iter().zip(&apis) {
            assert_eq!(
                c.get("parent"),
                a.get("h"),
                "a Coll's parent is its call's CollApi"
            );
            assert_eq!(parent_type(c, "pgroup"), "Group", "{c:?}");
            assert_eq!(a.get("dtype"), "ncclFloat32");
        }
        assert_eq!(parent_type(apis[0], "parent"), "GroupApi");
        assert_eq!(apis[0].get("parent"), groups[0].get("h"));
        assert_eq!(apis[1].get("parent"), groups[1].get("h"));
        let p2p_apis = of_type(lines, "P2pApi");
        assert_eq!(p2p_apis.len(), 2);
        for (p, a) in p2ps.iter().zip(&p2p_apis) {
            assert_eq!(
                p.get("parent"),
                a.get("h"),
                "a P2p's parent is its call's P2pApi"
            );
            assert_eq!(a.get("parent"), groups[1].get("h"));
            assert_eq!(a.get("count"), "1001");
        }
        // A kernel launch per launch: the AllReduce, the AllGather, the sends and receives.
        let launches = of_type(lines, "KernelLaunch");
        assert_eq!(launches.len(), 3, "rank {r}");
        assert_eq!(launches[0].get("parent"), groups[0].get("h"));
        // The order of one call outside a group: its API events end before its launch.
        let pos = |kind: &str, h: &str| {
            lines
                .iter()
                .position(|l| l.kind == kind && l.get("h") == h)
                .unwrap()
        };
        assert!(pos("stop", apis[0].get("h")) < pos("start", launches[0].get("h")));
        assert!(pos("start", ar.get("h")) < pos("stop", groups[0].get("h")));
    }
}

#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_reduce_float_sum",
        nccl_rs_kernel = "nccl_all_gather",
        nccl_rs_kernel = "nccl_p2p"
    )),
    ignore = "needs nccl_all_reduce_float_sum, nccl_all_gather, nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn every_event_of_versions_4_5_and_6() {
    if child_case().is_some() {
        return two_ranks();
    }
    for v in [6, 5, 4] {
        events_of_version(v);
    }
}

#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_reduce_float_sum",
        nccl_rs_kernel = "nccl_all_gather",
        nccl_rs_kernel = "nccl_p2p"
    )),
    ignore = "needs nccl_all_reduce_float_sum, nccl_all_gather, nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn the_mask_decides_what_is_started() {
    if child_case().is_some() {
        return two_ranks();
    }
    // Nothing asked: the context opens and closes, and no event starts.
    let prefix = common::plugins::scratch("profiler").join("mask0/log");
    run_case("mask 0", &env(6, "0", &prefix));
    let all = logs(&prefix);
    assert_eq!(all.len(), 2, "a log per rank");
    for lines in all.values() {
        let kinds: Vec<&str> = lines.iter().map(|l| l.kind.as_str()).collect();
        assert_eq!(kinds, ["init", "finalize"]);
    }
    // Collectives only: their ancestors come too, the kernel launches and sends do not.
    let prefix = common::plugins::scratch("profiler").join("mask-coll/log");
    run_case("mask Coll", &env(6, "2", &prefix));
    let all = logs(&prefix);
    assert_eq!(all.len(), 2, "a log per rank");
    for lines in all.values() {
        stopped_once(lines);
        assert_eq!(of_type(lines, "Coll").len(), 2);
        assert_eq!(of_type(lines, "CollApi").len(), 2);
        assert_eq!(of_type(lines, "GroupApi").len(), 2);
        for t in ["KernelLaunch", "KernelCh", "P2p", "P2pApi"] {
            assert!(of_type(lines, t).is_empty(), "{t} with the mask at Coll");
        }
    }
}

#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_reduce_float_sum",
        nccl_rs_kernel = "nccl_all_gather",
        nccl_rs_kernel = "nccl_p2p"
    )),
    ignore = "needs nccl_all_reduce_float_sum, nccl_all_gather, nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn no_plugin_or_a_failed_init_changes_nothing() {
    if child_case().is_some() {
        return two_ranks();
    }
    let prefix = common::plugins::scratch("profiler").join("failed/log");
    let mut vars = env(6, ALL, &prefix);
    vars.push(("NCCL_RS_TEST_PROFILER_FAIL_INIT".into(), "1".into()));
    run_case("init fails", &vars);
    assert!(logs(&prefix).is_empty(), "a failed init gets no events");
    for name in ["none", "no-such-profiler"] {
        run_case(name, &[("NCCL_PROFILER_PLUGIN".into(), name.into())]);
    }
}

#[test]
#[cfg_attr(
    not(all(nccl_rs_kernel = "nccl_all_gather", nccl_rs_kernel = "nccl_p2p")),
    ignore = "needs nccl_all_gather, nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn copy_engine_collectives_are_ce_events() {
    if child_case().is_some() {
        common::sim();
        return common::onesided::copy_engine_cases(&common::sim_ranks(2));
    }
    let prefix = common::plugins::scratch("profiler").join("ce/log");
    let mut vars = env(6, ALL, &prefix);
    vars.push(("NCCL_CTA_POLICY".into(), "2".into()));
    run_case("copy engines", &vars);
    let all = logs(&prefix);
    assert_eq!(all.len(), 2, "a log per rank");
    for (r, lines) in all {
        stopped_once(&lines);
        let by_handle = starts(&lines);
        // Every copy-engine collective is a CeColl under a CollApi of its own name, with one
        // CeBatch: AllGather and AlltoAll copy to both ranks, Gather and Scatter only at the
        // root (each rank is the root once).
        for func in ["AllGather", "AlltoAll", "Gather", "Scatter"] {
            let ce: Vec<&Line> = of_type(&lines, "CeColl")
                .into_iter()
                .filter(|c| c.get("func") == func)
                .collect();
            assert!(!ce.is_empty(), "rank {r}: no {func} on the copy engines");
            let mut ops_seen = Vec::new();
            for c in ce {
                let api = &by_handle[c.get("parent")];
                assert_eq!(api.get("type"), "CollApi", "{c:?}");
                assert_eq!(api.get("func"), func, "{c:?} under {api:?}");
                let batch = of_type(&lines, "CeBatch")
                    .into_iter()
                    .find(|b| b.get("parent") == c.get("h"))
                    .unwrap_or_else(|| panic!("rank {r}: no CeBatch under {c:?}"));
                let block: usize = c.get("count").parse().unwrap();
                let ops: usize = batch.get("ops").parse().unwrap();
                assert_eq!(batch.get("bytes"), (ops * block).to_string(), "{batch:?}");
                ops_seen.push(ops);
            }
            match func {
                "AllGather" | "AlltoAll" => assert!(ops_seen.iter().all(|&o| o == 2), "{func}"),
                _ => assert!(
                    ops_seen.contains(&0) && ops_seen.contains(&2),
                    "rank {r}: {func} batches {ops_seen:?}"
                ),
            }
        }
    }
}
