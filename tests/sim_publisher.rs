//! Simple steps with a publishing thread (NCCL_RS_SIMPLE_PUBLISHER=1 for this whole test
//! binary): the last thread of each CTA, or of each half of a tree CTA, publishes a step after
//! the barrier that ends it, while the other threads go on with the next step. Six threads per
//! simulated CTA (five workers and the publisher; the tree's halves: two and one), Simple at
//! every size, and the tree for AllReduce, so the ring, the tree's two groups and send/recv all
//! run that way (steps that only receive keep every thread). A publication that overtook its
//! step's data would show as wrong values; the simulator's record of launch flags shows the
//! setting reached the kernels.

mod common;

use common::{check_all_to_all, Drive, Ranks};
use nccl::Comm;
use nccl::{Algo, Coll, Proto};
use nccl_device::abi::FLAG_SIMPLE_PUBLISHER as FLAG;

const ENV: &[(&str, &str)] = &[
    ("NCCL_RS_SIMPLE_PUBLISHER", "1"),
    ("NCCL_RS_SIM_NTHREADS", "6"),
    ("NCCL_PROTO", "Simple"),
    ("NCCL_ALGO", "allreduce:tree"),
    ("NCCL_RS_SIM_DEVICES", "16"),
];

fn sim_comms(n: usize) -> Ranks {
    common::use_forced_protocol(ENV);
    let comms = Comm::init_all(&(0..n as i32).collect::<Vec<_>>()).expect("init_all");
    for c in &comms {
        assert_eq!(c.shape().kernel_flags & FLAG, FLAG, "the publisher is on");
        let t = c.tuning(Coll::AllReduce, 8).expect("a choice");
        assert_eq!((t.algo, t.proto), (Algo::Tree, Proto::Simple));
    }
    Ranks::new(comms)
}

#[test]
fn every_collective_with_a_publisher() {
    for (n, drive) in [
        (2, Drive::Group),
        (3, Drive::ThreadPerRank),
        (4, Drive::OneThread),
    ] {
        let ranks = sim_comms(n);
        common::collective_matrix(&ranks, &[1, 4099, 70_001], drive);
    }
    assert_eq!(
        nccl::cuda::sim::launched_flags().0 & FLAG,
        FLAG,
        "the flag reached the kernels"
    );
}

#[test]
fn send_recv_with_a_publisher() {
    let ranks = sim_comms(4);
    for scale in [0usize, 7, 9000] {
        check_all_to_all(&ranks, scale, Drive::ThreadPerRank).unwrap_or_else(|e| panic!("{e}"));
    }
    assert_eq!(
        nccl::cuda::sim::launched_flags().1 & FLAG,
        FLAG,
        "the flag reached the kernels"
    );
}

#[test]
fn a_late_rank_never_loses_data_with_a_publisher() {
    common::use_forced_protocol(ENV);
    common::late_rank_all_reduce(16);
}
