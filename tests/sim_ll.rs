//! The LL protocol on the CPU simulator: NCCL_PROTO=LL for this whole test binary, so every
//! ring collective carries its steps in 16-byte lines of two data words and two flags.

mod common;

use common::{Drive, Ranks};
use nccl::tune::Proto;

/// NCCL_PROTO=LL on 16 simulated GPUs.
const FORCED: &[(&str, &str)] = &[("NCCL_PROTO", "LL"), ("NCCL_RS_SIM_DEVICES", "16")];

fn sim_comms(n: usize) -> Ranks {
    common::forced_protocol_comms(n, FORCED, Proto::Ll)
}

/// 70000 elements take several LL slots (16 KiB of payload each) per channel.
const COUNTS: [usize; 4] = [1, 17, 3000, 70_000];

#[test]
fn every_collective_on_two_and_three_ranks() {
    for (n, drive) in [(2, Drive::ThreadPerRank), (3, Drive::OneThread)] {
        common::collective_matrix(&sim_comms(n), &COUNTS, drive);
    }
}

#[test]
fn every_collective_on_four_ranks() {
    common::collective_matrix(&sim_comms(4), &COUNTS, Drive::Group);
}

#[test]
fn every_collective_on_eight_ranks() {
    common::collective_matrix(&sim_comms(8), &COUNTS, Drive::ThreadPerRank);
}

#[test]
fn every_type_and_op_on_two_ranks() {
    common::type_op_matrix(&sim_comms(2), &[0, 1, 37, 1000, 70_000], Drive::OneThread);
}

/// As tests/sim_flow_control.rs, with LL: more ranks than FIFO slots and one rank late, so only
/// the head counter keeps senders from overwriting LL lines not read yet.
#[test]
fn a_late_rank_never_loses_data() {
    common::use_forced_protocol(FORCED);
    common::late_rank_all_reduce(16);
}
