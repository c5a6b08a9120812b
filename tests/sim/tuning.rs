//! The tuner inside communicators, on the CPU simulator: the protocol follows the size, every
//! rank chooses alike even when processes are configured differently (rank 0's NCCL_ALGO and
//! NCCL_PROTO rule), and bad or impossible filters give clear errors.

use crate::common::{self, check_all_reduce, Drive, Ranks};
use nccl::{Algo, Coll, Proto};
use nccl::{Comm, NcclResult, ReduceOp};
use nccl_device::types::DataType;

/// The defaults, whatever filters the user's environment holds: in a child process started
/// without NCCL_PROTO and NCCL_ALGO.
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_float_sum"),
    ignore = "needs nccl_all_reduce_float_sum, which NCCL_RS_KERNELS left out"
)]
fn the_protocol_follows_the_size() {
    common::procs::isolated(&[], &["NCCL_PROTO", "NCCL_ALGO"], protocol_follows_the_size);
}

fn protocol_follows_the_size() {
    common::sim();
    let comms = Comm::init_all(&[0, 1, 2, 3]).expect("init_all");
    for coll in Coll::ALL {
        let small: Vec<_> = comms.iter().map(|c| c.tuning(coll, 8).unwrap()).collect();
        let big: Vec<_> = comms
            .iter()
            .map(|c| c.tuning(coll, 1 << 30).unwrap())
            .collect();
        assert!(small.iter().all(|c| *c == small[0]), "{coll:?}: {small:?}");
        assert!(big.iter().all(|c| *c == big[0]), "{coll:?}: {big:?}");
        assert_eq!((small[0].algo, small[0].proto), (Algo::Ring, Proto::Ll));
        assert_eq!((big[0].algo, big[0].proto), (Algo::Ring, Proto::Simple));
        assert_eq!(small[0].nchannels, 1, "{coll:?}");
        assert_eq!(big[0].nchannels, comms[0].shape().nchannels as usize);
        assert!(small[0].est_time_us < big[0].est_time_us);
        // Past the size where our LL was measured to win, Simple runs.
        let mid = comms[0].tuning(coll, 4 << 20).unwrap();
        assert_eq!(mid.proto, Proto::Simple, "{coll:?}");
    }
    // Both protocols and the switch between them, on real data.
    let ranks = Ranks::new(comms);
    for count in [1usize, 1000, 100_000, 600_000] {
        check_all_reduce(
            &ranks,
            count,
            DataType::Float32,
            ReduceOp::SUM,
            false,
            3,
            Drive::OneThread,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Rank 0 allows only LL, the others only Simple: all follow rank 0, so the collectives agree.
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_int32_sum"),
    ignore = "needs nccl_all_reduce_int32_sum, which NCCL_RS_KERNELS left out"
)]
fn rank_zeros_filters_rule() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        let comm = Comm::init_rank_on(common::sim_dev(rank), nranks, &id, rank).expect("init_rank");
        let c = comm.tuning(Coll::AllReduce, 1 << 20).expect("a choice");
        assert_eq!(
            c.proto,
            Proto::Ll,
            "rank {rank} follows rank 0's NCCL_PROTO"
        );
        let ranks = Ranks::new(vec![comm]);
        for count in [5usize, 70_000] {
            check_all_reduce(
                &ranks,
                count,
                DataType::Int32,
                ReduceOp::SUM,
                true,
                5,
                Drive::OneThread,
            )
            .unwrap_or_else(|e| panic!("{e}"));
        }
        return;
    }
    common::procs::run_each(3, &[], |rank| {
        let proto = if rank == 0 { "LL" } else { "Simple" };
        vec![("NCCL_PROTO".into(), proto.into())]
    });
}

/// NCCL_ALGO with a typo fails creation; NCCL_ALGO naming only algorithms that are not built
/// fails each call with a message, and the communicator stays usable for nothing else.
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_float_sum"),
    ignore = "needs nccl_all_reduce_float_sum, which NCCL_RS_KERNELS left out"
)]
fn bad_filters_are_clear_errors() {
    if let Some((rank, _, _)) = common::procs::child() {
        let dev = |r: usize| common::sim_dev(r);
        if rank == 0 {
            // NCCL_ALGO=rign
            let id = common::loopback_id();
            let e = Comm::init_rank_on(dev(0), 1, &id, 0).unwrap_err();
            assert_eq!(e.code, NcclResult::InvalidArgument, "{e}");
            assert!(e.message.contains("NCCL_ALGO=rign"), "{e}");
        } else {
            // NCCL_ALGO=NVLS: one rank, NCCL_NVLS_ENABLE unset: no NVLS
            let comm = Comm::init_rank_on(dev(0), 1, &common::loopback_id(), 0).expect("init_rank");
            let e = comm.tuning(Coll::AllReduce, 1024).unwrap_err();
            assert_eq!(e.code, NcclResult::InvalidUsage, "{e}");
            assert!(e.message.contains("NCCL_PROTO"), "{e}");
            let buf = comm.device().alloc(1024).expect("alloc");
            let e = unsafe {
                comm.all_reduce_raw(
                    buf.ptr(),
                    buf.ptr(),
                    256,
                    DataType::Float32,
                    ReduceOp::SUM,
                    nccl::cuda::StreamHandle(0),
                )
            }
            .unwrap_err();
            assert_eq!(e.code, NcclResult::InvalidUsage, "{e}");
            assert!(e.message.contains("NCCL_PROTO"), "the filters' error: {e}");
        }
        return;
    }
    // Two independent single-rank processes, one per case.
    common::procs::run_each(2, &[("NCCL_NVLS_ENABLE", "")], |rank| {
        let algo = if rank == 0 { "rign" } else { "NVLS" };
        vec![("NCCL_ALGO".into(), algo.into())]
    });
}
