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
//! NCCL_ALGO are read at communicator creation: the tests take turns (one lock) and set them
//! before each creation.

mod common;

use common::{check_collective, Drive, Ranks, ALL_OPS};
use nccl::cuda::sim;
use nccl::{Algo, Backend, Comm, DataType, ReduceOp};
use nccl_device::abi::Coll;
use std::sync::Mutex;

static TURN: Mutex<()> = Mutex::new(());

/// How a test sets NVLS up: on through the simulator's switch, or NCCL_NVLS_ENABLE set to a
/// value (None: unset) with the simulator's switch off.
#[derive(Clone, Copy, Debug)]
enum Nvls<'a> {
    SimOn,
    Enable(Option<&'a str>),
}

/// Communicators on `n` simulated GPUs created with NVLS as `nvls` says and NCCL_ALGO =
/// `algo` (None: unset). Small scratch halves (4 KiB) make calls of a few thousand elements
/// take many pieces, so both halves and the barriers turn over.
fn comms(n: usize, nvls: Nvls, algo: Option<&str>) -> Ranks {
    nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
    std::env::set_var("NCCL_NVLS_CHUNKSIZE", "4096");
    let (sim_on, enable) = match nvls {
        Nvls::SimOn => (Some("1"), None),
        Nvls::Enable(v) => (None, v),
    };
    for (k, v) in [
        ("NCCL_RS_SIM_NVLS", sim_on),
        ("NCCL_NVLS_ENABLE", enable),
        ("NCCL_ALGO", algo),
    ] {
        match v {
            Some(v) => std::env::set_var(k, v),
            None => std::env::remove_var(k),
        }
    }
    let devs: Vec<i32> = (0..n as i32).collect();
    Ranks::new(Comm::init_all(&devs).expect("init_all on the simulator"))
}

/// The PTX ISA's multimem.ld_reduce table for sm_90, written out here independently of the
/// library's: add on 32/64-bit integers and f16, bf16, f32, f64; min/max on 32/64-bit integers
/// and the half types; Sum, Avg and PreMulSum add; Prod never; no 8-bit type.
fn switch_reduces(dt: DataType, op: ReduceOp) -> bool {
    use DataType::*;
    let ints = matches!(dt, Int32 | Uint32 | Int64 | Uint64);
    match op {
        ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PreMulSum { .. } => {
            ints || matches!(dt, Float16 | Bfloat16 | Float32 | Float64)
        }
        ReduceOp::Max | ReduceOp::Min => ints || matches!(dt, Float16 | Bfloat16),
        _ => false,
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
    check_collective(
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
    let ranks = comms(n, Nvls::SimOn, Some("NVLS"));
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
                ReduceOp::Sum,
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
    let _t = TURN.lock().unwrap_or_else(|p| p.into_inner());
    matrix(2, &[1, 37, 5001]);
}

#[test]
fn four_ranks_every_type_and_reduction() {
    let _t = TURN.lock().unwrap_or_else(|p| p.into_inner());
    matrix(4, &[3, 1025, 9999]);
}

#[test]
fn eight_ranks_every_type_and_reduction() {
    let _t = TURN.lock().unwrap_or_else(|p| p.into_inner());
    matrix(8, &[1, 4097]);
}

/// Every collective, NVLS ones between ring ones, in and out of place, on one communicator:
/// the NVLS barrier and piece counters carry across launches of every kind.
#[test]
fn nvls_between_ring_collectives_in_and_out_of_place() {
    let _t = TURN.lock().unwrap_or_else(|p| p.into_inner());
    // Simple only: between Simple's ring and NVLS the model takes NVLS by itself (at these
    // sizes it takes the ring's LL over both).
    std::env::set_var("NCCL_PROTO", "Simple");
    let ranks = comms(4, Nvls::SimOn, None);
    std::env::remove_var("NCCL_PROTO");
    let launched = sim::nvls_launches();
    let mut seed = 77;
    for round in 0..2 {
        for coll in Coll::ALL {
            for in_place in [false, true] {
                seed += 1;
                let (dt, op) = [
                    (DataType::Float32, ReduceOp::Sum),
                    (DataType::Bfloat16, ReduceOp::Max),
                    (DataType::Int64, ReduceOp::Min),
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
}

/// NCCL_NVLS_ENABLE unset, 0, or anything but exactly 1: no multicast object is created (the
/// simulator counts them), the tuner never offers NVLS, and NCCL_ALGO=NVLS leaves nothing to
/// run (an error, not a hang). Exactly 1 creates one per communicator.
#[test]
fn nvls_enable_other_than_one_never_creates_a_multicast_object() {
    let _t = TURN.lock().unwrap_or_else(|p| p.into_inner());
    for env in [None, Some("0"), Some("2"), Some("yes"), Some(" 1")] {
        let created = sim::multicast_objects_created();
        let launched = sim::nvls_launches();
        let ranks = comms(4, Nvls::Enable(env), None);
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
                ReduceOp::Sum,
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

        let ranks = comms(2, Nvls::Enable(env), Some("NVLS"));
        let r = check_collective(
            &ranks,
            Coll::AllReduce,
            16,
            DataType::Float32,
            ReduceOp::Sum,
            0,
            false,
            6,
            Drive::OneThread,
        );
        assert!(r.is_err(), "NCCL_ALGO=NVLS without NVLS must fail the call");
        drop(ranks);
        assert_eq!(
            sim::multicast_objects_created(),
            created,
            "NCCL_NVLS_ENABLE={env:?}"
        );
    }
    let created = sim::multicast_objects_created();
    let ranks = comms(4, Nvls::SimOn, None);
    assert_eq!(sim::multicast_objects_created(), created + 1);
    drop(ranks);
}

/// Ranks in separate processes with NVLS allowed (the simulator's switch): the simulator's multicast objects do
/// not cross processes, so the communicator stays off NVLS (no object, no NVLS launch) and
/// every collective still runs, on the ring.
#[test]
fn ranks_in_processes_keep_nvls_off_on_the_simulator() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
        let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
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
                ReduceOp::Sum,
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
    let _t = TURN.lock().unwrap_or_else(|p| p.into_inner());
    std::env::remove_var("NCCL_ALGO"); // the children inherit our environment
    let t = "ranks_in_processes_keep_nvls_off_on_the_simulator";
    std::env::remove_var("NCCL_NVLS_ENABLE");
    common::procs::run(t, 2, &[("NCCL_RS_SIM_NVLS", "1")]);
}

/// An NVLS AllReduce whose peer never launches: rank 0 waits at the switch barrier, and
/// ncclCommAbort ends that wait (no hang).
#[test]
fn abort_ends_an_nvls_collective_stuck_on_an_absent_peer() {
    let _t = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let ranks = comms(2, Nvls::SimOn, Some("NVLS"));
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
            ReduceOp::Sum,
            stream,
        )
    }
    .expect("issue rank 0's half");
    assert_eq!(sim::nvls_launches(), launched + 1);
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(
        !c.device().stream_query(stream).unwrap(),
        "the NVLS kernel cannot pass its barrier without its peer"
    );
    c.abort();
    // A liveness bound, not a timing claim: without the abort this never ends.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !c.device().stream_query(stream).unwrap() {
        assert!(
            std::time::Instant::now() < deadline,
            "the aborted kernel still waits"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    drop(buf);
}
