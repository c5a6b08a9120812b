//! AllReduce on real GPUs. Ignored where there is no GPU (run them on the GPU host through
//! the GPU bundle (docs/gpu-hosts.md), which passes --include-ignored); there, too few GPUs is a failure,
//! not a pass.

// Every collective through the same harness as the simulator suite.

use crate::common::graphs::FirstUse;
use crate::common::{self, check_all_reduce, Drive, Ranks, ALL_OPS};
use nccl::tune::Proto;
use nccl::{Backend, Comm, DataType, ReduceOp};

const WHY: &str =
    "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)";

pub(crate) fn gpus(n: usize) -> Ranks {
    Ranks::new(Comm::init_all(&devices(n)).unwrap_or_else(|e| panic!("init_all on {n} GPUs: {e}")))
}

/// The devices of `n` ranks in one process: rank r on GPU r. With NCCL_RS_SHARED_GPUS=1 (the
/// kernel lab, for hosts with fewer GPUs) rank r is on GPU r % visible, and stderr says so.
fn devices(n: usize) -> Vec<i32> {
    nccl::cuda::set_backend(Backend::Cuda).expect("choose the CUDA backend");
    let have = nccl::cuda::device_count().unwrap_or_else(|e| panic!("no GPUs: {e}"));
    if std::env::var("NCCL_RS_SHARED_GPUS").is_ok_and(|v| v.trim() == "1") && have < n {
        eprintln!("NCCL_RS_SHARED_GPUS=1: {n} ranks share {have} GPU(s)");
        return (0..n).map(|r| (r % have.max(1)) as i32).collect();
    }
    assert!(have >= n, "this test needs {n} GPUs, {have} visible");
    (0..n as i32).collect()
}

/// The GPU counts a test covers: `all`, or those of them NCCL_RS_TEST_GPUS lists (e.g. `2` on
/// a host of two GPUs; a count it names that `all` lacks is an error, never a silent pass).
pub(crate) fn counts(all: &[usize]) -> Vec<usize> {
    let Ok(list) = std::env::var("NCCL_RS_TEST_GPUS") else {
        return all.to_vec();
    };
    let picked: Vec<usize> = list
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("NCCL_RS_TEST_GPUS: a comma-separated list of counts")
        })
        .collect();
    assert!(
        picked.iter().all(|n| all.contains(n)),
        "NCCL_RS_TEST_GPUS={list}: this test covers {all:?}"
    );
    // A pass then covers less than the test's name says: each count left out is a skip.
    for n in all.iter().filter(|n| !picked.contains(n)) {
        common::skip::record(
            &format!("NCCL_RS_TEST_GPUS={list}"),
            &format!("{} on {n} GPUs", common::procs::current_test()),
        );
    }
    picked
}

/// In a child process of `common::procs::run`: its one rank, on the GPU of its rank number
/// (with NCCL_RS_SHARED_GPUS=1 on fewer GPUs, rank % visible: processes then share a GPU
/// through CUDA IPC).
pub(crate) fn child_rank() -> Option<Ranks> {
    let (rank, nranks, id) = common::procs::child()?;
    nccl::init_logging(); // NCCL_DEBUG for the rank processes
    let dev = nccl::Device::open(devices(nranks)[rank]).expect("open the GPU");
    let comm = Comm::init_rank_on(dev, nranks, &id, rank).expect("init_rank in a child process");
    Some(Ranks::new(vec![comm]))
}

const COUNTS: [usize; 9] = [0, 1, 2, 3, 7, 13, 1021, 65_537, (1 << 20) + 3];

fn matrix(n: usize) {
    common::type_op_matrix(
        &gpus(n),
        &COUNTS,
        if n == 2 {
            Drive::Group
        } else {
            Drive::OneThread
        },
    );
}

#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn every_type_op_count_on_2_gpus() {
    matrix(2);
}

#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn every_type_op_count_on_4_gpus() {
    matrix(4);
}

#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn thread_per_gpu_and_large_buffers() {
    for n in counts(&[2, 4]) {
        let ranks = gpus(n);
        for (count, dt) in [
            (1usize << 28, DataType::Float32),
            (1 << 27, DataType::Int64),
            (12_345_677, DataType::Bfloat16),
        ] {
            for in_place in [false, true] {
                check_all_reduce(
                    &ranks,
                    count,
                    dt,
                    ReduceOp::SUM,
                    in_place,
                    count as u64,
                    Drive::ThreadPerRank,
                )
                .unwrap_or_else(|e| panic!("{n} GPUs: {e}"));
            }
        }
    }
}

#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn process_per_gpu() {
    if let Some(ranks) = child_rank() {
        for dt in DataType::ALL {
            for op in ALL_OPS {
                for count in [1usize, 997, (1 << 22) + 1] {
                    check_all_reduce(&ranks, count, dt, op, count % 2 == 0, 11, Drive::OneThread)
                        .unwrap_or_else(|e| panic!("{e}"));
                }
            }
        }
        return;
    }
    let _ = WHY;
    for n in counts(&[2, 4]) {
        common::procs::run(n, &[]);
    }
}

/// Ranks as processes on 2 nodes (`NCCL_HOSTID`), so that every ring crosses the network
/// transport and its proxy threads (loopback sockets, buffers in pinned host memory): every
/// collective, both placements, the tuner's choices (LL below its limits, Simple above), random
/// data, poisoned outputs. With NCCL_RS_SHARED_GPUS=1 the ranks may share one GPU (start the MPS
/// daemon first): passed so on one H200, 2x1 and 2x2 (results/h200-gpu-two-nodes-test-s18.txt).
#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn process_per_rank_on_two_nodes() {
    if let Some(ranks) = child_rank() {
        let n = ranks.comms[0].count();
        let t0 = std::time::Instant::now();
        for (i, coll) in nccl_device::abi::Coll::ALL.into_iter().enumerate() {
            for count in [1usize, 4099, (1 << 20) + 5] {
                for in_place in [false, true] {
                    // Progress, shown if the harness kills a rank that is stuck.
                    eprintln!(
                        "[{:?}] {} count {count} in_place {in_place}",
                        t0.elapsed(),
                        coll.name()
                    );
                    common::check_collective(
                        &ranks,
                        coll,
                        count,
                        DataType::Float32,
                        ReduceOp::SUM,
                        i % n,
                        in_place,
                        count as u64 + i as u64,
                        Drive::OneThread,
                    )
                    .unwrap_or_else(|e| panic!("{} count {count}: {e}", coll.name()));
                }
            }
        }
        return;
    }
    // NCCL_RS_TEST_SHAPES (e.g. `2x1`) narrows the node shapes for a first look on a new host.
    let shapes: Vec<(usize, usize)> = match std::env::var("NCCL_RS_TEST_SHAPES") {
        Ok(list) => list
            .split(',')
            .map(|s| {
                let (a, b) = s
                    .trim()
                    .split_once('x')
                    .expect("NCCL_RS_TEST_SHAPES: NxR,...");
                (
                    a.parse().expect("nodes"),
                    b.parse().expect("ranks per node"),
                )
            })
            .collect(),
        Err(_) => vec![(2, 1), (2, 2)],
    };
    for (nodes, per_node) in shapes {
        for proto in ["LL", "LL128", "Simple"] {
            let env = [("NCCL_SOCKET_IFNAME", "lo"), ("NCCL_PROTO", proto)];
            common::procs::run_nodes(nodes, per_node, &env);
        }
    }
}

#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn bad_buffers_are_rejected() {
    let devs = devices(2);
    let ranks = gpus(2);
    let c0 = &ranks.comms[0];
    let mine = c0.device().alloc(4096).expect("alloc on GPU 0");
    let s = ranks.streams[0];
    if devs[0] == devs[1] {
        // "Another GPU's buffer" needs a second GPU: on a shared one that call is legal, and
        // the lone rank's AllReduce would wait for rank 1 for ever. The other cases still run.
        common::skip::record(
            "ranks share a GPU (NCCL_RS_SHARED_GPUS=1)",
            &format!(
                "bad_buffers_are_rejected: the other-GPU case (both on GPU {})",
                devs[0]
            ),
        );
    } else {
        let other = ranks.comms[1].device().alloc(4096).expect("alloc on GPU 1");
        let err = unsafe {
            c0.all_reduce_raw(
                other.ptr(),
                mine.ptr(),
                16,
                DataType::Float32,
                ReduceOp::SUM,
                s,
            )
        }
        .unwrap_err();
        assert_eq!(err.code, nccl::NcclResult::InvalidArgument, "{err}");
        assert!(err.message.contains("device 1"), "{err}");
    }
    let host = [0u8; 64];
    let err = unsafe {
        c0.all_reduce_raw(
            host.as_ptr() as u64,
            mine.ptr(),
            16,
            DataType::Float32,
            ReduceOp::SUM,
            s,
        )
    }
    .unwrap_err();
    assert_eq!(err.code, nccl::NcclResult::InvalidArgument, "{err}");
    let err = unsafe {
        c0.all_reduce_raw(
            mine.ptr() + 2,
            mine.ptr(),
            16,
            DataType::Float32,
            ReduceOp::SUM,
            s,
        )
    }
    .unwrap_err();
    assert!(err.message.contains("aligned"), "{err}");
}

#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn every_collective_on_2_and_4_gpus() {
    for n in counts(&[2, 4]) {
        let drive = if n == 2 {
            Drive::Group
        } else {
            Drive::OneThread
        };
        common::collective_matrix(&gpus(n), &[1, 13, 1021, (1 << 20) + 5], drive);
    }
}

#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn send_recv_all_to_all_on_2_and_4_gpus() {
    for n in counts(&[2, 4]) {
        let drive = if n == 2 {
            Drive::OneThread
        } else {
            Drive::ThreadPerRank
        };
        let ranks = gpus(n);
        for scale in common::matrix_counts(&[0usize, 1, 1000, 3 << 20]) {
            common::check_all_to_all(&ranks, scale, drive).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

/// Every collective and the AllReduce type/op matrix with one algorithm or protocol forced,
/// a process per GPU: the tree AllReduce, LL, LL128, Simple everywhere, and Simple steps with a
/// publishing warp (NCCL_RS_SIMPLE_PUBLISHER=1).
#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn forced_algorithms_and_protocols() {
    if let Some(ranks) = child_rank() {
        common::collective_matrix(&ranks, &[1, 4099, (1 << 20) + 3], Drive::OneThread);
        common::type_op_matrix(&ranks, &[13, 65_537, (1 << 20) + 3], Drive::OneThread);
        return;
    }
    let t0 = std::time::Instant::now();
    // NCCL_RS_TEST_FORCED=LL128 (a value's or a variable's exact text) runs only that case.
    let only = std::env::var("NCCL_RS_TEST_FORCED").ok();
    let publisher: &[(&str, &str)] = &[("NCCL_RS_SIMPLE_PUBLISHER", "1"), ("NCCL_PROTO", "Simple")];
    for forced in [
        &[("NCCL_ALGO", "allreduce:tree")][..],
        &[("NCCL_PROTO", "LL")],
        &[("NCCL_PROTO", "LL128")],
        &[("NCCL_PROTO", "Simple")],
        publisher,
    ]
    .into_iter()
    .filter(|f| only.as_deref().is_none_or(|o| o == f[0].1 || o == f[0].0))
    {
        for n in counts(&[2, 4]) {
            common::procs::run(n, forced);
            // Progress for --nocapture runs on the GPU host (a stuck case shows which).
            let what: Vec<String> = forced.iter().map(|(k, v)| format!("{k}={v}")).collect();
            eprintln!(
                "{} on {n} GPUs passed at {:.1} s",
                what.join(" "),
                t0.elapsed().as_secs_f64()
            );
        }
    }
}

/// The forced cases of [`forced_algorithms_and_protocols`] with every rank in this process
/// (so NCCL_RS_SHARED_GPUS=1 runs them on fewer GPUs): every collective, type and reduction
/// through the tree AllReduce, LL, LL128 and Simple; with a publishing warp, the tree and the
/// ring with Simple, and send/recv.
#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn forced_algorithms_and_protocols_in_one_process() {
    // NCCL_RS_TEST_FORCED=LL128 runs only that protocol's case, =publisher the publisher's.
    // Each case is a child process started with its parameters (rank 0's at init rule the
    // communicator; nothing sets them in this process).
    let only = std::env::var("NCCL_RS_TEST_FORCED").ok();
    let all: [(&str, &[(&str, &str)]); 6] = [
        (
            "tree",
            &[("NCCL_ALGO", "allreduce:tree"), ("NCCL_PROTO", "Simple")],
        ),
        ("LL", &[("NCCL_ALGO", "ring"), ("NCCL_PROTO", "LL")]),
        ("LL128", &[("NCCL_ALGO", "ring"), ("NCCL_PROTO", "LL128")]),
        ("Simple", &[("NCCL_ALGO", "ring"), ("NCCL_PROTO", "Simple")]),
        (
            "publisher",
            &[
                ("NCCL_ALGO", "allreduce:tree"),
                ("NCCL_PROTO", "Simple"),
                ("NCCL_RS_SIMPLE_PUBLISHER", "1"),
            ],
        ),
        (
            "publisher, ring",
            &[
                ("NCCL_ALGO", "ring"),
                ("NCCL_PROTO", "Simple"),
                ("NCCL_RS_SIMPLE_PUBLISHER", "1"),
            ],
        ),
    ];
    let cases: Vec<_> = all
        .into_iter()
        .filter(|(name, _)| {
            let name = if name.starts_with("publisher") {
                "publisher"
            } else {
                name
            };
            only.as_deref().is_none_or(|o| o == name)
        })
        .collect();
    for (name, _) in all.iter().filter(|c| !cases.iter().any(|k| k.0 == c.0)) {
        common::skip::record(
            &format!("NCCL_RS_TEST_FORCED={}", only.as_deref().unwrap_or("")),
            &format!("forced_algorithms_and_protocols_in_one_process: case {name}"),
        );
    }
    common::procs::isolated_cases(&cases, |_| {
        let var = |k: &str| std::env::var(k).unwrap_or_default();
        let (algo, proto, publisher) = (
            var("NCCL_ALGO"),
            var("NCCL_PROTO"),
            var("NCCL_RS_SIMPLE_PUBLISHER"),
        );
        let publisher = if publisher == "1" { 1 } else { 0 };
        for n in counts(&[2, 4]) {
            let ranks = gpus(n);
            assert_eq!(
                ranks.comms[0].shape().kernel_flags & nccl_device::abi::FLAG_SIMPLE_PUBLISHER,
                publisher
            );
            let want = match proto.as_str() {
                "LL" => Proto::Ll,
                "LL128" => Proto::Ll128,
                _ => Proto::Simple,
            };
            let big = ranks.comms[0]
                .tuning(nccl::Coll::AllReduce, 1 << 30)
                .expect("a choice");
            assert_eq!(big.proto, want, "NCCL_PROTO={proto} must hold at 1 GiB");
            common::collective_matrix(&ranks, &[1, 4099, (1 << 20) + 3], Drive::Group);
            common::type_op_matrix(&ranks, &[13, 65_537, (1 << 20) + 3], Drive::OneThread);
            if publisher == 1 {
                common::check_all_to_all(&ranks, 300_000, Drive::OneThread)
                    .unwrap_or_else(|e| panic!("send/recv with a publisher: {e}"));
            }
            eprintln!(
                "NCCL_ALGO={algo} NCCL_PROTO={proto} NCCL_RS_SIMPLE_PUBLISHER={publisher} \
                 on {n} ranks passed"
            );
        }
    });
}

/// CUDA graphs: every rank's AllReduce, AllGather and send/recv ring captured in one group,
/// replayed 100 times with new inputs, direct calls on other streams in between; then replays
/// and direct calls in flight together, ordered by the communicator alone.
#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn graphs_replayed_100_times_on_2_and_4_gpus() {
    for n in counts(&[2, 4]) {
        common::graphs::capture_and_replay(&gpus(n), 100, FirstUse::BeforeCapture)
            .unwrap_or_else(|e| panic!("{n} GPUs: {e}"));
        common::graphs::replays_interleaved_with_direct_calls(&gpus(n), 50)
            .unwrap_or_else(|e| panic!("{n} GPUs, replays beside direct calls: {e}"));
    }
}

/// A first use of communicators inside captures on blocking streams: the runtime allocates,
/// zeroes and copies (send/recv connections) and loads kernel modules while the captures are
/// open, none of it on the legacy stream (that would invalidate the captures); the graphs
/// then replay 20 times. One GPU covers allocations, copies and module loads; 2 and 4 add
/// connections.
#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn first_use_inside_blocking_captures_on_1_2_and_4_gpus() {
    for n in counts(&[1, 2, 4]) {
        let comms = Comm::init_all(&devices(n)).unwrap_or_else(|e| panic!("init_all on {n}: {e}"));
        common::graphs::capture_and_replay(&Ranks::blocking(comms), 20, FirstUse::InsideCapture)
            .unwrap_or_else(|e| panic!("{n} GPUs: {e}"));
    }
}

/// Registered ring collectives on 2 (and 4) GPUs in one process: AllGather, Broadcast and
/// AllReduce between registered output buffers write what each rank passes on straight into its
/// successor's output (per-channel counts of those steps; AllReduce's partial sums too, out of
/// place), and ReduceScatter and Reduce their last hop (out of place), where both ends of a
/// connection registered and the tuner runs a Simple ring, with the results of the FIFO path
/// (random data, poisoned outputs, bytes around them untouched); mixed registration falls back
/// to the FIFO.
#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn registered_ring_collectives_on_2_and_4_gpus() {
    use common::register::{coll_round, expected_direct, Who};
    use nccl_device::abi::Coll;
    for n in counts(&[2, 4]) {
        let ranks = gpus(n);
        let comms = &ranks.comms;
        let mut seed = 0;
        // Large enough for Simple rings whose 32 channels' slices fill a step (1 MiB; 512 KiB
        // for Broadcast), one odd.
        for (coll, count) in [
            (Coll::AllGather, 33 << 20),
            (Coll::AllGather, (40 << 20) + 1),
            (Coll::AllReduce, 12 << 20),
            (Coll::Broadcast, (64 << 20) + 3),
        ] {
            let all: u64 = comms
                .iter()
                .flat_map(|c| expected_direct(c, coll, |_| true, count, false, true))
                .sum();
            assert!(
                all > 0,
                "{} of {count} on {n} GPUs takes no direct step",
                coll.name()
            );
            for who in [Who::All, Who::Even, Who::None] {
                for in_place in [false, true] {
                    seed += 1;
                    let t = std::time::Instant::now();
                    let got = coll_round(comms, coll, who, count, in_place, seed);
                    round_took(n, coll.name(), who, in_place, t);
                    for (c, g) in comms.iter().zip(&got) {
                        let want =
                            expected_direct(c, coll, |r| who.registers(r), count, in_place, true);
                        assert_eq!(
                            g,
                            &want,
                            "{} on {n} GPUs, {who:?}, count {count}, in place {in_place}: \
                             rank {}'s direct steps per channel",
                            coll.name(),
                            c.rank()
                        );
                    }
                }
            }
        }
        // The reductions' last hop: float sums and integer averages, counts whose 32 channels'
        // slices fill a step (1 MiB for ReduceScatter, 512 KiB for Reduce), odd.
        use common::register::reduction_round_as_modelled;
        use nccl::{DataType, ReduceOp};
        for (coll, count) in [
            (Coll::ReduceScatter, (9 << 20) + 3),
            (Coll::Reduce, (5 << 20) + 1),
        ] {
            for who in [Who::All, Who::Even, Who::None] {
                for in_place in [false, true] {
                    for (dt, op) in [
                        (DataType::Float32, ReduceOp::SUM),
                        (DataType::Int32, ReduceOp::AVG),
                    ] {
                        seed += 1;
                        let t = std::time::Instant::now();
                        let got = reduction_round_as_modelled(
                            comms, coll, dt, op, who, count, in_place, seed,
                        );
                        round_took(n, coll.name(), who, in_place, t);
                        if who == Who::All && !in_place {
                            assert!(
                                got.iter().flatten().sum::<u64>() > 0,
                                "{} on {n} GPUs took no direct step",
                                coll.name()
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Says on stderr how long one round of a long GPU test took (seen with `--nocapture`).
fn round_took(
    n: usize,
    what: &str,
    who: common::register::Who,
    in_place: bool,
    t: std::time::Instant,
) {
    eprintln!(
        "{n} ranks, {what}, {who:?}, in place {in_place}: {:.2} s",
        t.elapsed().as_secs_f64()
    );
}

/// The one-node tree AllReduce (forced: NCCL_ALGO=allreduce:tree, Simple) on registered
/// outputs on 2 (and 4) GPUs in one process: the way down writes finished chunks straight into
/// the child's output, out of place the way up writes partial sums into the parent's; each
/// channel's direct steps match the model and the results those of the FIFO path (random
/// data, poisoned outputs); mixed registration falls back to the FIFO.
#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn registered_tree_all_reduce_on_2_and_4_gpus() {
    use common::register::{reduction_round_as_modelled, Who};
    use nccl::{DataType, ReduceOp};
    use nccl_device::abi::Coll;
    // In a child process started with the forced algorithm and protocol.
    let env = [("NCCL_ALGO", "allreduce:tree"), ("NCCL_PROTO", "Simple")];
    common::procs::isolated(&env, &[], || {
        for n in counts(&[2, 4]) {
            let ranks = gpus(n);
            let comms = &ranks.comms;
            let choice = comms[0].tuning(nccl::Coll::AllReduce, 4 << 20).unwrap();
            assert_eq!(choice.algo, nccl::Algo::Tree, "{n} GPUs: the forced choice");
            assert!(
                comms[0].tree_chain().is_some(),
                "{n} GPUs: no one-node chain"
            );
            let mut seed = 300;
            // Slices of 32 channels over a step (the chain's 128 KiB chunks), one odd; and one
            // under a step (no handshake).
            for count in [(4 << 20) + 5, 2 << 20, 4099] {
                for who in [Who::All, Who::Even, Who::None] {
                    for in_place in [false, true] {
                        for (dt, op) in [
                            (DataType::Float32, ReduceOp::SUM),
                            (DataType::Int32, ReduceOp::AVG),
                        ] {
                            seed += 1;
                            let got = reduction_round_as_modelled(
                                comms,
                                Coll::AllReduce,
                                dt,
                                op,
                                who,
                                count,
                                in_place,
                                seed,
                            );
                            if who == Who::All && count >= 2 << 20 {
                                assert!(
                                    got.iter().flatten().sum::<u64>() > 0,
                                    "tree AllReduce on {n} GPUs took no direct step"
                                );
                            }
                        }
                    }
                }
            }
        }
    });
}

/// Registered send/recv on 2 (and 4) GPUs in one process: a ring of messages over one FIFO per
/// connection goes direct (the sender writes into the receiver's buffer) exactly where both ends
/// registered, with the bytes of the FIFO path (random data, poisoned receive buffers, bytes
/// around them untouched); mixed registration falls back to the FIFO.
#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn registered_send_recv_on_2_and_4_gpus() {
    use common::register::{check_steps, ring_round, Who};
    for n in counts(&[2, 4]) {
        let ranks = gpus(n);
        let comms = &ranks.comms;
        let conns = 64usize.div_ceil(n).min(16);
        let fifo = 8 * comms[0].shape().p2p_slot_bytes as usize;
        ring_round(comms, Who::None, 4096, 1);
        for (k, who) in [Who::All, Who::Even, Who::None, Who::All]
            .into_iter()
            .enumerate()
        {
            let base = conns * fifo + 4096 * k;
            let steps = ring_round(comms, who, base, 11 + k as u64);
            check_steps(comms, who, base, &steps);
        }
    }
}

/// Registered buffers of CUDA's virtual memory API (`ncclMemAlloc`: `cuMemCreate` with a
/// POSIX descriptor handle) between ranks that are processes, 2 of them: such memory has no
/// `cuIpcGetMemHandle` handle, so a peer maps it from the allocation's descriptor (passed over
/// the owner's Unix socket with SCM_RIGHTS, imported with `cuMemImportFromShareableHandle`).
/// Send/recv into the successor's registered buffer and a Simple ring AllReduce into
/// registered outputs go direct (exact direct step counts of the last of several rounds, and
/// some direct AllReduce steps); with `NCCL_RS_VMM_IPC=0` the same calls copy through the
/// FIFOs. Random data, poisoned outputs and the bytes after them checked in every round.
/// On a host with one GPU: `NCCL_RS_SHARED_GPUS=1` with the MPS daemon running (both ranks on
/// GPU 0; their kernels must run at once).
#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn registered_vmm_buffers_across_processes_on_gpus() {
    // 2 connections per peer, 64 KiB slots: a message of three FIFOs per connection goes
    // direct; an AllReduce of 48 MiB fills a Simple step on every channel.
    const SLOT: usize = 64 << 10;
    if let Some(ranks) = child_rank() {
        let on = std::env::var("NCCL_RS_VMM_IPC").as_deref() != Ok("0");
        common::register::vmm_rounds(&ranks.comms[0], 3 * 8 * SLOT * 2, 12 << 20, on);
        return;
    }
    for on in ["1", "0"] {
        common::procs::run(
            2,
            &[
                ("NCCL_P2P_NVL_CHUNKSIZE", "65536"),
                ("NCCL_RS_P2P_CONNS", "2"),
                ("NCCL_PROTO", "Simple"),
                ("NCCL_ALGO", "Ring"),
                ("NCCL_LOCAL_REGISTER", "1"),
                ("NCCL_NVLS_ENABLE", "0"),
                ("NCCL_RS_VMM_IPC", on),
            ],
        );
    }
}

/// Graph registration across processes on GPUs (2 ranks; on one GPU with
/// `NCCL_RS_SHARED_GPUS=1` and the MPS daemon running): a capture registers the buffers peers
/// write into through CUDA's user objects and sends their records, the peer's capture waits
/// for them, and every replay of a Simple ring AllGather, AllReduce and Broadcast and of a
/// send/recv ring goes direct on buffers nobody registered (exact step counts); after the
/// graph is destroyed (CUDA runs the user object's release) the next call copies and nothing
/// stays registered. Random data, poisoned outputs, every round checked.
#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn captured_buffers_go_direct_across_processes_on_gpus() {
    const SLOT: usize = 64 << 10;
    if let Some(ranks) = child_rank() {
        let c = &ranks.comms[0];
        common::register::captured_p2p_rounds(c, 3 * 8 * SLOT * 2, 2, SLOT);
        let colls = [
            // Every channel's slice fills a step (a MiB) on an H200's 32 channels.
            (nccl_device::abi::Coll::AllGather, 64 << 20),
            (nccl_device::abi::Coll::AllReduce, 16 << 20),
            (nccl_device::abi::Coll::Broadcast, 64 << 20),
        ];
        common::register::captured_coll_rounds(c, &colls);
        return;
    }
    common::procs::run(
        2,
        &[
            ("NCCL_P2P_NVL_CHUNKSIZE", "65536"),
            ("NCCL_RS_P2P_CONNS", "2"),
            ("NCCL_PROTO", "Simple"),
            ("NCCL_ALGO", "Ring"),
            ("NCCL_LOCAL_REGISTER", "1"),
            ("NCCL_GRAPH_REGISTER", "1"),
            ("NCCL_NVLS_ENABLE", "0"),
        ],
    );
}

/// Issue 23 on GPUs: a rank process killed (SIGKILL) while every rank's AllReduces run, 2 and
/// The double binary tree across nodes on registered outputs, on GPUs: ranks as processes
/// grouped into nodes by `NCCL_HOSTID` (sockets over loopback between nodes, p2p inside), every
/// shape of [`common::register::TREE_ACROSS_NODES`] (NCCL_RS_TEST_SHAPES=`NxR,...` keeps those
/// of the named sizes): the links inside a node go direct both ways where both ends
/// registered, each channel's direct steps as modelled, every result the sum. With
/// NCCL_RS_SHARED_GPUS=1 the ranks may share one GPU (start the MPS daemon first).
#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn registered_tree_across_nodes_on_gpus() {
    if let Some(ranks) = child_rank() {
        common::register::registered_tree_across_nodes(&ranks.comms[0]);
        return;
    }
    let only = std::env::var("NCCL_RS_TEST_SHAPES").ok();
    for shape in common::register::TREE_ACROSS_NODES {
        let name = format!("{}x{}", shape.nodes, shape.per_node);
        if only
            .as_ref()
            .is_some_and(|l| !l.split(',').any(|s| s.trim() == name))
        {
            continue;
        }
        let env = shape.env();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        common::procs::run_nodes(shape.nodes, shape.per_node, &env);
    }
}

/// 2x2 ranks as 2 nodes (with NCCL_RS_SHARED_GPUS=1 they may share one GPU; start MPS first).
/// Every survivor's async error names the dead rank within the bound, its stuck kernels end on
/// abort, and abort, the stream and destroy all return.
#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn killed_peer_mid_collective_on_gpus() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        nccl::init_logging();
        let dev = nccl::Device::open(devices(nranks)[rank]).expect("open the GPU");
        let comm = Comm::init_rank_on(dev, nranks, &id, rank).expect("init_rank across nodes");
        // 100 AllReduces of 64 MiB: about a second of work over loopback sockets.
        let limit = std::time::Duration::from_secs(30);
        common::faults::killed_mid_collective(comm, nranks - 1, 16 << 20, 100, limit);
        return;
    }
    for (nodes, per_node) in [(2, 1), (2, 2)] {
        common::procs::run_nodes_with_victim(
            nodes,
            per_node,
            &[("NCCL_SOCKET_IFNAME", "lo")],
            nodes * per_node - 1,
        );
    }
}
