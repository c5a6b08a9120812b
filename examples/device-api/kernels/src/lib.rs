//! The kernels of the device-API examples, written with `nccl_device::api`: a crate of its
//! own, `no_std`, because it is compiled twice: to PTX (by `nccl-kernel-build`, from the
//! examples' build script) for GPUs, and for the host, where the simulator runs the same
//! functions on threads. Each argument type is `#[repr(C)]` and `Copy`: a GPU receives it as
//! the kernel's one by-value parameter.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]

use nccl_device::api::{DevComm, Window};
use nccl_device::arch::{self, Pack16};
use nccl_device::kernel;

pub mod copy;
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

/// The two-shot kernel's argument: every rank's input and output in symmetric windows.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TwoShot {
    pub comm: DevComm,
    /// Every rank's input: `count` floats at the window's start.
    pub input: Window,
    /// Every rank's output: `count` floats at the window's start.
    pub output: Window,
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
    /// A one-shot AllReduce: every rank sums element `i` over every rank's input, read from
    /// the peers' windows between two barriers.
    pub ONE_SHOT_ALL_REDUCE = one_shot_all_reduce(Place);
);
kernel!(
    /// A one-shot AllReduce for small inputs: every rank sends its input to every rank as LL
    /// lines, and sums what it receives; no barrier.
    pub LL_ALL_REDUCE = ll_all_reduce(Place);
);

kernel!(
    /// A two-shot AllReduce for larger inputs: LSA rank k sums slice k of every rank's input
    /// and stores the sums into every rank's output; each rank reads (n-1)/n of the data
    /// where the one-shot reads n-1 times it.
    pub TWO_SHOT_ALL_REDUCE = two_shot_all_reduce(TwoShot);
);

kernel!(
    /// The two-shot AllReduce with each sum stored once: LSA rank k sums slice k of every
    /// rank's input into its own output, and every rank then loads the other slices from
    /// the peers' outputs (three barriers: inputs in place, slices published, loads done).
    pub TWO_SHOT_PUBLISH_ALL_REDUCE = two_shot_publish_all_reduce(TwoShot);
);

kernel!(
    /// AllReduce, scale and residual add in one pass.
    pub ALL_REDUCE_SCALE_ADD = all_reduce_scale_add(ScaleAdd);
);

/// The most LSA ranks [`ONE_SHOT_ALL_REDUCE`] serves (it keeps a pointer per peer).
pub const MAX_TEAM: u32 = 8;

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
/// again (no rank reads this rank's input after it). Four floats at a time, with one 16-byte
/// load from each peer; the elements past the last whole four one at a time.
///
/// # Safety
/// `p` names live memory of a communicator every rank launched this kernel on, with the same
/// grid (at most `nccl_device::api::MAX_BARRIERS` CTAs), on at most [`MAX_TEAM`] LSA ranks.
unsafe fn one_shot_all_reduce(p: &Place) {
    let c = &p.comm;
    if c.lsa_size > MAX_TEAM {
        arch::trap();
    }
    let barrier = c.lsa_barrier(arch::block_idx());
    if barrier.sync().is_err() {
        return; // aborted
    }
    // Every peer's input, looked up once.
    let inputs = team_parts(c, &p.input);
    let team = &inputs[..c.lsa_size as usize];
    let packs = p.count as usize / 4;
    for j in my_elements(packs as u64) {
        arch::st_pack((p.output as *mut Pack16).add(j), sum_pack(team, j));
    }
    for i in my_elements(p.count - 4 * packs as u64).map(|i| i + 4 * packs) {
        *(p.output as *mut f32).add(i) = sum_at(team, i);
    }
    let _ = barrier.sync();
}

/// Every LSA rank's part of `win` (its start), as this GPU maps it; the first `lsa_size`.
///
/// # Safety
/// `c` and `win` came from the host; `lsa_size <= MAX_TEAM`.
unsafe fn team_parts(c: &DevComm, win: &Window) -> [*mut f32; MAX_TEAM as usize] {
    let mut parts = [core::ptr::null_mut::<f32>(); MAX_TEAM as usize];
    for (peer, part) in (0..c.lsa_size).zip(parts.iter_mut()) {
        *part = c.lsa_ptr(win, 0, peer) as *mut f32;
    }
    parts
}

/// Pack `j` (four floats) summed over `team`'s parts in team order.
///
/// # Safety
/// Every part holds pack `j`; `team` is not empty.
unsafe fn sum_pack(team: &[*mut f32], j: usize) -> Pack16 {
    let load = |part: &*mut f32| arch::ld_pack((*part as *const Pack16).add(j)).0;
    let mut sum = load(&team[0]).map(f32::from_bits);
    for part in &team[1..] {
        for (s, x) in sum.iter_mut().zip(load(part)) {
            *s += f32::from_bits(x);
        }
    }
    Pack16(sum.map(f32::to_bits))
}

/// Element `i` summed over `team`'s parts in team order.
///
/// # Safety
/// As [`sum_pack`], for element `i`.
unsafe fn sum_at(team: &[*mut f32], i: usize) -> f32 {
    team[1..]
        .iter()
        .fold(*team[0].add(i), |s, part| s + *part.add(i))
}

/// The team barrier (every input in place); this rank's slice of the 16-byte packs (slice
/// `lsa_rank` of `lsa_size`, spread over the grid) summed over every rank's input in team
/// order and stored into every rank's output; the elements past the last whole pack by the
/// last LSA rank; the barrier again (every output written, no input read any more).
///
/// # Safety
/// As [`one_shot_all_reduce`], with `output` a window of `count` floats on every rank.
unsafe fn two_shot_all_reduce(a: &TwoShot) {
    let c = &a.comm;
    if c.lsa_size > MAX_TEAM {
        arch::trap();
    }
    let barrier = c.lsa_barrier(arch::block_idx());
    if barrier.sync().is_err() {
        return;
    }
    let n = c.lsa_size as usize;
    let (inputs, outputs) = (team_parts(c, &a.input), team_parts(c, &a.output));
    let (team_in, team_out) = (&inputs[..n], &outputs[..n]);
    let packs = a.count as usize / 4;
    let per = packs.div_ceil(n);
    let first = (c.lsa_rank as usize * per).min(packs);
    let mine = (first + per).min(packs) - first;
    for j in my_elements(mine as u64).map(|j| j + first) {
        let pack = sum_pack(team_in, j);
        for out in team_out {
            arch::st_pack((*out as *mut Pack16).add(j), pack);
        }
    }
    if c.lsa_rank + 1 == c.lsa_size {
        for i in my_elements(a.count - 4 * packs as u64).map(|i| i + 4 * packs) {
            let sum = sum_at(team_in, i);
            for out in team_out {
                *out.add(i) = sum;
            }
        }
    }
    let _ = barrier.sync();
}

/// Every rank's CTA `b` owns the same lines (pairs of floats) of the input: it sends each to
/// every rank through LL block `b`, then sums the lines every rank sent it, in rank order.
///
/// # Safety
/// As [`one_shot_all_reduce`]; the device communicator has `grid` LL blocks, and `grid` CTAs
/// of `ll_slots` lines hold the input: `count <= 2 * grid * ll_slots`.
unsafe fn ll_all_reduce(p: &Place) {
    let c = &p.comm;
    let count = p.count as usize;
    let lines = count.div_ceil(2);
    let per = lines.div_ceil(arch::grid_dim() as usize);
    if per > c.ll_slots as usize {
        arch::trap();
    }
    let first = arch::block_idx() as usize * per;
    let mine = lines.min(first + per).saturating_sub(first);
    if mine == 0 {
        // No epoch at all (every rank's CTA alike): an epoch with no exchange would break
        // the LL rule for the block's next one.
        return;
    }
    let mut ll = c.ll_a2a(arch::block_idx());
    let (input, output) = (c.local_ptr(&p.input, 0) as *const f32, p.output as *mut f32);
    let step = arch::block_dim() as usize;
    for i in (arch::thread_idx() as usize..mine).step_by(step) {
        let at = 2 * (first + i);
        let high = if at + 1 < count {
            *input.add(at + 1)
        } else {
            0.0
        };
        ll.bcast(
            i,
            (*input.add(at)).to_bits() as u64 | (high.to_bits() as u64) << 32,
        );
    }
    'lines: for i in (arch::thread_idx() as usize..mine).step_by(step) {
        let mut sum = [0f32; 2];
        for peer in 0..c.lsa_size {
            let Ok(v) = ll.recv(peer, i) else {
                break 'lines; // aborted
            };
            let pair = [v as u32, (v >> 32) as u32].map(f32::from_bits);
            for (s, x) in sum.iter_mut().zip(pair) {
                // Rank 0's value as it is (0.0 + -0.0 would lose the sign).
                *s = if peer == 0 { x } else { *s + x };
            }
        }
        let [low, high] = sum;
        let at = 2 * (first + i);
        *output.add(at) = low;
        if at + 1 < count {
            *output.add(at + 1) = high;
        }
    }
    ll.end();
}

/// Slice `k` of `n` of `packs` 16-byte packs: (first, how many).
fn slice(packs: usize, n: usize, k: usize) -> (usize, usize) {
    let per = packs.div_ceil(n);
    let first = (k * per).min(packs);
    (first, (first + per).min(packs) - first)
}

/// The team barrier (every input in place); this rank's slice of the packs (the elements past
/// the last whole pack: the last LSA rank's) summed over every rank's input in team order into
/// its own output; the barrier (every slice published); the other slices loaded from their
/// owners' outputs; the barrier again (no output read any more).
///
/// # Safety
/// As [`two_shot_all_reduce`].
unsafe fn two_shot_publish_all_reduce(a: &TwoShot) {
    let c = &a.comm;
    if c.lsa_size > MAX_TEAM {
        arch::trap();
    }
    let barrier = c.lsa_barrier(arch::block_idx());
    if barrier.sync().is_err() {
        return;
    }
    let (n, me) = (c.lsa_size as usize, c.lsa_rank as usize);
    let (inputs, outputs) = (team_parts(c, &a.input), team_parts(c, &a.output));
    let (team_in, mine) = (&inputs[..n], outputs[me]);
    let packs = a.count as usize / 4;
    let tail = 4 * packs..a.count as usize;
    let (first, len) = slice(packs, n, me);
    for j in my_elements(len as u64).map(|j| j + first) {
        arch::st_pack((mine as *mut Pack16).add(j), sum_pack(team_in, j));
    }
    if me + 1 == n {
        for i in my_elements(tail.len() as u64).map(|i| i + tail.start) {
            *mine.add(i) = sum_at(team_in, i);
        }
    }
    if barrier.sync().is_err() {
        return;
    }
    for q in (0..n).filter(|&q| q != me) {
        let (first, len) = slice(packs, n, q);
        let theirs = outputs[q] as *const Pack16;
        for j in my_elements(len as u64).map(|j| j + first) {
            arch::st_pack((mine as *mut Pack16).add(j), arch::ld_pack(theirs.add(j)));
        }
    }
    if me + 1 != n {
        for i in my_elements(tail.len() as u64).map(|i| i + tail.start) {
            *mine.add(i) = *outputs[n - 1].add(i);
        }
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

kernel!(
    /// Sends an LL line to a slot past the device communicator's `ll_slots`: a kernel that
    /// misuses the device API, to show how that is reported.
    pub MISUSE = send_past_the_slots(DevComm);
);

/// Thread 0 sends to slot `ll_slots` of block 0 (one past the last).
///
/// # Safety
/// `c` came from the host, with at least one LL block.
unsafe fn send_past_the_slots(c: &DevComm) {
    let ll = c.ll_a2a(0);
    if arch::thread_idx() == 0 {
        ll.send(0, ll.slots(), 1);
    }
}
