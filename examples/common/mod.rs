//! What every example shares: the choice of backend.
//!
//! `NCCL_RS_BACKEND=cuda|sim` decides when it is set. Otherwise the examples run on CUDA when
//! the NVIDIA driver lists a GPU (`/proc/driver/nvidia/gpus`), and on the CPU simulator when it
//! lists none, so that `cargo run --example NAME` works on any machine. The library itself
//! never falls back to the simulator: the program chooses, as this function does.

#![allow(dead_code)] // each example uses part of it

use nccl::Backend;

/// Chooses the backend for this process (before any other nccl call) and says which.
pub fn choose_backend() -> nccl::Result<Backend> {
    let backend = match std::env::var("NCCL_RS_BACKEND").as_deref() {
        Ok("sim") | Ok("SIM") | Ok("simulator") => Backend::Sim,
        Ok("cuda") | Ok("CUDA") => Backend::Cuda,
        _ if gpu_listed() => Backend::Cuda,
        _ => Backend::Sim,
    };
    nccl::cuda::set_backend(backend)?;
    Ok(backend)
}

/// Whether the NVIDIA driver lists at least one GPU.
fn gpu_listed() -> bool {
    std::fs::read_dir("/proc/driver/nvidia/gpus")
        .map(|mut d| d.next().is_some())
        .unwrap_or(false)
}

/// How many ranks an example runs: its first argument, else `default`.
pub fn nranks_arg(default: usize) -> usize {
    std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

/// The device a rank uses: ranks share the devices round-robin.
pub fn device_for(rank: usize) -> nccl::Result<nccl::Device> {
    let n = nccl::cuda::device_count()?.max(1);
    nccl::Device::open((rank % n) as i32)
}
