//! A fused "AllReduce + scale + residual add" written with the device API, as inference stacks
//! hand-write after attention: `out = residual + scale * sum over ranks of x`, in one kernel
//! and one pass over the data, where a library call would take an AllReduce and then a second
//! kernel. Each rank's `x` lies in a symmetric window; its output buffer holds the residual
//! when the kernel starts and the result when it ends.
//!
//! ```text
//! cargo run --example device_api_fused [NRANKS]
//! ```
//!
//! It runs on the CPU simulator (loading such kernels on GPUs is not built yet).

mod common;

use common::device_api::{run_on_every_rank, Place};
use nccl_device::arch;

#[derive(Clone, Copy)]
struct Args {
    place: Place,
    scale: f32,
}

/// The kernel: the team barrier, then each element once: read it from every rank, scale the
/// sum, add it to the residual in place; the barrier again before inputs may change.
///
/// # Safety
/// As `one_shot_all_reduce` in `device_api_all_reduce.rs`.
unsafe fn all_reduce_scale_add(a: &Args) {
    let p = &a.place;
    let barrier = p.comm.lsa_barrier(arch::block_idx());
    if barrier.sync().is_err() {
        return;
    }
    let stride = (arch::grid_dim() * arch::block_dim()) as usize;
    let mut i = (arch::block_idx() * arch::block_dim() + arch::thread_idx()) as usize;
    while i < p.count {
        let sum: f32 = (0..p.comm.lsa_size)
            .map(|peer| *(p.comm.lsa_ptr(&p.input, 4 * i, peer) as *const f32))
            .sum();
        let out = (p.output as *mut f32).add(i);
        *out += a.scale * sum;
        i += stride;
    }
    let _ = barrier.sync();
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n = common::nranks_arg(4);
    let (count, scale) = (4099, 0.5f32);
    // Small integers and a power-of-two scale: every result is exact in f32.
    let x = |r: usize| -> Vec<f32> { (0..count).map(|i| ((r + 3 * i) % 11) as f32).collect() };
    let residual =
        |r: usize| -> Vec<f32> { (0..count).map(|i| (r * 100 + i % 7) as f32).collect() };
    let outputs = run_on_every_rank(
        n,
        count,
        &x,
        &residual,
        &|place| Args { place, scale },
        all_reduce_scale_add,
    )?;
    for (r, got) in outputs.into_iter().enumerate() {
        let want: Vec<f32> = (0..count)
            .map(|i| residual(r)[i] + scale * (0..n).map(|q| x(q)[i]).sum::<f32>())
            .collect();
        if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
            return Err(format!("rank {r}: element {i} is {} not {}", got[i], want[i]).into());
        }
    }
    println!("device API fused AllReduce + scale + residual on {n} ranks: correct on every rank");
    Ok(())
}
