//! A one-shot AllReduce written with the device API (`nccl_device::api`), the kind of kernel
//! inference stacks write by hand: every rank's input lies in a symmetric window; the kernel
//! meets the LSA team at a barrier (every input is in place), sums element `i` over every rank
//! with loads from the peers' windows (in rank order: the same bits on every rank), writes the
//! sum to its own output, and meets the team again before any rank may overwrite its input.
//!
//! ```text
//! cargo run --example device_api_all_reduce [NRANKS]
//! ```
//!
//! It runs on the CPU simulator, which runs the kernel's code on host threads; loading such
//! kernels on GPUs is not built yet.

mod common;

use common::device_api::{run_on_every_rank, Place};
use nccl_device::arch;

/// The kernel, as every thread of every CTA runs it.
///
/// # Safety
/// `a` names live memory of a communicator every rank launched this kernel on, with the same
/// grid.
unsafe fn one_shot_all_reduce(a: &Place) {
    let cta = arch::block_idx();
    let barrier = a.comm.lsa_barrier(cta);
    if barrier.sync().is_err() {
        return; // aborted
    }
    let stride = (arch::grid_dim() * arch::block_dim()) as usize;
    let mut i = (cta * arch::block_dim() + arch::thread_idx()) as usize;
    while i < a.count {
        let mut sum = 0f32;
        for peer in 0..a.comm.lsa_size {
            sum += *(a.comm.lsa_ptr(&a.input, 4 * i, peer) as *const f32);
        }
        *(a.output as *mut f32).add(i) = sum;
        i += stride;
    }
    // No rank reads this rank's input after this.
    let _ = barrier.sync();
}

/// Rank `r`'s input: small integers, whose sums are exact in f32.
fn input(r: usize, count: usize) -> Vec<f32> {
    (0..count).map(|i| ((r * 7 + i) % 13) as f32).collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n = common::nranks_arg(4);
    let count = 10_007;
    let outputs = run_on_every_rank(
        n,
        count,
        &|r| input(r, count),
        &|_| vec![f32::NAN; count],
        &|place| place,
        one_shot_all_reduce,
    )?;
    let want: Vec<f32> = (0..count)
        .map(|i| (0..n).map(|r| input(r, count)[i]).sum())
        .collect();
    for (r, got) in outputs.into_iter().enumerate() {
        if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
            return Err(format!("rank {r}: element {i} is {} not {}", got[i], want[i]).into());
        }
    }
    println!("device API one-shot AllReduce on {n} ranks: {count} floats correct on every rank");
    Ok(())
}
