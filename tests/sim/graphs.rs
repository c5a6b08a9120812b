//! CUDA graph capture on the simulator: collectives and sends/receives captured once, replayed
//! with new inputs, with direct calls of the same communicators on other streams in between.
//! Each test runs alone in a child process: while a device's stream captures, the simulator
//! (as CUDA) refuses work that waits for the whole device, such as other tests' host copies.

use crate::common::graphs::FirstUse;
use crate::common::{self, Ranks};
use nccl::Comm;

#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_reduce_float_sum",
        nccl_rs_kernel = "nccl_all_gather",
        nccl_rs_kernel = "nccl_p2p"
    )),
    ignore = "needs nccl_all_reduce_float_sum, nccl_all_gather and nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn captured_work_replays_100_times_beside_direct_calls() {
    common::procs::isolated(&[], &[], || {
        common::sim();
        for n in [2usize, 4] {
            let devs: Vec<i32> = (0..n as i32).collect();
            let ranks = Ranks::new(Comm::init_all(&devs).expect("init_all"));
            common::graphs::capture_and_replay(&ranks, 100, FirstUse::BeforeCapture)
                .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
        }
    });
}

/// A program's first use of its communicators inside captures on blocking streams: kernels
/// load and send/recv connections are made while the captures are open, and none of that
/// may touch the legacy stream (which would join the captures and invalidate them).
#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_reduce_float_sum",
        nccl_rs_kernel = "nccl_all_gather",
        nccl_rs_kernel = "nccl_p2p"
    )),
    ignore = "needs nccl_all_reduce_float_sum, nccl_all_gather and nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn first_use_inside_captures_on_blocking_streams() {
    common::procs::isolated(&[], &[], || {
        common::sim();
        for n in [1usize, 2, 4] {
            let devs: Vec<i32> = (0..n as i32).collect();
            let ranks = Ranks::blocking(Comm::init_all(&devs).expect("init_all"));
            common::graphs::capture_and_replay(&ranks, 20, FirstUse::InsideCapture)
                .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
        }
    });
}

/// As CUDA: work on the legacy stream while a blocking stream of the device captures is
/// refused (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) and invalidates that capture; beside a
/// non-blocking stream's capture it is allowed.
#[test]
fn legacy_stream_work_invalidates_a_blocking_capture() {
    common::procs::isolated(&[], &[], || {
        use nccl::{NcclResult, StreamHandle};
        common::sim();
        let d = nccl::Device::open(0).expect("open");
        let legacy = StreamHandle(0);
        let free = d.stream_create().expect("stream");
        let blocking = d.stream_create_blocking().expect("stream");
        d.capture_begin(free).expect("begin");
        d.stream_sync(legacy)
            .expect("the legacy stream beside a non-blocking capture");
        d.capture_end(free).expect("end a non-blocking capture");
        d.capture_begin(blocking).expect("begin");
        let err = d
            .stream_sync(legacy)
            .expect_err("the legacy stream during a blocking capture");
        assert_eq!(err.code, NcclResult::UnhandledCudaError, "{err}");
        assert!(err.to_string().contains("STREAM_CAPTURE_IMPLICIT"), "{err}");
        let err = d
            .capture_end(blocking)
            .err()
            .expect("the capture was invalidated");
        assert!(err.to_string().contains("INVALIDATED"), "{err}");
        // A new capture starts clean.
        d.capture_begin(blocking).expect("begin again");
        d.capture_end(blocking)
            .expect("end a capture nothing invalidated");
        d.capture_begin(legacy)
            .expect_err("the legacy stream cannot be captured");
        for s in [free, blocking] {
            d.stream_destroy(s).expect("destroy");
        }
    });
}

/// Replays and direct calls in flight together, never synchronised in between: the
/// communicator orders them through the graphs' external event nodes.
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_float_sum"),
    ignore = "needs nccl_all_reduce_float_sum, which NCCL_RS_KERNELS left out"
)]
fn replays_and_direct_calls_in_flight_together_are_ordered() {
    common::procs::isolated(&[], &[], || {
        common::sim();
        for n in [2usize, 4] {
            let devs: Vec<i32> = (0..n as i32).collect();
            let ranks = Ranks::new(Comm::init_all(&devs).expect("init_all"));
            common::graphs::replays_interleaved_with_direct_calls(&ranks, 20)
                .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
        }
    });
}

/// A send/recv group whose streams are partly capturing (its launch would join them) is
/// refused on every rank, before anything of it is launched into or outside the capture.
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_p2p"),
    ignore = "needs nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn a_group_mixing_captured_and_direct_streams_is_refused() {
    common::procs::isolated(&[], &[], || {
        use nccl::{DataType, NcclResult};
        common::sim();
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
            let (p, f, peer) = (bufs[i].ptr(), DataType::Float32, 1 - i);
            unsafe { c.send_raw(p, 16, f, peer, ranks.streams[i]) }.expect("queue");
            unsafe { c.recv_raw(p + 64, 16, f, peer, direct[i]) }.expect("queue");
        }
        let err = nccl::group_end().expect_err("mixed capture states in one group");
        assert_eq!(err.code, NcclResult::InvalidUsage, "{err}");
        for (c, s) in ranks.comms.iter().zip(&ranks.streams) {
            c.device().capture_end(*s).expect("end capture");
        }
        for (c, s) in ranks.comms.iter().zip(&direct) {
            c.device().stream_destroy(*s).expect("destroy stream");
        }
    });
}
