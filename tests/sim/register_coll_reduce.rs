//! Registered reductions on the simulator (the zero-copy paths of `register_coll`): the
//! all-gather half of AllReduce and its reduce-scatter half, the last hop of ReduceScatter and
//! of Reduce, and the one-node tree both ways, for every reduction on a float and an integer
//! type, with the results of the FIFO path.

use super::register_coll::{counts, isolated, ONE_CTA};
use crate::common;
use crate::common::register::{expected_direct, Who};
use nccl_device::abi::Coll;

/// AllReduce's reduce-scatter half on registered outputs: out of place, each rank writes its
/// partial sums straight into its successor's output, which reduces them from there (in place
/// they keep the FIFO: a partial would land on an input not yet added). Every reduction (Avg
/// and PreMulSum apply once) on a float and an integer type, odd counts, random data, outputs
/// poisoned inside and around; the direct steps per channel show which half went direct: both
/// halves out of place, the all-gather half alone in place, none where an end did not register.
#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_reduce_float_sum",
        nccl_rs_kernel = "nccl_all_reduce_float_prod",
        nccl_rs_kernel = "nccl_all_reduce_float_max",
        nccl_rs_kernel = "nccl_all_reduce_float_min",
        nccl_rs_kernel = "nccl_all_reduce_float_avg",
        nccl_rs_kernel = "nccl_all_reduce_float_premulsum",
        nccl_rs_kernel = "nccl_all_reduce_int32_sum",
        nccl_rs_kernel = "nccl_all_reduce_int32_prod",
        nccl_rs_kernel = "nccl_all_reduce_int32_max",
        nccl_rs_kernel = "nccl_all_reduce_int32_min",
        nccl_rs_kernel = "nccl_all_reduce_int32_avg",
        nccl_rs_kernel = "nccl_all_reduce_int32_premulsum"
    )),
    ignore = "needs nccl_all_reduce_float_sum, nccl_all_reduce_float_prod, nccl_all_reduce_float_max, nccl_all_reduce_float_min, nccl_all_reduce_float_avg, nccl_all_reduce_float_premulsum, nccl_all_reduce_int32_sum, nccl_all_reduce_int32_prod, nccl_all_reduce_int32_max, nccl_all_reduce_int32_min, nccl_all_reduce_int32_avg, nccl_all_reduce_int32_premulsum, which NCCL_RS_KERNELS left out"
)]
fn registered_all_reduce_reduce_scatter_half_goes_direct() {
    isolated(true, &[("NCCL_RS_REGISTERED_CTAS", "0")], || {
        use common::register::reduction_round_as_modelled;
        use nccl::DataType;
        for n in [2usize, 3, 4, 8] {
            // Every channel runs (the comparison of the halves below needs the same channels).
            let comms = common::sim_comms(n);
            let mut seed = 1000 * n as u64;
            let mut round = |dt: DataType, op: nccl::ReduceOp, who: Who, count: usize, in_place| {
                seed += 1;
                let op = common::typed_op(op, dt);
                reduction_round_as_modelled(
                    &comms,
                    Coll::AllReduce,
                    dt,
                    op,
                    who,
                    count,
                    in_place,
                    seed,
                )
            };
            // Every reduction on both types, everyone registered, in and out of place.
            for dt in [DataType::Float32, DataType::Int32] {
                for op in common::ALL_OPS {
                    for in_place in [false, true] {
                        let got = round(dt, op, Who::All, 20_001, in_place);
                        let (all, ag) = (got.iter().flatten().sum::<u64>(), {
                            // What the all-gather half alone takes.
                            comms
                                .iter()
                                .flat_map(|c| {
                                    expected_direct(
                                        c,
                                        Coll::AllReduce,
                                        |_| true,
                                        20_001,
                                        true,
                                        true,
                                    )
                                })
                                .sum::<u64>()
                        });
                        assert!(ag > 0, "{n} ranks: no direct step at all");
                        if !in_place {
                            assert_eq!(all, 2 * ag, "{n} ranks: the reduce-scatter half copied");
                        }
                    }
                }
            }
            // Mixed and no registration, a short count (no handshake) and a count over several
            // pieces, on a few reductions.
            for (dt, op) in [
                (DataType::Int32, nccl::ReduceOp::SUM),
                (DataType::Float32, nccl::ReduceOp::AVG),
                (DataType::Int32, nccl::ReduceOp::pre_mul_sum(0)),
            ] {
                for who in [Who::Even, Who::None] {
                    for in_place in [false, true] {
                        round(dt, op, who, 20_001, in_place);
                    }
                }
                round(dt, op, Who::All, 1_003, false);
                round(dt, op, Who::All, 9 * 4096 * n + 5, false);
            }
            // Odd ranks in place, even ones not, in one call: each connection's reduce-scatter
            // half goes direct exactly where its receiver runs out of place.
            let count = 20_001;
            let odd = |r: usize| r % 2 == 1;
            let got = common::register::reduce_round_each::<f32>(
                &comms,
                DataType::Float32,
                common::typed_op(nccl::ReduceOp::pre_mul_sum(0), DataType::Float32),
                Who::All,
                count,
                &odd,
                9 * n as u64,
            );
            for (c, g) in comms.iter().zip(&got) {
                let want =
                    expected_direct(c, Coll::AllReduce, |_| true, count, odd(c.rank()), true);
                assert_eq!(g, &want, "{n} ranks, odd ranks in place: rank {}", c.rank());
            }
        }
    });
}

/// ReduceScatter on registered outputs: out of place, the last hop of each block (the partial
/// sum a rank sends its successor of the successor's own block) lands in the successor's
/// output, which adds its input there; in place, or where an end did not register, every hop
/// takes the FIFO. Every reduction on a float and an integer type, odd counts, random data,
/// poisoned bytes around and the in-place input's other blocks left alone.
#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_reduce_scatter_float_sum",
        nccl_rs_kernel = "nccl_reduce_scatter_float_prod",
        nccl_rs_kernel = "nccl_reduce_scatter_float_max",
        nccl_rs_kernel = "nccl_reduce_scatter_float_min",
        nccl_rs_kernel = "nccl_reduce_scatter_float_avg",
        nccl_rs_kernel = "nccl_reduce_scatter_float_premulsum",
        nccl_rs_kernel = "nccl_reduce_scatter_int32_sum",
        nccl_rs_kernel = "nccl_reduce_scatter_int32_prod",
        nccl_rs_kernel = "nccl_reduce_scatter_int32_max",
        nccl_rs_kernel = "nccl_reduce_scatter_int32_min",
        nccl_rs_kernel = "nccl_reduce_scatter_int32_avg",
        nccl_rs_kernel = "nccl_reduce_scatter_int32_premulsum"
    )),
    ignore = "needs nccl_reduce_scatter_float_sum, nccl_reduce_scatter_float_prod, nccl_reduce_scatter_float_max, nccl_reduce_scatter_float_min, nccl_reduce_scatter_float_avg, nccl_reduce_scatter_float_premulsum, nccl_reduce_scatter_int32_sum, nccl_reduce_scatter_int32_prod, nccl_reduce_scatter_int32_max, nccl_reduce_scatter_int32_min, nccl_reduce_scatter_int32_avg, nccl_reduce_scatter_int32_premulsum, which NCCL_RS_KERNELS left out"
)]
fn registered_reduce_scatter_last_hop_goes_direct() {
    isolated(true, ONE_CTA, || {
        use common::register::reduction_round_as_modelled;
        use nccl::DataType;
        for n in [2usize, 3, 4, 8] {
            let comms = common::sim_comms(n);
            let mut seed = 5000 * n as u64;
            let mut round = |dt: DataType, op: nccl::ReduceOp, who: Who, count: usize, in_place| {
                seed += 1;
                let op = common::typed_op(op, dt);
                reduction_round_as_modelled(
                    &comms,
                    Coll::ReduceScatter,
                    dt,
                    op,
                    who,
                    count,
                    in_place,
                    seed,
                )
            };
            for dt in [DataType::Float32, DataType::Int32] {
                for op in common::ALL_OPS {
                    let got = round(dt, op, Who::All, 20_001, false);
                    assert!(
                        got.iter().flatten().sum::<u64>() > 0,
                        "{n} ranks: no direct step"
                    );
                    let got = round(dt, op, Who::All, 20_001, true);
                    assert!(got.iter().flatten().all(|&s| s == 0), "{n} ranks, in place");
                }
            }
            for who in [Who::Even, Who::None] {
                round(DataType::Int32, nccl::ReduceOp::SUM, who, 20_001, false);
                round(DataType::Float32, nccl::ReduceOp::AVG, who, 9_003, false);
            }
            round(DataType::Int32, nccl::ReduceOp::SUM, Who::All, 1_003, false);
        }
    });
}

/// Reduce on registered buffers: out of place, the chain's last rank writes each piece's
/// partial sum into the root's output, which adds its input there; in place, or where either
/// end did not register, the hop takes the FIFO. Every reduction on a float and an integer
/// type, odd counts; the other ranks' output buffers stay untouched.
#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_reduce_float_sum",
        nccl_rs_kernel = "nccl_reduce_float_prod",
        nccl_rs_kernel = "nccl_reduce_float_max",
        nccl_rs_kernel = "nccl_reduce_float_min",
        nccl_rs_kernel = "nccl_reduce_float_avg",
        nccl_rs_kernel = "nccl_reduce_float_premulsum",
        nccl_rs_kernel = "nccl_reduce_int32_sum",
        nccl_rs_kernel = "nccl_reduce_int32_prod",
        nccl_rs_kernel = "nccl_reduce_int32_max",
        nccl_rs_kernel = "nccl_reduce_int32_min",
        nccl_rs_kernel = "nccl_reduce_int32_avg",
        nccl_rs_kernel = "nccl_reduce_int32_premulsum"
    )),
    ignore = "needs nccl_reduce_float_sum, nccl_reduce_float_prod, nccl_reduce_float_max, nccl_reduce_float_min, nccl_reduce_float_avg, nccl_reduce_float_premulsum, nccl_reduce_int32_sum, nccl_reduce_int32_prod, nccl_reduce_int32_max, nccl_reduce_int32_min, nccl_reduce_int32_avg, nccl_reduce_int32_premulsum, which NCCL_RS_KERNELS left out"
)]
fn registered_reduce_last_hop_goes_direct() {
    isolated(true, ONE_CTA, || {
        use common::register::reduction_round_as_modelled;
        use nccl::DataType;
        for n in [2usize, 3, 4, 8] {
            let comms = common::sim_comms(n);
            let mut seed = 7000 * n as u64;
            let mut round = |dt: DataType, op: nccl::ReduceOp, who: Who, count: usize, in_place| {
                seed += 1;
                let op = common::typed_op(op, dt);
                reduction_round_as_modelled(
                    &comms,
                    Coll::Reduce,
                    dt,
                    op,
                    who,
                    count,
                    in_place,
                    seed,
                )
            };
            for dt in [DataType::Float32, DataType::Int32] {
                for op in common::ALL_OPS {
                    let got = round(dt, op, Who::All, 10_001, false);
                    assert!(
                        got.iter().flatten().sum::<u64>() > 0,
                        "{n} ranks: no direct step"
                    );
                    let got = round(dt, op, Who::All, 10_001, true);
                    assert!(got.iter().flatten().all(|&s| s == 0), "{n} ranks, in place");
                }
            }
            for who in [Who::Even, Who::None] {
                round(DataType::Int32, nccl::ReduceOp::SUM, who, 10_001, false);
            }
            round(
                DataType::Float32,
                nccl::ReduceOp::AVG,
                Who::All,
                1_003,
                false,
            );
        }
    });
}

/// The one-node tree (NCCL_ALGO=Tree: each channel's chain in ring order) on registered
/// outputs: the way down writes each finished chunk straight into the child's output, which
/// passes it on from there; out of place the way up writes each partial sum into the parent's
/// output, which adds its input to it there. Every reduction on both types, 2 to 8 ranks,
/// all / every other / no rank registered, in and out of place, slices over and under a step:
/// results checked (random data, poisoned outputs) and each channel's direct steps equal the
/// model (`expected_direct`), so a path taken where it should not be, or not taken where it
/// should, fails.
#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_reduce_float_sum",
        nccl_rs_kernel = "nccl_all_reduce_float_prod",
        nccl_rs_kernel = "nccl_all_reduce_float_max",
        nccl_rs_kernel = "nccl_all_reduce_float_min",
        nccl_rs_kernel = "nccl_all_reduce_float_avg",
        nccl_rs_kernel = "nccl_all_reduce_float_premulsum",
        nccl_rs_kernel = "nccl_all_reduce_int32_sum",
        nccl_rs_kernel = "nccl_all_reduce_int32_prod",
        nccl_rs_kernel = "nccl_all_reduce_int32_max",
        nccl_rs_kernel = "nccl_all_reduce_int32_min",
        nccl_rs_kernel = "nccl_all_reduce_int32_avg",
        nccl_rs_kernel = "nccl_all_reduce_int32_premulsum"
    )),
    ignore = "needs nccl_all_reduce_float_sum, nccl_all_reduce_float_prod, nccl_all_reduce_float_max, nccl_all_reduce_float_min, nccl_all_reduce_float_avg, nccl_all_reduce_float_premulsum, nccl_all_reduce_int32_sum, nccl_all_reduce_int32_prod, nccl_all_reduce_int32_max, nccl_all_reduce_int32_min, nccl_all_reduce_int32_avg, nccl_all_reduce_int32_premulsum, which NCCL_RS_KERNELS left out"
)]
fn registered_tree_all_reduce_goes_direct_both_ways() {
    isolated(true, &[("NCCL_ALGO", "Tree")], || {
        use common::register::reduction_round_as_modelled;
        use nccl::DataType;
        for n in [2usize, 3, 4, 8] {
            let comms = common::sim_comms(n);
            let tree = comms[0].tuning(nccl::Coll::AllReduce, 4 * 20_001).unwrap();
            assert_eq!(tree.algo, nccl::Algo::Tree, "{n} ranks: the tuner's choice");
            assert!(comms[0].tree_chain().is_some(), "{n} ranks: no chain");
            let mut seed = 7000 * n as u64;
            let mut round = |dt: DataType, op: nccl::ReduceOp, who: Who, count: usize, in_place| {
                seed += 1;
                let op = common::typed_op(op, dt);
                let got = reduction_round_as_modelled(
                    &comms,
                    Coll::AllReduce,
                    dt,
                    op,
                    who,
                    count,
                    in_place,
                    seed,
                );
                got.iter().flatten().sum::<u64>()
            };
            for who in [Who::All, Who::Even, Who::None] {
                for count in counts(Coll::AllReduce) {
                    for in_place in [false, true] {
                        round(DataType::Int32, nccl::ReduceOp::SUM, who, count, in_place);
                    }
                }
            }
            // Both ways direct out of place, the way down alone in place.
            let (both, down) = (
                round(
                    DataType::Int32,
                    nccl::ReduceOp::SUM,
                    Who::All,
                    20_001,
                    false,
                ),
                round(DataType::Int32, nccl::ReduceOp::SUM, Who::All, 20_001, true),
            );
            assert!(
                down > 0 && both > down,
                "{n} ranks: {both} / {down} direct steps"
            );
            for dt in [DataType::Float32, DataType::Int32] {
                for op in common::ALL_OPS {
                    round(dt, op, Who::All, 9_000, false);
                }
            }
        }
    });
}
