//! Bad input on the simulator: every case is an error value with a message, never a panic or a
//! hang.

use nccl::{Backend, Comm, DataType, NcclResult, ReduceOp, UniqueId};
use std::time::{Duration, Instant};

fn sim() {
    nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
}

#[test]
fn buffers_and_counts() {
    sim();
    let comms = Comm::init_all(&[0, 1]).expect("init");
    let c = &comms[0];
    let buf = c.device().alloc(4096).unwrap();
    let other = comms[1].device().alloc(4096).unwrap();
    let s = Default::default();
    let code = |r: nccl::Result<()>| r.unwrap_err().code;
    assert_eq!(
        code(c.all_reduce(0, buf.ptr, 4, DataType::Float32, ReduceOp::Sum, s)),
        NcclResult::InvalidArgument
    );
    assert_eq!(
        code(c.all_reduce(buf.ptr + 1, buf.ptr, 4, DataType::Int32, ReduceOp::Sum, s)),
        NcclResult::InvalidArgument
    );
    assert_eq!(
        code(c.all_reduce(
            buf.ptr,
            buf.ptr,
            usize::MAX / 2,
            DataType::Float64,
            ReduceOp::Sum,
            s
        )),
        NcclResult::InvalidArgument
    );
    let e = c
        .all_reduce(other.ptr, buf.ptr, 4, DataType::Float32, ReduceOp::Sum, s)
        .unwrap_err();
    assert!(e.message.contains("device 1"), "{e}");
    let host = [0u32; 8];
    assert_eq!(
        code(c.all_reduce(
            host.as_ptr() as u64,
            buf.ptr,
            4,
            DataType::Uint32,
            ReduceOp::Sum,
            s
        )),
        NcclResult::InvalidArgument
    );
    assert!(nccl::error::last_error().contains("not device memory"));
    // Zero elements: nothing to do, even with null buffers (as NCCL).
    assert!(c
        .all_reduce(0, 0, 0, DataType::Float32, ReduceOp::Sum, s)
        .is_ok());
    assert_eq!(DataType::from_raw(12), None);
    assert_eq!(ReduceOp::from_raw(5), None);
}

#[test]
fn ranks_and_ids() {
    sim();
    let id = nccl::get_unique_id().unwrap();
    let dev = nccl::Device::open(0).unwrap();
    assert_eq!(
        Comm::init_rank_on(dev.clone(), 2, &id, 2).unwrap_err().code,
        NcclResult::InvalidArgument
    );
    assert_eq!(
        Comm::init_rank_on(dev.clone(), 0, &id, 0).unwrap_err().code,
        NcclResult::InvalidArgument
    );
    let garbage = UniqueId {
        internal: [0x5a; nccl::bootstrap::UNIQUE_ID_BYTES],
    };
    let t = Instant::now();
    let e = Comm::init_rank_on(dev, 2, &garbage, 0).unwrap_err();
    assert_eq!(e.code, NcclResult::InvalidArgument, "{e}");
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(nccl::Device::open(1000).is_err());
}

#[test]
fn missing_rank_times_out() {
    sim();
    std::env::set_var("NCCL_BOOTSTRAP_TIMEOUT_MS", "500");
    let id = nccl::get_unique_id().unwrap();
    let t = Instant::now();
    let e = Comm::init_rank_on(nccl::Device::open(2).unwrap(), 2, &id, 0).unwrap_err();
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t.elapsed()
    );
    assert!(
        matches!(e.code, NcclResult::RemoteError | NcclResult::SystemError),
        "{e}"
    );
}
