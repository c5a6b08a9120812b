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
