//! One-sided operations on real GPUs (ignored without one; see `collectives.rs`): puts on the
//! copy engine into peers' windows, signals and waits as stream memory operations.

use crate::collectives::{counts, gpus};
use crate::common::onesided::all_to_all_by_puts;

/// An all-to-all made of `ncclPutSignal` and `ncclWaitSignal` on 2 and 4 ranks of one
/// process, three rounds on the same windows: the waits hold their streams until the data
/// landed.
#[test]
#[ignore = "needs NVIDIA GPUs: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn puts_and_signals_on_2_and_4_ranks() {
    for n in counts(&[2, 4]) {
        let ranks = gpus(n);
        all_to_all_by_puts(&ranks, 100_003, 3);
    }
}
