//! The CUDA backend on a machine without a driver or GPU answers with an error value that says
//! what to do, never a panic.

use crate::common::procs;

/// In a child process of its own: the backend is chosen once per process.
#[test]
fn cuda_backend_without_a_gpu_is_a_clear_error() {
    procs::isolated(&[], &[], without_a_gpu);
}

fn without_a_gpu() {
    nccl::cuda::set_backend(nccl::Backend::Cuda).expect("choose the CUDA backend");
    match nccl::cuda::device_count() {
        Ok(n) => {
            // A GPU host: the driver answered, and opening a device beyond the count fails cleanly.
            let e = nccl::Device::open(n as i32).unwrap_err();
            assert_eq!(e.code, nccl::NcclResult::InvalidArgument, "{e}");
        }
        Err(e) => {
            assert!(
                matches!(
                    e.code,
                    nccl::NcclResult::SystemError | nccl::NcclResult::UnhandledCudaError
                ),
                "{e}"
            );
            assert!(
                e.message.contains("NCCL_RS_BACKEND=sim") || e.message.contains("cu"),
                "{e}"
            );
            assert!(nccl::Comm::init_all(&[0, 1]).is_err());
        }
    }
}
