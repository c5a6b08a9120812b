//! NVLS (NVLink SHARP) on the CPU simulator: the simulator's multicast memory runs the NVLS
//! AllReduce, ReduceScatter and AllGather kernels (`multimem.ld_reduce` / `multimem.st` through
//! a multicast-bound scratch) on 2, 4 and 8 ranks, every type and reduction, random data,
//! poisoned outputs, in and out of place, odd counts; a (type, reduction) the switch cannot
//! reduce falls back to the ring and is still right; NCCL_NVLS_ENABLE other than exactly 1
//! never creates a multicast object.
//!
//! The tests turn NVLS on with the simulator's own switch (NCCL_RS_SIM_NVLS=1, which the CUDA
//! backend never reads), never with NCCL_NVLS_ENABLE: nothing here can turn multicast on for a
//! real GPU. NCCL_NVLS_ENABLE's own values are checked to keep it off. These variables and
//! NCCL_ALGO are read at communicator creation, and the simulator's counters of NVLS launches
//! and multicast objects are per process: every test runs in child processes started with its
//! settings, alone.

use crate::common::{self, check_collective, Checked, Drive, Ranks, ALL_OPS};
use nccl::cuda::sim;
use nccl::{Algo, Comm, DataType, RedOpKind, ReduceOp};
use nccl_device::abi::Coll;

/// Small scratch halves (4 KiB) make calls of a few thousand elements take many pieces, so
/// both halves and the barriers turn over.
const CHUNK: (&str, &str) = ("NCCL_NVLS_CHUNKSIZE", "4096");
/// NVLS on through the simulator's switch, and the only algorithm allowed.
const SIM_NVLS_ONLY: &[(&str, &str)] = &[CHUNK, ("NCCL_RS_SIM_NVLS", "1"), ("NCCL_ALGO", "NVLS")];

fn comms(n: usize) -> Ranks {
    common::sim_ranks(n)
}

/// The PTX ISA's multimem.ld_reduce table for sm_90, written out here independently of the
/// library's: add on 32/64-bit integers and f16, bf16, f32, f64; min/max on 32/64-bit integers
/// and the half types; Sum, Avg and PreMulSum add; Prod never; no 8-bit type.
fn switch_reduces(dt: DataType, op: ReduceOp) -> bool {
    use DataType::*;
    let ints = matches!(dt, Int32 | Uint32 | Int64 | Uint64);
    match op.kind() {
        RedOpKind::Sum | RedOpKind::Avg | RedOpKind::PreMulSum => {
            ints || matches!(dt, Float16 | Bfloat16 | Float32 | Float64)
        }
        RedOpKind::Max | RedOpKind::Min => ints || matches!(dt, Float16 | Bfloat16),
        RedOpKind::Prod => false,
    }
}

/// One checked call; asserts whether it ran on NVLS (one launch per rank) or not at all.
#[allow(clippy::too_many_arguments)]
fn check(
    ranks: &Ranks,
    coll: Coll,
    count: usize,
    dt: DataType,
    op: ReduceOp,
    in_place: bool,
    seed: u64,
    want_nvls: bool,
) {
    let n = ranks.comms.len() as u64;
    let before = sim::nvls_launches();
    let checked = check_collective(
        ranks,
        coll,
        count,
        dt,
        op,
        0,
        in_place,
        seed,
        Drive::ThreadPerRank,
    )
    .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
    if checked == Checked::Skipped {
        return;
    }
    let launched = sim::nvls_launches() - before;
    assert_eq!(
        launched,
        if want_nvls { n } else { 0 },
        "{} {} {op:?} count {count} on {n} ranks: NVLS launches",
        coll.name(),
        dt.name()
    );
}

fn matrix(n: usize, counts: &[usize]) {
    let ranks = comms(n);
    for c in &ranks.comms {
        assert_eq!(
            c.tuning(nccl::Coll::AllReduce, 1 << 20)
                .expect("a choice")
                .algo,
            Algo::Nvls
        );
    }
    let mut seed = 1000 * n as u64;
    for (k, dt) in DataType::ALL.into_iter().enumerate() {
        for (i, &count) in counts.iter().enumerate() {
            seed += 1;
            let in_place = (i + k) % 2 == 1;
            // AllGather moves bytes: NVLS whatever the type.
            check(
                &ranks,
                Coll::AllGather,
                count,
                dt,
                ReduceOp::SUM,
                in_place,
                seed,
                true,
            );
            for op in ALL_OPS {
                let nvls = switch_reduces(dt, op);
                for coll in [Coll::AllReduce, Coll::ReduceScatter] {
                    check(&ranks, coll, count, dt, op, in_place, seed, nvls);
                }
            }
        }
    }
}

#[test]
fn two_ranks_every_type_and_reduction() {
    common::procs::isolated(SIM_NVLS_ONLY, &[], || matrix(2, &[1, 37, 5001]));
}

#[test]
fn four_ranks_every_type_and_reduction() {
    common::procs::isolated(SIM_NVLS_ONLY, &[], || matrix(4, &[3, 1025, 9999]));
}

#[test]
fn eight_ranks_every_type_and_reduction() {
    common::procs::isolated(SIM_NVLS_ONLY, &[], || matrix(8, &[1, 4097]));
}

/// Every collective, NVLS ones between ring ones, in and out of place, on one communicator:
/// the NVLS barrier and piece counters carry across launches of every kind.
#[test]
fn nvls_between_ring_collectives_in_and_out_of_place() {
    // Simple only: between Simple's ring and NVLS the model takes NVLS by itself (at these
    // sizes it takes the ring's LL over both). NCCL_ALGO unset.
    let env = [CHUNK, ("NCCL_RS_SIM_NVLS", "1"), ("NCCL_PROTO", "Simple")];
    common::procs::isolated(&env, &["NCCL_ALGO"], || {
        let ranks = comms(4);
        let launched = sim::nvls_launches();
        let mut seed = 77;
        for round in 0..2 {
            for coll in Coll::ALL {
                for in_place in [false, true] {
                    seed += 1;
                    let (dt, op) = [
                        (DataType::Float32, ReduceOp::SUM),
                        (DataType::Bfloat16, ReduceOp::MAX),
                        (DataType::Int64, ReduceOp::MIN),
                    ][(seed % 3) as usize];
                    check_collective(
                        &ranks,
                        coll,
                        3000 + round,
                        dt,
                        op,
                        1,
                        in_place,
                        seed,
                        Drive::Group,
                    )
                    .unwrap_or_else(|e| panic!("{e}"));
                }
            }
        }
        // The tuner took NVLS by itself (NCCL_ALGO unset).
        assert!(sim::nvls_launches() > launched, "no call ran on NVLS");
    });
}

/// NCCL_NVLS_ENABLE unset, 0, or anything but exactly 1: no multicast object is created (the
/// simulator counts them), the tuner never offers NVLS, and NCCL_ALGO=NVLS leaves nothing to
/// run (an error, not a hang). Exactly 1 creates one per communicator.
#[test]
fn nvls_enable_other_than_one_never_creates_a_multicast_object() {
    // Per value of NCCL_NVLS_ENABLE (unset, or other than exactly 1): communicators with the
    // tuner's choices, then with NCCL_ALGO=NVLS; last the simulator's switch on.
    let values = [
        ("unset", ""),
        ("0", "0"),
        ("2", "2"),
        ("yes", "yes"),
        (" 1", " 1"),
    ];
    let mut envs = Vec::new();
    for (label, v) in values {
        envs.push((label.to_string(), vec![CHUNK, ("NCCL_NVLS_ENABLE", v)]));
        envs.push((
            format!("{label}, NCCL_ALGO=NVLS"),
            vec![CHUNK, ("NCCL_NVLS_ENABLE", v), ("NCCL_ALGO", "NVLS")],
        ));
    }
    envs.push(("switch on".into(), vec![CHUNK, ("NCCL_RS_SIM_NVLS", "1")]));
    let cases: Vec<(&str, &[(&str, &str)])> =
        envs.iter().map(|(l, e)| (l.as_str(), &e[..])).collect();
    common::procs::isolated_cases(&cases, |case| {
        let env = std::env::var("NCCL_NVLS_ENABLE").ok();
        let created = sim::multicast_objects_created();
        let launched = sim::nvls_launches();
        if case == "switch on" {
            let ranks = comms(4);
            assert_eq!(sim::multicast_objects_created(), created + 1);
            drop(ranks);
            return;
        }
        if case.ends_with("NCCL_ALGO=NVLS") {
            let ranks = comms(2);
            let r = check_collective(
                &ranks,
                Coll::AllReduce,
                16,
                DataType::Float32,
                ReduceOp::SUM,
                0,
                false,
                6,
                Drive::OneThread,
            );
            // (A build without the kernel refuses the call before the algorithm is chosen.)
            if common::skip::built(Coll::AllReduce, DataType::Float32, ReduceOp::SUM) {
                assert!(r.is_err(), "NCCL_ALGO=NVLS without NVLS must fail the call");
            }
            drop(ranks);
            assert_eq!(
                sim::multicast_objects_created(),
                created,
                "NCCL_NVLS_ENABLE={env:?}"
            );
            return;
        }
        let ranks = comms(4);
        for c in &ranks.comms {
            for bytes in [8, 1 << 20, 1 << 30] {
                let t = c.tuning(nccl::Coll::AllReduce, bytes).expect("a choice");
                assert_ne!(t.algo, Algo::Nvls, "NCCL_NVLS_ENABLE={env:?}");
            }
        }
        for coll in [Coll::AllReduce, Coll::ReduceScatter, Coll::AllGather] {
            check_collective(
                &ranks,
                coll,
                1001,
                DataType::Float32,
                ReduceOp::SUM,
                0,
                false,
                5,
                Drive::OneThread,
            )
            .unwrap_or_else(|e| panic!("NCCL_NVLS_ENABLE={env:?}: {e}"));
        }
        drop(ranks);
        assert_eq!(
            sim::multicast_objects_created(),
            created,
            "NCCL_NVLS_ENABLE={env:?}"
        );
        assert_eq!(sim::nvls_launches(), launched, "NCCL_NVLS_ENABLE={env:?}");
    });
}

/// Ranks in separate processes with NVLS allowed (the simulator's switch): the simulator's multicast objects do
/// not cross processes, so the communicator stays off NVLS (no object, no NVLS launch) and
/// every collective still runs, on the ring.
#[test]
fn ranks_in_processes_keep_nvls_off_on_the_simulator() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        let dev = common::sim_dev(rank);
        let ranks = Ranks::new(vec![
            Comm::init_rank_on(dev, nranks, &id, rank).expect("init_rank")
        ]);
        for (i, coll) in [Coll::AllReduce, Coll::ReduceScatter, Coll::AllGather]
            .into_iter()
            .enumerate()
        {
            check_collective(
                &ranks,
                coll,
                999,
                DataType::Float32,
                ReduceOp::SUM,
                0,
                i % 2 == 1,
                40 + i as u64,
                Drive::OneThread,
            )
            .unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        }
        assert_eq!(sim::multicast_objects_created(), 0);
        assert_eq!(sim::nvls_launches(), 0);
        return;
    }
    // NCCL_ALGO and NCCL_NVLS_ENABLE unset (empty) in the children.
    let env = [
        ("NCCL_RS_SIM_NVLS", "1"),
        ("NCCL_ALGO", ""),
        ("NCCL_NVLS_ENABLE", ""),
    ];
    common::procs::run(2, &env);
}

/// An NVLS AllReduce whose peer never launches: rank 0 waits at the switch barrier, and
/// ncclCommAbort ends that wait (no hang).
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_float_sum"),
    ignore = "needs nccl_all_reduce_float_sum, which NCCL_RS_KERNELS left out"
)]
fn abort_ends_an_nvls_collective_stuck_on_an_absent_peer() {
    common::procs::isolated(SIM_NVLS_ONLY, &[], || {
        let ranks = comms(2);
        let c = &ranks.comms[0];
        let launched = sim::nvls_launches();
        let stream = ranks.streams[0];
        let buf = c.device().alloc(1 << 18).expect("alloc");
        // SAFETY: the test's own buffer, kept until the stream drained.
        unsafe {
            c.all_reduce_raw(
                buf.ptr(),
                buf.ptr(),
                1 << 16,
                DataType::Float32,
                ReduceOp::SUM,
                stream,
            )
        }
        .expect("issue rank 0's half");
        assert_eq!(sim::nvls_launches(), launched + 1);
        // A window for a wrong completion to show (no synchronisation: nothing waits on it).
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(
            !c.device().stream_query(stream).unwrap(),
            "the NVLS kernel cannot pass its barrier without its peer"
        );
        c.abort();
        // A bound that only turns a hang into a failure: without the abort this never ends.
        common::procs::wait_until(
            "the aborted NVLS kernel ends",
            common::procs::limit(),
            || c.device().stream_query(stream).unwrap(),
        );
        drop(buf);
    });
}

/// The config's nvlsCTAs (NCCL 2.27) sets NVLS's channels: one channel's multicast object is
/// smaller than the default's, and the collective is still right on it.
#[test]
fn nvls_ctas_sets_the_channels_of_the_multicast_object() {
    common::procs::isolated(SIM_NVLS_ONLY, &[], || {
        let with = |ctas: Option<i32>| {
            let id = common::loopback_id();
            let mut config = nccl::Config::default();
            config.nvls_ctas = ctas;
            let comms: Vec<Comm> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..2)
                    .map(|r| {
                        let (id, config) = (&id, &config);
                        s.spawn(move || {
                            Comm::init_rank_config_on(common::sim_dev(r), 2, id, r, config).unwrap()
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let ranks = Ranks::new(comms);
            let bytes = sim::multicast_last_bytes();
            check_collective(
                &ranks,
                Coll::AllReduce,
                3001,
                DataType::Float32,
                ReduceOp::SUM,
                1,
                false,
                5,
                Drive::Group,
            )
            .unwrap_or_else(|e| panic!("nvlsCTAs {ctas:?}: {e}"));
            bytes
        };
        let (default, one) = (with(None), with(Some(1)));
        assert!(
            one < default,
            "nvlsCTAs 1: a multicast object of {one} bytes, the default's {default}"
        );
    });
}
