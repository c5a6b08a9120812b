//! The LL protocol on the CPU simulator: every test runs in a child process with NCCL_PROTO=LL
//! (16 simulated GPUs), so every ring collective carries its steps in 16-byte lines of two data
//! words and two flags. The default protocol's small sizes are LL too: these matrices are the
//! suite's LL matrices (`all_reduce` does not repeat them).

use crate::common::{self, Checked, Drive, Ranks};
use nccl::tune::Proto;

/// NCCL_PROTO=LL on 16 simulated GPUs.
pub const FORCED: &[(&str, &str)] = &[("NCCL_PROTO", "LL"), ("NCCL_RS_SIM_DEVICES", "16")];

fn sim_comms(n: usize) -> Ranks {
    common::forced_protocol_comms(n, Proto::Ll)
}

/// 70000 elements take several LL slots (16 KiB of payload each) per channel.
const COUNTS: [usize; 4] = [1, 17, 3000, 70_000];

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
        common::collective_matrix(&sim_comms(8), &COUNTS, Drive::ThreadPerRank);
    });
}

#[test]
fn every_type_and_op_on_two_ranks() {
    common::procs::isolated(FORCED, &[], || {
        common::type_op_matrix(&sim_comms(2), &[0, 1, 37, 1000, 70_000], Drive::OneThread);
    });
}

/// Two ranks exchange (`FLAG_RING_EXCHANGE`): a piece costs one step on each ring connection,
/// where the ring's reduce-scatter and all-gather take two, and the sums are right (poisoned
/// outputs, every reduction on a float and an integer type).
#[test]
fn two_ranks_exchange_in_one_step_per_piece() {
    common::procs::isolated(FORCED, &[], || {
        let ranks = sim_comms(2);
        let choice = ranks.comms[0]
            .tuning(nccl::Coll::AllReduce, 4096)
            .expect("a choice");
        assert_eq!(choice.algo, nccl::tune::Algo::Ring, "{choice:?}");
        let steps = |r: &Ranks| -> Vec<Vec<u64>> {
            r.comms
                .iter()
                .map(|c| c.ring_send_steps().expect("steps"))
                .collect()
        };
        let ops = [
            nccl::ReduceOp::SUM,
            nccl::ReduceOp::PROD,
            nccl::ReduceOp::MAX,
            nccl::ReduceOp::MIN,
            nccl::ReduceOp::AVG,
        ];
        let mut seed = 900;
        for dt in [nccl::DataType::Float32, nccl::DataType::Int32] {
            for op in ops {
                // 1000 elements fill less than one LL step on each channel the call uses.
                for (count, in_place) in [(1, false), (1000, true), (1000, false)] {
                    let before = steps(&ranks);
                    seed += 1;
                    let op = common::typed_op(op, dt);
                    let d = Drive::OneThread;
                    let checked =
                        common::check_all_reduce(&ranks, count, dt, op, in_place, seed, d)
                            .unwrap_or_else(|e| panic!("{dt:?} {op:?} count {count}: {e}"));
                    if checked == Checked::Skipped {
                        continue;
                    }
                    let after = steps(&ranks);
                    for (r, (a, b)) in after.iter().zip(&before).enumerate() {
                        let delta: Vec<u64> = a.iter().zip(b).map(|(a, b)| a - b).collect();
                        assert!(
                            delta.iter().all(|&d| d <= 1) && delta.contains(&1),
                            "rank {r}, {dt:?} count {count}: ring steps per channel {delta:?}"
                        );
                    }
                }
            }
        }
    });
}
