//! CUDA graph capture on the simulator: collectives and sends/receives captured once, replayed
//! with new inputs, with direct calls of the same communicators on other streams in between.

mod common;

use common::Ranks;
use nccl::{Backend, Comm};

#[test]
fn captured_work_replays_100_times_beside_direct_calls() {
    nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
    for n in [2usize, 4] {
        let devs: Vec<i32> = (0..n as i32).collect();
        let ranks = Ranks::new(Comm::init_all(&devs).expect("init_all"));
        common::graphs::capture_and_replay(&ranks, 100)
            .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
    }
}
