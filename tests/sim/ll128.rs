//! The LL128 protocol on the CPU simulator: every test runs in a child process with
//! NCCL_PROTO=LL128, so every ring collective carries its steps in 128-byte lines of 120 data
//! bytes and a flag, written by 8 lanes of a warp (the simulator's CTAs are rounded up to whole
//! warps).

use crate::common::{self, Drive, Ranks};
use nccl::tune::Proto;

/// NCCL_PROTO=LL128 on 16 simulated GPUs, with 8 KiB steps: many steps (FIFO wrap-around,
/// waits for credit) with few lines, which the simulator moves slowly (its warps meet at
/// every line).
pub const FORCED: &[(&str, &str)] = &[
    ("NCCL_PROTO", "LL128"),
    ("NCCL_RS_SIM_BUFFSIZE", "65536"),
    ("NCCL_RS_SIM_DEVICES", "16"),
];

fn sim_comms(n: usize) -> Ranks {
    common::forced_protocol_comms(n, Proto::Ll128)
}

/// 20000 floats take several 8 KiB steps per channel; 31 and 3001 end inside a line.
const COUNTS: [usize; 4] = [1, 31, 3001, 20_000];

#[test]
fn every_collective_on_two_and_three_ranks() {
    common::procs::isolated(FORCED, &[], || {
        for (n, drive) in [(2, Drive::ThreadPerRank), (3, Drive::OneThread)] {
            common::collective_matrix(&sim_comms(n), &COUNTS, drive);
        }
    });
}

#[test]
fn every_collective_on_four_ranks() {
    common::procs::isolated(FORCED, &[], || {
        common::collective_matrix(&sim_comms(4), &COUNTS, Drive::Group);
    });
}

#[test]
fn every_collective_on_eight_ranks() {
    common::procs::isolated(FORCED, &[], || {
        common::collective_matrix(&sim_comms(8), &COUNTS[..3], Drive::ThreadPerRank);
    });
}

#[test]
fn every_type_and_op_on_two_ranks() {
    common::procs::isolated(FORCED, &[], || {
        common::type_op_matrix(&sim_comms(2), &[0, 1, 37, 20_000], Drive::OneThread);
    });
}
