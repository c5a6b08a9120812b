//! Simple steps with a publishing thread (NCCL_RS_SIMPLE_PUBLISHER=1, every test in a child
//! process with it): the last thread of each CTA, or of each half of a tree CTA, publishes a
//! step after the barrier that ends it, while the other threads go on with the next step. Six
//! threads per simulated CTA (five workers and the publisher; the tree's halves: two and one),
//! Simple at every size, and the tree for AllReduce, so the ring, the tree's two groups and
//! send/recv all run that way (steps that only receive keep every thread). A publication that
//! overtook its step's data would show as wrong values; the simulator's record of launch flags
//! shows the setting reached the kernels. (The late-rank case is in `flow_control`.)

use crate::common::{self, check_all_to_all, Drive, Ranks};
use nccl::{Algo, Coll, Proto};
use nccl_device::abi::FLAG_SIMPLE_PUBLISHER as FLAG;

pub const ENV: &[(&str, &str)] = &[
    ("NCCL_RS_SIMPLE_PUBLISHER", "1"),
    ("NCCL_RS_SIM_NTHREADS", "6"),
    ("NCCL_PROTO", "Simple"),
    ("NCCL_ALGO", "allreduce:tree"),
    ("NCCL_RS_SIM_DEVICES", "16"),
];

fn sim_comms(n: usize) -> Ranks {
    let ranks = common::sim_ranks(n);
    for c in &ranks.comms {
        assert_eq!(c.shape().kernel_flags & FLAG, FLAG, "the publisher is on");
        let t = c.tuning(Coll::AllReduce, 8).expect("a choice");
        assert_eq!((t.algo, t.proto), (Algo::Tree, Proto::Simple));
    }
    ranks
}

#[test]
fn every_collective_with_a_publisher() {
    common::procs::isolated(ENV, &[], || {
        for (n, drive) in [
            (2, Drive::Group),
            (3, Drive::ThreadPerRank),
            (4, Drive::OneThread),
        ] {
            let ranks = sim_comms(n);
            common::collective_matrix(&ranks, &[1, 4099, 70_001], drive);
        }
        // (A build that left out every collective kernel launched none: nothing to carry it.)
        if nccl::cuda::sim::launch_count() > 0 {
            assert_eq!(
                nccl::cuda::sim::launched_flags().0 & FLAG,
                FLAG,
                "the flag reached the kernels"
            );
        }
    });
}

#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_p2p"),
    ignore = "needs nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn send_recv_with_a_publisher() {
    common::procs::isolated(ENV, &[], || {
        let ranks = sim_comms(4);
        for scale in [0usize, 7, 9000] {
            check_all_to_all(&ranks, scale, Drive::ThreadPerRank).unwrap_or_else(|e| panic!("{e}"));
        }
        assert_eq!(
            nccl::cuda::sim::launched_flags().1 & FLAG,
            FLAG,
            "the flag reached the kernels"
        );
    });
}
