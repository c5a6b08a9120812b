//! A mixture-of-experts dispatch and combine (DeepEP's pattern), with the device API's puts
//! and signals: each rank holds `tokens` tokens of `hidden` floats and one expert; every token
//! goes to the expert [`route`] names. One kernel does it all, CTA `d` serving rank `d`:
//! 1. dispatch: pack this rank's tokens for rank `d` (in token order) behind a count, put them
//!    into block `rank` of `d`'s dispatch window, signal [`DISPATCHED`];
//! 2. once every rank's block arrived: run this rank's expert on the tokens rank `d` sent
//!    (`y = x * (expert + 1) + 0.5`), put the results into block `rank` of `d`'s combine
//!    window, signal [`COMBINED`];
//! 3. once every expert answered: put each token's answer back in its place in `out`.
//!
//! Inside a node the puts are stores into peers' windows; across nodes they travel through
//! GIN (the proxy and the network). Signals only grow: round `round` waits for
//! `round * nranks` of each.

use nccl_device::api::{DevComm, Window};
use nccl_device::{arch, kernel};

/// Signal ids.
pub const DISPATCHED: u32 = 0;
pub const COMBINED: u32 = 1;

/// Bytes before a dispatch block's tokens (its count, padded for 16-byte copies).
pub const HEADER: usize = 16;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Moe {
    pub comm: DevComm,
    /// `nranks` blocks of [`dispatch_block`] bytes: block `s` holds what rank `s` sent here.
    pub dispatch: Window,
    /// `nranks` blocks of `tokens * hidden` floats: block `e` holds expert `e`'s answers.
    pub combine: Window,
    /// This rank's tokens, `tokens * hidden` floats.
    pub x: u64,
    /// Scratch of `nranks * dispatch_block` bytes (the puts' sources).
    pub stage: u64,
    /// This rank's answers, `tokens * hidden` floats.
    pub out: u64,
    pub tokens: u32,
    pub hidden: u32,
    /// 1 for the first launch, then 2, ...: the signal totals to wait for.
    pub round: u32,
    pub seed: u32,
}

/// Bytes of one dispatch block: the count, then up to `tokens` tokens.
pub const fn dispatch_block(tokens: u32, hidden: u32) -> usize {
    HEADER + 4 * (tokens * hidden) as usize
}

/// The expert (rank) token `t` of rank `r` goes to.
pub fn route(seed: u32, r: u32, t: u32, nranks: u32) -> u32 {
    let h = (seed ^ r.wrapping_mul(0x9e37_79b9) ^ t.wrapping_mul(0x85eb_ca6b))
        .wrapping_mul(0xc2b2_ae35);
    (h >> 16) % nranks
}

/// What expert `e` makes of a value.
pub fn expert(e: u32, x: f32) -> f32 {
    x * (e + 1) as f32 + 0.5
}

kernel!(
    /// Dispatch, experts and combine in one launch; `grid` = `nranks`.
    pub MOE = dispatch_and_combine(Moe);
);

/// # Safety
/// The argument's memory lives until the stream passed the kernel; every rank launches it
/// with a grid of `nranks` CTAs (at most `nccl_device::api::MAX_BARRIERS`) and the same round.
unsafe fn dispatch_and_combine(a: &Moe) {
    let c = &a.comm;
    let d = arch::block_idx();
    let (t_idx, nthreads) = (arch::thread_idx() as usize, arch::block_dim() as usize);
    let (tokens, hidden) = (a.tokens, a.hidden as usize);
    let block = dispatch_block(a.tokens, a.hidden);
    let x = a.x as *const f32;
    let n = c.nranks as u64;

    // 1. Dispatch to rank d.
    let stage = (a.stage as *mut u8).add(d as usize * block);
    let packed = stage.add(HEADER) as *mut f32;
    let mut k = 0usize;
    for t in 0..tokens {
        if route(a.seed, c.rank, t, c.nranks) == d {
            for h in (t_idx..hidden).step_by(nthreads) {
                *packed.add(k * hidden + h) = *x.add(t as usize * hidden + h);
            }
            k += 1;
        }
    }
    if t_idx == 0 {
        *(stage as *mut u32) = k as u32;
    }
    let at = c.rank as usize * block;
    let bytes = HEADER + 4 * k * hidden;
    if c.put(a.dispatch.at(d, at), stage, bytes, Some(DISPATCHED), None)
        .is_err()
    {
        return;
    }

    // 2. This rank's expert on what rank d sent, answered into d's combine window.
    if c.wait_signal(DISPATCHED, a.round as u64 * n).is_err() {
        return;
    }
    let got = c.local_ptr(&a.dispatch, d as usize * block);
    let count = *(got as *const u32) as usize;
    let inputs = got.add(HEADER) as *const f32;
    // The stage's block d was read by its put (it returned after the source was read, or
    // the flush below says when): the answers go after every dispatch block.
    let answers =
        (a.stage as *mut u8).add(c.nranks as usize * block + d as usize * block) as *mut f32;
    for i in (t_idx..count * hidden).step_by(nthreads) {
        *answers.add(i) = expert(c.rank, *inputs.add(i));
    }
    let at = 4 * c.rank as usize * tokens as usize * hidden;
    let bytes = 4 * count * hidden;
    let answered = c.put(
        a.combine.at(d, at),
        answers as *const u8,
        bytes,
        Some(COMBINED),
        None,
    );
    if answered.is_err() {
        return;
    }

    // 3. Every answer back in its token's place (CTA d: tokens d, d + grid, ...).
    if c.wait_signal(COMBINED, a.round as u64 * n).is_err() {
        return;
    }
    let out = a.out as *mut f32;
    let mut t = d;
    while t < tokens {
        let e = route(a.seed, c.rank, t, c.nranks);
        let index = (0..t)
            .filter(|&u| route(a.seed, c.rank, u, c.nranks) == e)
            .count();
        let from = c.local_ptr(
            &a.combine,
            4 * (e as usize * tokens as usize + index) * hidden,
        );
        for h in (t_idx..hidden).step_by(nthreads) {
            *out.add(t as usize * hidden + h) = *(from as *const f32).add(h);
        }
        t += arch::grid_dim();
    }
    // The stage may be written again by the next launch once every source was read.
    let _ = c.flush();
}
