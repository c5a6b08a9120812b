//! The tree AllReduce on the CPU simulator: NCCL_ALGO=allreduce:tree for this whole test
//! binary, so every AllReduce runs as a chain in ring order (reduce towards rank 0, broadcast
//! back), pipelined over the ring's connections downwards and the tree's links upwards, while
//! the other collectives keep the ring on the same connections.

mod common;

use common::{Drive, Ranks};
use nccl::{Algo, Coll, Proto};
use nccl::{Backend, Comm};

fn use_tree() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::env::set_var("NCCL_ALGO", "allreduce:tree");
        std::env::set_var("NCCL_RS_SIM_DEVICES", "16");
    });
    nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
}

fn sim_comms(n: usize) -> Ranks {
    use_tree();
    let devs: Vec<i32> = (0..n as i32).collect();
    let comms = Comm::init_all(&devs).expect("init_all on the simulator");
    for c in &comms {
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
    Ranks::new(comms)
}

/// 70000 floats take many 4 KiB tree chunks per channel: more than the FIFO's slots and the
/// pipeline lag.
const COUNTS: [usize; 3] = [1, 3000, 70_000];

#[test]
fn every_type_and_op_on_one_two_and_three_ranks() {
    common::type_op_matrix(&sim_comms(1), &[0, 5, 4099], Drive::OneThread);
    common::type_op_matrix(&sim_comms(2), &[0, 1, 37, 1000, 70_000], Drive::OneThread);
    common::type_op_matrix(&sim_comms(3), &[5, 4099], Drive::ThreadPerRank);
}

#[test]
fn every_collective_between_tree_all_reduces() {
    common::collective_matrix(&sim_comms(4), &COUNTS, Drive::Group);
}

#[test]
fn eight_ranks_thread_per_rank() {
    common::collective_matrix(&sim_comms(8), &COUNTS, Drive::ThreadPerRank);
}

/// 16 ranks, the middle one late: ranks below it fill its up FIFO and wait on its head
/// counter; ranks above it wait for the way down.
#[test]
fn a_late_middle_rank_never_loses_data() {
    use_tree();
    common::late_rank_all_reduce_at(16, 8);
}
