//! The kernel lab on the simulator: ranks of one process share a GPU only when
//! NCCL_RS_SHARED_GPUS=1 asks for it; otherwise that is NCCL's duplicate-GPU error.

mod common;

use common::{check_collective, Drive, Ranks};
use nccl::{Backend, Comm, DataType, NcclResult, ReduceOp};
use nccl_device::abi::Coll;

#[test]
fn ranks_share_a_gpu_only_when_asked() {
    nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
    // One test in this binary: the variable is process-wide.
    std::env::remove_var("NCCL_RS_SHARED_GPUS");
    let err = Comm::init_all(&[0, 0]).expect_err("two ranks on one GPU");
    assert_eq!(err.code, NcclResult::InvalidUsage, "{err}");
    assert!(err.to_string().contains("duplicate GPU"), "{err}");

    std::env::set_var("NCCL_RS_SHARED_GPUS", "1");
    for devs in [vec![0, 0], vec![0, 1, 0, 1]] {
        let ranks = Ranks::new(Comm::init_all(&devs).expect("init_all on shared GPUs"));
        for coll in [Coll::AllReduce, Coll::Broadcast, Coll::AllGather] {
            check_collective(
                &ranks,
                coll,
                1021,
                DataType::Float32,
                ReduceOp::Sum,
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
}
