//! Flow control: with more ranks than FIFO slots, a ring lets a sender run more than
//! NCCL_STEPS steps ahead of a slow receiver; only the head counter stops it from overwriting
//! slots that were not read yet. One of 16 ranks launches late to make that likely, under each
//! protocol and step layout that has a FIFO of its own (each case a child process with its
//! environment): the tuner's choice, LL's lines, LL128's lines with small steps, Simple steps
//! of four slots, the tree (its middle rank late: ranks below it fill its up FIFO, ranks above
//! it wait for the way down), and Simple steps published by a thread of their own.

use crate::common;
use nccl::{Algo, Coll, Proto};

const SIXTEEN: &[(&str, &str)] = &[("NCCL_RS_SIM_DEVICES", "16")];
const SLICES: &[(&str, &str)] = &[("NCCL_RS_SLICE_STEPS", "4"), ("NCCL_RS_SIM_DEVICES", "16")];
const TREE: &[(&str, &str)] = &[
    ("NCCL_ALGO", "allreduce:tree"),
    ("NCCL_RS_SIM_DEVICES", "16"),
];

#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_float_sum"),
    ignore = "needs nccl_all_reduce_float_sum, which NCCL_RS_KERNELS left out"
)]
fn a_late_rank_never_loses_data() {
    let cases: [(&str, &[(&str, &str)]); 6] = [
        ("tuned", SIXTEEN),
        ("LL", crate::ll::FORCED),
        ("LL128", crate::ll128::FORCED),
        ("four-slot steps", SLICES),
        ("tree", TREE),
        ("publisher", crate::publisher::ENV),
    ];
    common::procs::isolated_cases(&cases, |case| {
        // What each case is about reached the communicators it makes.
        let probe = common::sim_ranks(2);
        let c = &probe.comms[0];
        let t = c.tuning(Coll::AllReduce, 1 << 20).expect("a choice");
        match case {
            "LL" => assert_eq!(t.proto, Proto::Ll, "{t:?}"),
            "LL128" => assert_eq!(t.proto, Proto::Ll128, "{t:?}"),
            "four-slot steps" => assert_eq!(c.shape().slice_steps, 4),
            "tree" => assert_eq!((t.algo, t.proto), (Algo::Tree, Proto::Simple), "{t:?}"),
            "publisher" => {
                let flag = nccl_device::abi::FLAG_SIMPLE_PUBLISHER;
                assert_eq!(c.shape().kernel_flags & flag, flag, "the publisher is on");
            }
            _ => {}
        }
        drop(probe);
        let late = if case == "tree" { 8 } else { 15 };
        common::late_rank_all_reduce_at(16, late);
    });
}
