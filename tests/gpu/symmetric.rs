//! The symmetric path on real GPUs (ignored without one; see `collectives.rs`).

use crate::collectives::{counts, gpus};
use crate::common::{self, check_all_reduce, Drive, ALL_OPS};
use nccl::Coll;

/// The symmetric path (`comm/window.rs`) on 2 and 4 ranks of one process: AllReduce inputs
/// staged (every type and reduction, odd counts, in and out of place), AllGather and
/// ReduceScatter staged (every type, reductions in turn), and every collective of the path
/// with inputs read in the windows where they lie (aligned and not), in place in a window, and
/// in windows on even ranks only.
#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn symmetric_path_on_2_and_4_ranks() {
    // Up to 1 MiB: the LL form and, above 64 KiB, the loads.
    let env = [("NCCL_RS_SYMMETRIC_MAX_BYTES", "1048576")];
    common::procs::isolated(&env, &[], symmetric_path);
}

fn symmetric_path() {
    use crate::common::windows::{
        launches, staged_matrix, symmetric_windows, window_cases, SYMMETRIC_COLLS,
    };
    for n in counts(&[2, 4]) {
        let ranks = gpus(n);
        let bytes = 1 << 20;
        let windows = symmetric_windows(&ranks.comms, bytes);
        for (k, dt) in common::matrix_types().into_iter().enumerate() {
            for (j, op) in ALL_OPS.into_iter().enumerate() {
                for (i, count) in [1usize, 1001, 65_537].into_iter().enumerate() {
                    let before = launches(&ranks);
                    let in_place = (i + j + k) % 2 == 1;
                    let seed = (k * 100 + j * 10 + i) as u64;
                    let ran =
                        check_all_reduce(&ranks, count, dt, op, in_place, seed, Drive::OneThread)
                            .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
                    if ran == common::Checked::Ran && count * dt.size() <= 1 << 20 {
                        assert_eq!(
                            launches(&ranks),
                            before + n as u64,
                            "{n} ranks: not symmetric"
                        );
                    }
                }
            }
        }
        for coll in [Coll::AllGather, Coll::ReduceScatter] {
            staged_matrix(&ranks, coll, &[1, 1001, 20_001], 1 << 20);
        }
        for coll in SYMMETRIC_COLLS {
            window_cases(&ranks, coll, &windows, &[3, 4096, 60_001], bytes);
        }
    }
}
