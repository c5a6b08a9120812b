//! One-rank communicators on the simulator: an out-of-place collective is a stream-ordered
//! copy (the copy engine's job on a GPU), an in-place one does nothing; neither launches a
//! kernel, and both hold in CUDA graphs.

use crate::common::graphs::{capture_and_replay, FirstUse};
use crate::common::{self, check_collective, Checked, Drive, Ranks};
use nccl::{DataType, ReduceOp};
use nccl_device::abi::Coll;

fn one_rank() -> Ranks {
    common::sim_ranks(1)
}

/// The launch counter is per process: alone in a child process.
#[test]
fn one_rank_collectives_launch_no_kernel() {
    common::procs::isolated(&[], &[], launch_no_kernel);
}

fn launch_no_kernel() {
    let ranks = one_rank();
    let before = nccl::cuda::sim::launch_count();
    for (i, coll) in Coll::ALL.into_iter().enumerate() {
        for (j, (dt, op)) in [
            (DataType::Float32, ReduceOp::SUM),
            (DataType::Int32, ReduceOp::AVG),
            (DataType::Bfloat16, ReduceOp::MAX),
            (DataType::Float64, ReduceOp::PROD),
        ]
        .into_iter()
        .enumerate()
        {
            for count in [1usize, 1000, 300_001] {
                for in_place in [false, true] {
                    check_collective(
                        &ranks,
                        coll,
                        count,
                        dt,
                        op,
                        0,
                        in_place,
                        (i * 100 + j * 10) as u64 + count as u64,
                        Drive::OneThread,
                    )
                    .unwrap_or_else(|e| panic!("{} {dt:?} count {count}: {e}", coll.name()));
                }
            }
        }
    }
    assert_eq!(
        nccl::cuda::sim::launch_count(),
        before,
        "a one-rank collective launched a kernel"
    );
    // A scaled sum still runs the kernel (it multiplies): right values, one launch per call.
    let checked = check_collective(
        &ranks,
        Coll::AllReduce,
        777,
        DataType::Float32,
        ReduceOp::pre_mul_sum(2.0f32.to_bits() as u64),
        0,
        false,
        5,
        Drive::OneThread,
    )
    .expect("PreMulSum on one rank");
    if checked == Checked::Ran {
        assert!(nccl::cuda::sim::launch_count() > before);
    }
}

#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_reduce_float_sum",
        nccl_rs_kernel = "nccl_all_gather",
        nccl_rs_kernel = "nccl_p2p"
    )),
    ignore = "needs nccl_all_reduce_float_sum, nccl_all_gather and nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn one_rank_copies_replay_in_graphs() {
    common::procs::isolated(&[], &[], || {
        let ranks = one_rank();
        capture_and_replay(&ranks, 5, FirstUse::BeforeCapture).expect("direct, then captured");
        let ranks = one_rank();
        capture_and_replay(&ranks, 5, FirstUse::InsideCapture).expect("first use in the capture");
    });
}

/// (Tests that capture run alone in a child process: while a stream captures, work that waits
/// for the whole device, such as other tests' host copies, is refused.)
///
/// A captured one-rank copy is one graph node, as NCCL's memcpy node: the communicator's
/// launch order (an event wait and an event record around each launch) stays out of it, and
/// the replays still copy.
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_float_sum"),
    ignore = "needs nccl_all_reduce_float_sum, which NCCL_RS_KERNELS left out"
)]
fn a_captured_one_rank_copy_is_one_graph_node() {
    common::procs::isolated(&[], &[], || {
        let ranks = one_rank();
        let (comm, stream) = (&ranks.comms[0], ranks.streams[0]);
        let dev = comm.device();
        let count = 1000;
        let (src, dst) = (
            dev.alloc(count * 4).expect("src"),
            dev.alloc(count * 4).expect("dst"),
        );
        let all_reduce = || {
            // SAFETY: both buffers hold `count` floats and live until the stream is synchronized.
            unsafe {
                comm.all_reduce_raw(
                    src.ptr(),
                    dst.ptr(),
                    count,
                    DataType::Float32,
                    ReduceOp::SUM,
                    stream,
                )
            }
        };
        // A direct call first: the communicator's order then has a launch to wait for.
        all_reduce().expect("direct call");
        dev.stream_sync(stream).expect("sync");
        dev.capture_begin(stream).expect("capture");
        let calls = 4;
        let issued = (0..calls).try_for_each(|_| all_reduce());
        let graph = dev.capture_end(stream).expect("end the capture");
        issued.expect("captured calls");
        assert_eq!(graph.sim_node_count(), Some(calls));
        for round in 0..3u32 {
            let input: Vec<f32> = (0..count).map(|i| (i as u32 * 7 + round) as f32).collect();
            src.write(0, &bytemuck_f32(&input)).expect("input");
            dst.write(0, &vec![0xffu8; count * 4]).expect("poison");
            graph.launch(stream).expect("replay");
            dev.stream_sync(stream).expect("sync");
            let mut out = vec![0u8; count * 4];
            dst.read(0, &mut out).expect("output");
            assert_eq!(out, bytemuck_f32(&input), "replay {round}");
        }
    });
}

fn bytemuck_f32(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

/// `ncclCommInitAll`'s ranks are all in this process, so its bootstrap listens on loopback
/// whatever interface the default choice (`NCCL_SOCKET_IFNAME`, never set by this binary)
/// would pick; tests built on it never use the machine's own address.
#[test]
fn init_all_bootstraps_on_loopback() {
    let ranks = one_rank();
    let addrs = ranks.comms[0].bootstrap_addresses();
    assert!(!addrs.is_empty());
    for a in addrs {
        assert!(a.ip().is_loopback(), "a bootstrap address of init_all: {a}");
    }
}

/// A send to ourselves matched by a receive in one group is a copy cut into CTAs (one per
/// 32 KiB, up to the room its launch has): every byte lands once at its place, at an
/// aligned and at an odd offset, with random data and poison either side, from nothing to
/// more pieces than fit (the last ones then larger); twice in one group, the copies pair in
/// order.
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_p2p"),
    ignore = "needs nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn one_rank_send_to_self_copies_every_byte() {
    let ranks = one_rank();
    let c = &ranks.comms[0];
    let s = c.device().stream_create().unwrap();
    let mut rng = common::Rng::new(77);
    // 256: every piece 16-byte aligned (the copy's whole-hunk loop); 259, odd: no piece is.
    for (bytes, edge) in [256usize, 259].into_iter().flat_map(|edge| {
        [
            0usize,
            1,
            17,
            256 << 10,
            (256 << 10) + 1,
            (5 << 20) + 3,
            (9 << 20) + 5,
        ]
        .map(|bytes| (bytes, edge))
    }) {
        let data: Vec<Vec<u8>> = (0..2)
            .map(|_| (0..bytes).map(|_| rng.next() as u8).collect())
            .collect();
        let srcs: Vec<_> = data
            .iter()
            .map(|d| {
                let b = c.device().alloc(bytes.max(1)).unwrap();
                b.write(0, d).unwrap();
                b
            })
            .collect();
        let dsts: Vec<_> = (0..2)
            .map(|_| {
                let b = c.device().alloc(bytes + 2 * edge).unwrap();
                b.write(0, &vec![0xA5; bytes + 2 * edge]).unwrap();
                b
            })
            .collect();
        nccl::group_start();
        for k in 0..2 {
            // SAFETY: both buffers hold `bytes` bytes at these places until the sync below.
            unsafe {
                c.send_raw(srcs[k].ptr(), bytes, DataType::Uint8, 0, s)
                    .unwrap();
                c.recv_raw(dsts[k].ptr() + edge as u64, bytes, DataType::Uint8, 0, s)
                    .unwrap();
            }
        }
        nccl::group_end().unwrap();
        c.device().stream_sync(s).unwrap();
        for k in 0..2 {
            let mut got = vec![0u8; bytes + 2 * edge];
            dsts[k].read(0, &mut got).unwrap();
            assert!(
                got[edge..edge + bytes] == data[k][..],
                "{bytes} B, copy {k}: wrong bytes"
            );
            let around = got[..edge].iter().chain(&got[edge + bytes..]);
            assert!(
                around.into_iter().all(|&b| b == 0xA5),
                "{bytes} B, copy {k}: poison overwritten"
            );
        }
    }
    c.device().stream_destroy(s).unwrap();
}
