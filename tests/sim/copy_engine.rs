//! Copy-engine collectives (`comm/copy_engine.rs`, NCCL 2.28's `NCCL_CTA_POLICY_ZERO`) on the
//! simulator: with CTAPolicy zero (NCCL_CTA_POLICY=2 in an isolated child), AllGather and
//! AlltoAll whose receive buffers lie in a symmetric window, and Gather and Scatter whose
//! every rank's own block does (either root, in place at the root or not), run as copies and
//! signals, no kernel; out of a window they keep their kernels; ranks in one process and as
//! processes.

use crate::common::onesided::copy_engine_cases;
use crate::common::{self, Ranks};

const ZERO: &[(&str, &str)] = &[("NCCL_CTA_POLICY", "2")];

#[test]
fn copy_engine_collectives_on_2_and_4_ranks() {
    common::procs::isolated(ZERO, &[], || {
        common::sim();
        for n in [2, 4] {
            copy_engine_cases(&common::sim_ranks(n));
        }
    });
}

#[test]
fn copy_engine_collectives_between_processes() {
    let Some((rank, nranks, id)) = common::procs::child() else {
        common::sim();
        common::procs::run(3, ZERO);
        return;
    };
    let comm = nccl::Comm::init_rank_on(common::sim_dev(rank), nranks, &id, rank).unwrap();
    copy_engine_cases(&Ranks::new(vec![comm]));
}
