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

/// Replays and direct calls in flight together, never synchronised in between: the
/// communicator orders them through the graphs' external event nodes.
#[test]
fn replays_and_direct_calls_in_flight_together_are_ordered() {
    nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
    for n in [2usize, 4] {
        let devs: Vec<i32> = (0..n as i32).collect();
        let ranks = Ranks::new(Comm::init_all(&devs).expect("init_all"));
        common::graphs::replays_interleaved_with_direct_calls(&ranks, 20)
            .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
    }
}

/// A send/recv group whose streams are partly capturing (its launch would join them) is
/// refused on every rank, before anything of it is launched into or outside the capture.
#[test]
fn a_group_mixing_captured_and_direct_streams_is_refused() {
    use nccl::{DataType, NcclResult};
    nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
    let ranks = Ranks::new(Comm::init_all(&[0, 1]).expect("init_all"));
    let bufs: Vec<_> = ranks
        .comms
        .iter()
        .map(|c| c.device().alloc(128).expect("alloc"))
        .collect();
    let direct: Vec<_> = ranks
        .comms
        .iter()
        .map(|c| c.device().stream_create().expect("stream"))
        .collect();
    for (c, s) in ranks.comms.iter().zip(&ranks.streams) {
        c.device().capture_begin(*s).expect("begin capture");
    }
    nccl::group_start();
    for (i, c) in ranks.comms.iter().enumerate() {
        let (p, f, peer) = (bufs[i].ptr, DataType::Float32, 1 - i);
        c.send(p, 16, f, peer, ranks.streams[i]).expect("queue");
        c.recv(p + 64, 16, f, peer, direct[i]).expect("queue");
    }
    let err = nccl::group_end().expect_err("mixed capture states in one group");
    assert_eq!(err.code, NcclResult::InvalidUsage, "{err}");
    for (c, s) in ranks.comms.iter().zip(&ranks.streams) {
        c.device().capture_end(*s).expect("end capture");
    }
    for (c, s) in ranks.comms.iter().zip(&direct) {
        c.device().stream_destroy(*s).expect("destroy stream");
    }
}
