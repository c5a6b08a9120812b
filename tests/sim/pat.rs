//! PAT (AllGather and ReduceScatter on binomial trees over ranks 2^k apart) across nodes of one
//! rank each on the simulator: rank processes grouped into nodes by `NCCL_HOSTID`, the network
//! between them the socket network over loopback and the proxies. Forced by NCCL_ALGO: every
//! type and reduction, in and out of place, odd counts and calls of many pieces, on 2 to 8
//! nodes (powers of two and not); then where the tuner offers it.

use crate::common::{self, check, procs, Drive, LOOPBACK};
use nccl::tune::Algo;
use nccl::{Coll, DataType};

/// NCCL_ALGO leaving AllGather and ReduceScatter nothing but PAT.
const FORCED: (&str, &str) = ("NCCL_ALGO", "allgather:pat;reducescatter:pat");

/// Checks both collectives of `ranks` (one rank of this process) with fresh inputs and
/// poisoned outputs: with `full`, every type × reduction × count × place; else every type
/// with a rotating reduction.
fn check_both(ranks: &common::Ranks, counts: &[usize], full: bool) {
    let n = ranks.comms[0].count();
    let counts = common::matrix_counts(counts);
    for (k, dt) in common::matrix_types().into_iter().enumerate() {
        for (i, &count) in counts.iter().enumerate() {
            for in_place in [false, true] {
                let ops = match full {
                    true => check::ALL_OPS.to_vec(),
                    false => vec![check::ALL_OPS[(k + i) % check::ALL_OPS.len()]],
                };
                for (o, op) in ops.into_iter().enumerate() {
                    let seed = (k * 1000 + i * 10 + o) as u64;
                    for coll in [Coll::AllGather, Coll::ReduceScatter] {
                        // A copy: one reduction is enough.
                        if coll == Coll::AllGather && o > 0 {
                            continue;
                        }
                        let r = check::check_collective(
                            ranks,
                            coll,
                            count,
                            dt,
                            op,
                            0,
                            in_place,
                            seed,
                            Drive::OneThread,
                        );
                        r.unwrap_or_else(|e| panic!("PAT on {n} nodes: {e}"));
                    }
                }
            }
        }
    }
}

#[test]
fn pat_forced_every_type_and_reduction_across_nodes() {
    if let Some(ranks) = crate::multinode::child_comm() {
        let c = &ranks.comms[0];
        for coll in [Coll::AllGather, Coll::ReduceScatter] {
            for bytes in [8, 1 << 20, 1 << 30] {
                let t = c.tuning(coll, bytes).unwrap();
                assert_eq!(t.algo, Algo::Pat, "{} of {bytes} bytes: {t:?}", coll.name());
            }
        }
        // Odd counts, counts that are not a multiple of a pack, and 40 000 elements: many
        // pieces per channel (the simulator's FIFO slots hold 8 KiB).
        match c.count() {
            3 | 5 => check_both(&ranks, &[1, 37, 1001, 40_000], true),
            _ => check_both(&ranks, &[3, 1001, 40_000], false),
        }
        return;
    }
    // 6: an AllGather dimension and a ReduceScatter one share a connection (2 + 4 = 6); 7:
    // offset n - 1 leaves from its input on dimension 1.
    for nodes in [2, 3, 4, 5, 6, 7, 8] {
        procs::run_nodes(nodes, 1, &[LOOPBACK, FORCED]);
    }
}

#[test]
fn pat_is_offered_only_with_one_rank_per_node() {
    if let Some(ranks) = crate::multinode::child_comm() {
        let c = &ranks.comms[0];
        let one_per_node = std::env::var("NCCL_RS_TEST_LOCAL").as_deref() == Ok("1");
        let off = std::env::var("NCCL_PAT_ENABLE").as_deref() == Ok("0");
        let ag = |bytes: usize| c.tuning(Coll::AllGather, bytes);
        if std::env::var("NCCL_ALGO").is_ok() {
            // Forced where it is not connected: no algorithm is left, as NCCL answers.
            let e = ag(64).unwrap_err();
            assert_eq!(e.code, nccl::NcclResult::InvalidUsage, "{e}");
        } else if one_per_node && !off {
            // Latency-bound calls cross the network ceil(log2 n) times in a row instead of
            // n - 1; large ones keep the ring's pipeline.
            let (small, large) = (ag(64).unwrap(), ag(256 << 20).unwrap());
            assert_eq!(small.algo, Algo::Pat, "{small:?}");
            assert_eq!(large.algo, Algo::Ring, "{large:?}");
            // Past what packs into a slot (8 KiB on the simulator: 16 KiB on 8 ranks), the
            // ring, whatever the model says.
            let mid = ag(64 << 10).unwrap();
            assert_eq!(mid.algo, Algo::Ring, "{mid:?}");
        } else {
            let small = ag(64).unwrap();
            assert_ne!(small.algo, Algo::Pat, "{small:?}");
        }
        let (dt, op) = (DataType::Float32, nccl::ReduceOp::SUM);
        let rs = check::check_collective(
            &ranks,
            Coll::ReduceScatter,
            333,
            dt,
            op,
            0,
            false,
            1,
            Drive::OneThread,
        );
        rs.unwrap();
        return;
    }
    let local = ("NCCL_RS_TEST_LOCAL", "1");
    procs::run_nodes(8, 1, &[LOOPBACK, local]);
    procs::run_nodes(4, 1, &[LOOPBACK, local, ("NCCL_PAT_ENABLE", "0")]);
    procs::run_nodes(2, 2, &[LOOPBACK, ("NCCL_ALGO", "allgather:pat")]);
}
