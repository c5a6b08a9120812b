//! The kernels of the device-API examples, written with `nccl_device::api`: a crate of its
//! own, `no_std`, because it is compiled twice: to PTX (by `nccl-kernel-build`, from the
//! examples' build script) for GPUs, and for the host, where the simulator runs the same
//! functions on threads. Each argument type is `#[repr(C)]` and `Copy`: a GPU receives it as
//! the kernel's one by-value parameter.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]

use nccl_device::api::{DevComm, Window};
use nccl_device::{arch, kernel};

pub mod moe;
pub mod ping;

/// Where a rank's kernel finds its data.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Place {
    pub comm: DevComm,
    /// Every rank's input: `count` floats at the window's start.
    pub input: Window,
    /// This rank's output: `count` floats (device address).
    pub output: u64,
    pub count: u64,
}

/// The fused kernel's argument: `out = residual + scale * sum`, the residual in `output`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ScaleAdd {
    pub place: Place,
    pub scale: f32,
}

kernel!(
    /// A one-shot AllReduce: every rank sums element `i` over every rank's input.
    pub ONE_SHOT_ALL_REDUCE = one_shot_all_reduce(Place);
);
kernel!(
    /// AllReduce, scale and residual add in one pass.
    pub ALL_REDUCE_SCALE_ADD = all_reduce_scale_add(ScaleAdd);
);

/// The elements of `0..count` this thread handles (a grid-stride loop).
fn my_elements(count: u64) -> impl Iterator<Item = usize> {
    let stride = (arch::grid_dim() * arch::block_dim()) as usize;
    let first = (arch::block_idx() * arch::block_dim() + arch::thread_idx()) as usize;
    (first..count as usize).step_by(stride)
}

/// Element `i` summed over the LSA team's inputs, in team order (the same bits on every rank).
///
/// # Safety
/// `p` names a live window of `count > i` floats on every rank.
unsafe fn sum_over_team(p: &Place, i: usize) -> f32 {
    let mut sum = 0f32;
    for peer in 0..p.comm.lsa_size {
        sum += *(p.comm.lsa_ptr(&p.input, 4 * i, peer) as *const f32);
    }
    sum
}

/// The team barrier (every input in place), the sums into this rank's output, the barrier
/// again (no rank reads this rank's input after it).
///
/// # Safety
/// `p` names live memory of a communicator every rank launched this kernel on, with the same
/// grid (at most `nccl_device::api::MAX_BARRIERS` CTAs).
unsafe fn one_shot_all_reduce(p: &Place) {
    let barrier = p.comm.lsa_barrier(arch::block_idx());
    if barrier.sync().is_err() {
        return; // aborted
    }
    for i in my_elements(p.count) {
        *(p.output as *mut f32).add(i) = sum_over_team(p, i);
    }
    let _ = barrier.sync();
}

/// As [`one_shot_all_reduce`], writing `residual + scale * sum` over the residual.
///
/// # Safety
/// As [`one_shot_all_reduce`].
unsafe fn all_reduce_scale_add(a: &ScaleAdd) {
    let p = &a.place;
    let barrier = p.comm.lsa_barrier(arch::block_idx());
    if barrier.sync().is_err() {
        return;
    }
    for i in my_elements(p.count) {
        let out = (p.output as *mut f32).add(i);
        *out += a.scale * sum_over_team(p, i);
    }
    let _ = barrier.sync();
}
