//! A plain copy kernel: the per-CTA ceiling the library's data movers are measured against
//! (`copy_rate`). Each thread moves 16-byte packs, `U` of them loaded before any is stored,
//! in a grid-stride loop; nothing else (no flags, no fences, no reduction).

use nccl_device::arch::{self, Pack16};
use nccl_device::kernel;

/// What to copy: `packs` 16-byte packs from `src` to `dst` (device addresses, 16-byte
/// aligned, not overlapping).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CopyArgs {
    pub src: u64,
    pub dst: u64,
    pub packs: u64,
}

kernel!(
    /// One pack in flight per thread.
    pub COPY_X1 = copy_x1(CopyArgs);
);
kernel!(
    /// Four packs in flight per thread (as the library's data mover keeps).
    pub COPY_X4 = copy_x4(CopyArgs);
);
kernel!(
    /// Eight packs in flight per thread.
    pub COPY_X8 = copy_x8(CopyArgs);
);

/// # Safety
/// As [`copy_packs`].
unsafe fn copy_x1(a: &CopyArgs) {
    copy_packs::<1>(a)
}

/// # Safety
/// As [`copy_packs`].
unsafe fn copy_x4(a: &CopyArgs) {
    copy_packs::<4>(a)
}

/// # Safety
/// As [`copy_packs`].
unsafe fn copy_x8(a: &CopyArgs) {
    copy_packs::<8>(a)
}

/// Copies with `U` packs in flight per thread: a loop turn of the CTA covers `U` blocks of
/// `blockDim` consecutive packs (coalesced), and the grid's turns follow one another.
///
/// # Safety
/// `src` and `dst` hold `packs` packs each, are 16-byte aligned and do not overlap.
unsafe fn copy_packs<const U: usize>(a: &CopyArgs) {
    let (src, dst) = (a.src as *const Pack16, a.dst as *mut Pack16);
    let (threads, packs) = (arch::block_dim() as usize, a.packs as usize);
    let turn = U * threads;
    let stride = turn * arch::grid_dim() as usize;
    let mut first = arch::block_idx() as usize * turn + arch::thread_idx() as usize;
    while first < packs {
        let mut held = [Pack16::default(); U];
        for (u, v) in held.iter_mut().enumerate() {
            let i = first + u * threads;
            if i < packs {
                *v = arch::ld_pack(src.add(i));
            }
        }
        for (u, v) in held.iter().enumerate() {
            let i = first + u * threads;
            if i < packs {
                arch::st_pack(dst.add(i), *v);
            }
        }
        first += stride;
    }
}
