//! The tree AllReduce on the CPU simulator: every test runs in a child process with
//! NCCL_ALGO=allreduce:tree, so every AllReduce runs as a chain in ring order (reduce towards
//! rank 0, broadcast back), pipelined over the ring's connections downwards and the tree's
//! links upwards, while the other collectives keep the ring on the same connections. (The
//! late-middle-rank case is in `flow_control`.)

use crate::common::{self, Drive, Ranks};
use nccl::{Algo, Coll, Proto};

const TREE: &[(&str, &str)] = &[("NCCL_ALGO", "allreduce:tree")];

fn sim_comms(n: usize) -> Ranks {
    let ranks = common::sim_ranks(n);
    for c in &ranks.comms {
        for bytes in [8, 1 << 30] {
            let t = c.tuning(Coll::AllReduce, bytes).expect("a choice");
            assert_eq!(
                (t.algo, t.proto),
                (Algo::Tree, Proto::Simple),
                "{bytes} bytes"
            );
        }
        let t = c.tuning(Coll::AllGather, 1 << 20).expect("a choice");
        assert_eq!(t.algo, Algo::Ring);
    }
    ranks
}

/// 70000 floats take many 4 KiB tree chunks per channel: more than the FIFO's slots and the
/// pipeline lag.
const COUNTS: [usize; 3] = [1, 3000, 70_000];

#[test]
fn every_type_and_op_on_one_two_and_three_ranks() {
    common::procs::isolated(TREE, &[], || {
        common::type_op_matrix(&sim_comms(1), &[0, 5, 4099], Drive::OneThread);
        common::type_op_matrix(&sim_comms(2), &[0, 1, 37, 1000, 70_000], Drive::OneThread);
        common::type_op_matrix(&sim_comms(3), &[5, 4099], Drive::ThreadPerRank);
    });
}

#[test]
fn every_collective_between_tree_all_reduces() {
    common::procs::isolated(TREE, &[], || {
        common::collective_matrix(&sim_comms(4), &COUNTS, Drive::Group);
    });
}

#[test]
fn eight_ranks_thread_per_rank() {
    common::procs::isolated(TREE, &[], || {
        common::collective_matrix(&sim_comms(8), &COUNTS, Drive::ThreadPerRank);
    });
}
