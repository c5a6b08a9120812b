//! The kernel lab on the simulator: ranks of one process share a GPU only when
//! NCCL_RS_SHARED_GPUS=1 asks for it; otherwise that is NCCL's duplicate-GPU error.

use crate::common::{self, check_collective, Drive, Ranks};
use nccl::{Comm, DataType, NcclResult, ReduceOp};
use nccl_device::abi::Coll;

#[test]
fn ranks_share_a_gpu_only_when_asked() {
    let cases: [(&str, &[(&str, &str)]); 2] = [
        ("unset", &[("NCCL_RS_SHARED_GPUS", "")]),
        ("shared", &[("NCCL_RS_SHARED_GPUS", "1")]),
    ];
    common::procs::isolated_cases(&cases, |case| {
        common::sim();
        if case == "unset" {
            let err = Comm::init_all(&[0, 0]).expect_err("two ranks on one GPU");
            assert_eq!(err.code, NcclResult::InvalidUsage, "{err}");
            assert!(err.to_string().contains("duplicate GPU"), "{err}");
            return;
        }
        for devs in [vec![0, 0], vec![0, 1, 0, 1]] {
            let ranks = Ranks::new(Comm::init_all(&devs).expect("init_all on shared GPUs"));
            for coll in [Coll::AllReduce, Coll::Broadcast, Coll::AllGather] {
                check_collective(
                    &ranks,
                    coll,
                    1021,
                    DataType::Float32,
                    ReduceOp::SUM,
                    1,
                    false,
                    7,
                    Drive::Group,
                )
                .unwrap_or_else(|e| panic!("{devs:?} {coll:?}: {e}"));
            }
            common::check_all_to_all(&ranks, 3, Drive::Group)
                .unwrap_or_else(|e| panic!("{devs:?} all-to-all: {e}"));
        }
    });
}

/// Ranks of one process sharing a GPU: rank 0's AllReduce waits on the device for rank 1,
/// whose host first reads a buffer. `to_vec_after(stream)` waits for rank 1's stream only and
/// returns; `to_vec` would wait for every stream of the device, rank 0's kernel included, which
/// waits for rank 1: the hang the device-API MoE example met on a GPU.
#[test]
fn a_copy_after_a_stream_does_not_wait_for_a_peer_s_kernel() {
    let cases: [(&str, &[(&str, &str)]); 1] = [("shared", &[("NCCL_RS_SHARED_GPUS", "1")])];
    common::procs::isolated_cases(&cases, |_| {
        common::sim();
        let comms = Comm::init_all(&[0, 0]).expect("init_all on a shared GPU");
        let dev = comms[0].device().clone();
        let streams = [
            nccl::Stream::new(&dev).unwrap(),
            nccl::Stream::new(&dev).unwrap(),
        ];
        let mut bufs: Vec<nccl::DeviceBuffer<f32>> = (0..2)
            .map(|r| nccl::DeviceBuffer::from_slice(&dev, &[r as f32 + 1.0; 64]).unwrap())
            .collect();
        let (first, second) = bufs.split_at_mut(1);
        comms[0]
            .all_reduce_in_place(&mut first[0], nccl::Op::SUM, &streams[0])
            .unwrap();
        let (buf1, stream1) = (&mut second[0], &streams[1]);
        let before = buf1.to_vec_after(stream1).unwrap();
        assert_eq!(before, [2.0; 64], "rank 1's input");
        comms[1]
            .all_reduce_in_place(buf1, nccl::Op::SUM, stream1)
            .unwrap();
        for (b, s) in bufs.iter().zip(&streams) {
            assert_eq!(b.to_vec_after(s).unwrap(), [3.0; 64]);
        }
    });
}
