//! Buffer extents on a real GPU (issue 23): the driver backend checks every buffer against
//! its allocation (`cuMemGetAddressRange`, cached by allocation base). Ignored where there is
//! no GPU (run it on the GPU host with --include-ignored).

use nccl::{Backend, Comm, DataType, NcclResult, ReduceOp};
use std::time::Instant;

#[test]
#[ignore = "needs an NVIDIA GPU: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn gpu_buffer_extents() {
    nccl::cuda::set_backend(Backend::Cuda).expect("choose the CUDA backend");
    let comms = Comm::init_all(&[0]).expect("a one-rank communicator on GPU 0");
    let (c, s) = (&comms[0], Default::default());
    let f32 = DataType::Float32;
    let sum = ReduceOp::SUM;
    let small = c.device().alloc(4096).unwrap();
    let big = c.device().alloc(8192).unwrap();
    let refused = |r: nccl::Result<()>, what: &str| {
        let e = r.expect_err("a short buffer must be refused");
        eprintln!("refused as it should: {e}");
        assert_eq!(e.code, NcclResult::InvalidArgument, "{e}");
        assert!(e.message.contains(what), "{e}");
        assert!(
            e.message.contains("8192") || e.message.contains("16"),
            "{e}"
        );
    };
    refused(
        unsafe { c.all_reduce_raw(small.ptr(), big.ptr(), 2048, f32, sum, s) },
        "sendbuff",
    );
    refused(
        unsafe { c.all_reduce_raw(big.ptr(), small.ptr(), 2048, f32, sum, s) },
        "recvbuff",
    );
    refused(
        unsafe { c.all_reduce_raw(big.ptr() + 8184, big.ptr(), 4, f32, sum, s) },
        "sendbuff",
    );
    refused(
        unsafe { c.all_gather_raw(small.ptr(), big.ptr(), 2048, f32, s) },
        "sendbuff",
    );
    refused(
        unsafe { c.send_raw(small.ptr(), 2048, f32, 0, s) },
        "sendbuff",
    );
    // What fits runs (one rank: a launched copy).
    big.write(0, &[7u8; 8192]).unwrap();
    unsafe { c.all_reduce_raw(big.ptr(), small.ptr(), 1024, f32, sum, s) }.unwrap();
    c.device().stream_sync(s).unwrap();
    let mut out = vec![0u8; 4096];
    small.read(0, &mut out).unwrap();
    assert!(out.iter().all(|&b| b == 7));
    // The check's cost: one rank in place returns right after the checks, launching nothing.
    let n = 100_000;
    let t = Instant::now();
    for _ in 0..n {
        unsafe { c.all_reduce_raw(big.ptr(), big.ptr(), 2048, f32, sum, s) }.unwrap();
    }
    eprintln!(
        "one-rank in-place AllReduce (checks only): {:.3} us a call",
        t.elapsed().as_secs_f64() * 1e6 / n as f64
    );
    // A freed allocation's cache entry goes with it: a larger buffer at a reused address is
    // accepted whole.
    drop(small);
    let bigger = c.device().alloc(16384).unwrap();
    unsafe { c.all_reduce_raw(bigger.ptr(), bigger.ptr(), 4096, f32, sum, s) }.unwrap();
    c.device().stream_sync(s).unwrap();
    drop(bigger);
    drop(big);
    for c in comms {
        c.destroy().unwrap();
    }
}

/// `ncclMemAlloc`'s memory on a real GPU (issue 24 item 1): a VMM mapping, rounded to the
/// granularity, zeroed; a buffer in it is checked against the mapping's extent, and a
/// collective on it runs; freeing it unmaps it (the same address then is no device memory).
#[test]
#[ignore = "needs an NVIDIA GPU: run on the GPU host with --include-ignored (docs/gpu-hosts.md)"]
fn gpu_mem_alloc_is_a_vmm_mapping() {
    nccl::cuda::set_backend(Backend::Cuda).expect("choose the CUDA backend");
    let comms = Comm::init_all(&[0]).expect("a one-rank communicator on GPU 0");
    let (c, s) = (&comms[0], Default::default());
    let (f32, sum) = (DataType::Float32, ReduceOp::SUM);
    let asked = 3 * 4096 + 4;
    let buf = c.device().alloc_vmm(asked).expect("alloc_vmm");
    let mut bytes = vec![1u8; asked];
    buf.read(0, &mut bytes).unwrap();
    assert!(bytes.iter().all(|&b| b == 0), "not zeroed");
    // The extent is the whole mapping (the recommended granularity, 2 MiB on current GPUs):
    // a call on it up to the granularity passes the check, one past the mapping does not.
    let gran = 2 << 20;
    let e = unsafe { c.all_reduce_raw(buf.ptr(), buf.ptr(), gran / 4 + 1, f32, sum, s) }
        .expect_err("past the mapping");
    assert_eq!(e.code, NcclResult::InvalidArgument, "{e}");
    eprintln!("refused as it should: {e}");
    let out = c.device().alloc_vmm(gran).expect("alloc_vmm");
    buf.write(0, &[3u8; 4096]).unwrap();
    unsafe { c.all_reduce_raw(buf.ptr(), out.ptr(), gran / 4, f32, sum, s) }.unwrap();
    c.device().stream_sync(s).unwrap();
    let mut got = vec![0u8; 4096];
    out.read(0, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 3));
    let p = buf.ptr();
    drop(buf);
    let e = unsafe { c.all_reduce_raw(p, out.ptr(), 16, f32, sum, s) }
        .expect_err("a freed mapping is no device memory");
    eprintln!("after free, refused as it should: {e}");
}
