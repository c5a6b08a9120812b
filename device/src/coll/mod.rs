//! Collectives, one file each, generic over element type and reduction. One kernel entry point
//! per (collective, type, reduction): a first call JIT-compiles only the code it runs (one
//! entry holding every collective took the driver 15-20 s to compile on first load). Copies
//! (Broadcast, AllGather) move bytes: one entry each, uint8 with no reduction.

pub mod all_gather;
pub mod all_reduce;
pub mod broadcast;
pub mod fold;
pub mod nvls;
pub mod pat;
pub mod reduce;
pub mod reduce_scatter;
pub mod send_recv;
pub mod steps;
pub mod symmetric;

use crate::abi::{
    ChannelDev, ChannelStamp, Coll, CollArgs, DevComm, LabStamp, ALGO_FOLD, ALGO_NVLS, ALGO_PAT,
    ALGO_SYMMETRIC, ALGO_TREE, DIRECT_DECLINE, DIRECT_OFF, FLAG_LAB_STAMPS, FLAG_RING_DIRECT,
    FLAG_RING_REGISTERED, LAB_STAMPS, LL128_STEP_BYTES, LL_STEP_BYTES, MAX_CHANNELS,
    PROFILE_LAUNCHES, PROTO_LL, PROTO_LL128, PROTO_SIMPLE,
};
use crate::arch;
use crate::ops::{pack_elems, RedOp};
use crate::prims::copy::Move;
use crate::prims::{Offer, Prims, RingDirect};
use crate::types::Elem;

/// Runs collective `C` (a [`Coll`] as `u32`, which `args.coll` names too) as CTA `block_idx`
/// (one channel).
///
/// # Safety
/// `args` describes buffers and a communicator wired by the host; every rank of the
/// communicator launches the same collective with the same count and grid.
pub unsafe fn run<T: Elem, O: RedOp<T>, const C: u32>(args: &CollArgs) {
    let lab = lab_enter(args);
    let stamp = profile_enter(args);
    run_body::<T, O, C>(args);
    profile_exit(args, stamp);
    lab_exit(args, lab);
}

/// The kernel-stamps lab ([`FLAG_LAB_STAMPS`]): CTA 0's thread 0 takes the next launch number
/// and stamps the entry; returns the slot to stamp the exit in (null: not this thread, or off)
/// and the launch number, kept in a register (reading it back from host memory at the exit
/// would cost a round trip inside the time measured).
#[cfg_attr(target_arch = "nvptx64", inline(always))]
unsafe fn lab_enter(args: &CollArgs) -> (*mut LabStamp, u32) {
    let off = (core::ptr::null_mut(), 0);
    if args.flags & FLAG_LAB_STAMPS == 0 || arch::block_idx() != 0 || arch::thread_idx() != 0 {
        return off;
    }
    let now = arch::globaltimer();
    let dc = args.comm as *mut DevComm;
    if (*dc).lab_stamps == 0 {
        return off;
    }
    let n = (*dc).lab_count;
    (*dc).lab_count = n.wrapping_add(1);
    let slot = ((*dc).lab_stamps as *mut LabStamp).add((n % LAB_STAMPS) as usize);
    (*slot).index = 0;
    (*slot).entry = now;
    (slot, n)
}

/// Stamps the exit once every thread of CTA 0 is done, then the slot's index.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
unsafe fn lab_exit(args: &CollArgs, (slot, n): (*mut LabStamp, u32)) {
    // Every thread of CTA 0 meets at the barrier alike: the flag is the same for all of them.
    if args.flags & FLAG_LAB_STAMPS == 0 || arch::block_idx() != 0 {
        return;
    }
    arch::sync_threads();
    if !slot.is_null() {
        (*slot).exit = arch::globaltimer();
        arch::st_volatile(&mut (*slot).index, n as u64 + 1);
    }
}

/// A launch the profiler times per channel ([`CollArgs::profile_slot`]): thread 0 stamps its
/// CTA's start; the CTA's stamp (null: not this thread, or not timed).
#[cfg_attr(target_arch = "nvptx64", inline(always))]
unsafe fn profile_enter(args: &CollArgs) -> *mut ChannelStamp {
    if args.profile_slot == 0 || arch::thread_idx() != 0 {
        return core::ptr::null_mut();
    }
    let dc = args.comm as *const DevComm;
    if (*dc).profile_stamps == 0 {
        return core::ptr::null_mut();
    }
    let launch = (args.profile_slot % PROFILE_LAUNCHES) as usize;
    let at = launch * MAX_CHANNELS + arch::block_idx() as usize;
    let stamp = ((*dc).profile_stamps as *mut ChannelStamp).add(at);
    arch::st_volatile(&mut (*stamp).start, arch::globaltimer());
    stamp
}

/// Stamps the CTA's stop once all its threads are done, then the launch's number.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
unsafe fn profile_exit(args: &CollArgs, stamp: *mut ChannelStamp) {
    // The same for every thread of the launch: each CTA meets at the barrier alike.
    if args.profile_slot == 0 {
        return;
    }
    arch::sync_threads();
    if !stamp.is_null() {
        arch::st_volatile(&mut (*stamp).stop, arch::globaltimer());
        arch::fence_sys();
        arch::st_volatile(&mut (*stamp).seq, args.profile_slot as u64);
    }
}

/// [`run`] without the lab's stamps.
unsafe fn run_body<T: Elem, O: RedOp<T>, const C: u32>(args: &CollArgs) {
    // One body per protocol, as NCCL's kernels: a body holding all three protocols' steps at
    // every step of every collective spilled registers that each protocol alone does not
    // need (ptxas at 128 registers). The tree moves its data with LL where asked (the host
    // asks only where every CTA's tree has one peer each way), else with Simple.
    match args.proto {
        _ if args.algo == ALGO_NVLS => nvls::run::<T, O, C>(args),
        _ if args.algo == ALGO_SYMMETRIC => symmetric::run::<T, O, C>(args),
        _ if args.algo == ALGO_PAT => pat::run::<T, O, C>(args),
        // Only the ReduceScatter kernel folds (one entry per type and reduction is enough).
        _ if C == Coll::ReduceScatter as u32 && args.algo == ALGO_FOLD => fold::run::<T, O>(args),
        PROTO_LL if args.algo == ALGO_TREE => run_with::<T, O, C, PROTO_LL>(args),
        _ if args.algo == ALGO_TREE => run_with::<T, O, C, PROTO_SIMPLE>(args),
        PROTO_LL => run_with::<T, O, C, PROTO_LL>(args),
        PROTO_LL128 => run_with::<T, O, C, PROTO_LL128>(args),
        _ => run_with::<T, O, C, PROTO_SIMPLE>(args),
    }
}

/// [`run`] with protocol `P` (`PROTO_*`).
#[inline(never)]
unsafe fn run_with<T: Elem, O: RedOp<T>, const C: u32, const P: u32>(args: &CollArgs) {
    let mut k = Kernel::<T, O, P>::new(args);
    match Coll::from_raw(C) {
        Some(Coll::AllReduce) if args.algo == ALGO_TREE && P != PROTO_LL128 => {
            all_reduce::tree(&mut k)
        }
        Some(Coll::AllReduce) => all_reduce::ring(&mut k),
        Some(Coll::Broadcast) => broadcast::ring(&mut k),
        Some(Coll::Reduce) => reduce::ring(&mut k),
        Some(Coll::AllGather) => all_gather::ring(&mut k),
        Some(Coll::ReduceScatter) => reduce_scatter::ring(&mut k),
        None => arch::trap(),
    }
}

/// What every collective's CTA starts from: its arguments, its channel's slice of the data and
/// its ring; its steps use protocol `P` (`PROTO_*`, fixed at compile time).
pub struct Kernel<T, O, const P: u32> {
    pub args: CollArgs,
    pub op: O,
    pub nranks: usize,
    pub input: *const T,
    pub output: *mut T,
    /// This channel's slice of the per-rank count.
    pub start: usize,
    pub end: usize,
    pub tid: usize,
    pub nthreads: usize,
    pub ch: *mut ChannelDev,
    pub slot_bytes: u32,
    /// The communicator's abort flag ([`DevComm::abort_flag`]).
    pub abort_flag: u64,
}

impl<T: Elem, O: RedOp<T>, const P: u32> Kernel<T, O, P> {
    unsafe fn new(args: &CollArgs) -> Self {
        let comm = &*(args.comm as *const DevComm);
        let ch_id = arch::block_idx() as usize;
        let (start, end) =
            channel_range::<T>(args.count as usize, ch_id, arch::grid_dim() as usize);
        Kernel {
            args: *args,
            op: O::new(scalar_bits::<T>(args)),
            nranks: comm.nranks as usize,
            input: args.sendbuff as *const T,
            output: args.recvbuff as *mut T,
            start,
            end,
            tid: arch::thread_idx() as usize,
            nthreads: arch::block_dim() as usize,
            ch: (comm.channels as *mut ChannelDev).add(ch_id),
            slot_bytes: comm.slot_bytes,
            abort_flag: comm.abort_flag,
        }
    }

    /// Our position in the ring.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn ring_ix(&self) -> usize {
        (*self.ch).ring_index as usize
    }

    /// The rank `k` positions upstream of us (`k` = 0 is us).
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn rank_upstream(&self, k: usize) -> usize {
        let pos = (self.ring_ix() + self.nranks - k % self.nranks) % self.nranks;
        *((*self.ch).ring_ranks as *const u32).add(pos) as usize
    }

    /// How many hops downstream of `rank` we are.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn distance_from(&self, rank: usize) -> usize {
        let ranks = (*self.ch).ring_ranks as *const u32;
        let mut pos = 0;
        while pos < self.nranks && *ranks.add(pos) as usize != rank {
            pos += 1;
        }
        (self.ring_ix() + self.nranks - pos) % self.nranks
    }

    /// The primitives on this channel's ring connections, with the launch's protocol.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn prims(&self) -> Prims {
        Prims::new(self.ch, self.slot_bytes)
            .with_proto(P)
            .with_slice(self.args.slice_steps)
            .with_abort(self.abort_flag)
            .with_flags(self.args.flags)
    }

    /// Elements per step: the host's chunk, never more than a FIFO slot's payload with the
    /// launch's protocol.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub fn max_chunk(&self) -> usize {
        let bytes = match P {
            PROTO_LL => LL_STEP_BYTES,
            PROTO_LL128 => LL128_STEP_BYTES,
            _ => self.slot_bytes * crate::prims::slice_steps(self.args.slice_steps),
        };
        let slot = bytes as usize / core::mem::size_of::<T>();
        core::cmp::min(self.args.chunk_elems as usize, slot)
    }

    /// The zero-copy handshake on this channel's ring connections
    /// ([`Prims::ring_handshake`]), when the launch asks for it ([`FLAG_RING_DIRECT`], Simple
    /// steps) and this channel's slice of a block fills a step at least: every rank decides
    /// that alike from the call, so both ends of each connection meet. `bytes`: the size of
    /// the output buffer (`recvbuff`) a successor's offer must cover. `recv_used`/`send_used`:
    /// whether the collective takes steps on the receive/send connection (both ends of a
    /// connection know it): one that takes none keeps its counters, and a handshake there would
    /// leave words the next operation's handshake, with the same tag, would take for its own.
    /// `partials`: our output may also take the predecessor's partial sums (AllReduce out of
    /// place, see [`RingDirect::recv_partials`]).
    ///
    /// With [`CollArgs::reg_ctas`] below the grid, the ring agreement comes first
    /// (`Kernel::fewer_ctas`): it may leave this CTA nothing to do, or a larger slice.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn ring_direct(
        &mut self,
        prims: &mut Prims,
        bytes: usize,
        recv_used: bool,
        send_used: bool,
        partials: bool,
    ) -> RingDirect {
        self.fewer_ctas(prims, partials);
        if P != PROTO_SIMPLE
            || self.args.flags & FLAG_RING_DIRECT == 0
            || self.end - self.start < self.max_chunk()
        {
            return RingDirect::FIFO;
        }
        let recv_on = recv_used && (*self.ch).recv_direct != 0;
        let reach = if send_used {
            (*self.ch).send_reach
        } else {
            DIRECT_OFF
        };
        if !recv_on && reach == DIRECT_OFF {
            return RingDirect::FIFO;
        }
        let registered = self.args.flags & FLAG_RING_REGISTERED != 0;
        prims.ring_handshake(
            recv_on,
            reach,
            registered,
            Offer {
                addr: self.args.recvbuff,
                key: self.args.offer_key,
            },
            bytes as u64,
            partials && recv_on,
        )
    }

    /// Registered calls on fewer CTAs ([`CollArgs::reg_ctas`]): when the launch asks, agrees
    /// around this channel's ring ([`Prims::ring_agree`]) whether every rank registered its
    /// output and reaches its successor on each of the first `reg_ctas` channels (AllReduce
    /// also: its output may take partial sums, `partials`, else its reduce-scatter half would
    /// copy on fewer CTAs). If all did, CTAs from `reg_ctas` on get an empty slice (they take
    /// no step, at neither end of their connections) and the others the slices of `reg_ctas`
    /// channels. Every CTA of every rank runs the agreement and gets the same answer.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn fewer_ctas(&mut self, prims: &mut Prims, partials: bool) {
        let (fewer, grid) = (self.args.reg_ctas as usize, arch::grid_dim() as usize);
        if P != PROTO_SIMPLE || self.args.flags & FLAG_RING_DIRECT == 0 || fewer == 0 {
            return;
        }
        if fewer >= grid || self.nranks < 2 {
            return;
        }
        let cta = arch::block_idx() as usize;
        let first = self.ch.sub(cta);
        let reach = |c: usize| {
            let ch = &*first.add(c);
            ch.recv_direct != 0 && ch.send_reach != DIRECT_OFF && ch.send_reach != DIRECT_DECLINE
        };
        let mine = self.args.flags & FLAG_RING_REGISTERED != 0
            && (partials || Coll::from_raw(self.args.coll) != Some(Coll::AllReduce))
            && (0..fewer).all(reach);
        if !prims.ring_agree(self.ch, mine, self.nranks) {
            return;
        }
        let count = self.args.count as usize;
        (self.start, self.end) = match cta < fewer {
            true => channel_range::<T>(count, cta, fewer),
            false => (count, count),
        };
    }

    /// Counts `steps` ring steps received straight into our output ([`ChannelDev::direct_steps`]).
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn count_direct(&self, steps: u64) {
        if self.tid == 0 && steps > 0 {
            (*self.ch).direct_steps += steps;
        }
    }

    /// A single rank: the result is the input, reduced with itself alone.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn local_copy(&self, input: *const T, output: *mut T, n: usize) {
        let mv = Move {
            input,
            output,
            post: true,
            ..Move::none()
        };
        mv.run(self.op, n, self.tid, self.nthreads);
    }
}

/// The reduction's scalar as raw bits: from device memory when the host gave its address.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
unsafe fn scalar_bits<T>(args: &CollArgs) -> u64 {
    if args.redop_arg_ptr == 0 {
        return args.redop_arg;
    }
    let p = args.redop_arg_ptr;
    match core::mem::size_of::<T>() {
        1 => core::ptr::read_volatile(p as *const u8) as u64,
        2 => core::ptr::read_volatile(p as *const u16) as u64,
        4 => core::ptr::read_volatile(p as *const u32) as u64,
        _ => core::ptr::read_volatile(p as *const u64),
    }
}

/// The range of elements channel `ch` of `nch` owns.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
pub fn channel_range<T>(count: usize, ch: usize, nch: usize) -> (usize, usize) {
    let per = align_up(div_ceil(count, nch), pack_elems::<T>());
    let start = core::cmp::min(ch * per, count);
    (start, core::cmp::min(start + per, count))
}

/// How often a waiting thread of the collectives' own barriers (the symmetric path's, NVLS's)
/// looks at the abort flag: once per this many spins (it lies in host memory, a costly read).
const ABORT_POLL: u32 = 64;

/// Spins until `ready()` holds, or until the communicator's abort flag (`abort`; null: none)
/// is raised. `aborted` keeps the abort, so the thread's later waits end at once: the kernel
/// then runs to its end, its results undefined, as NCCL's after an abort.
///
/// # Safety
/// `abort` is null or the communicator's abort flag, readable by the GPU.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
pub(crate) unsafe fn spin_until(
    abort: *const u64,
    aborted: &mut bool,
    mut ready: impl FnMut() -> bool,
) {
    let mut spins = 0u32;
    while !*aborted && !ready() {
        arch::spin_pause();
        spins += 1;
        if spins.is_multiple_of(ABORT_POLL) && !abort.is_null() {
            *aborted = arch::ld_volatile(abort) != 0;
        }
    }
}

/// The signal waits of one launch ([`crate::abi::WaitArgs`]): thread `i` holds until its slot
/// reached its value; the CTA ends when every wait passed (or the communicator was aborted).
/// The acquire loads order the work after the kernel, in its stream, after the writes the
/// signals were released with.
///
/// # Safety
/// `args` names device words readable here and the communicator's abort flag (or null).
pub unsafe fn wait_signals(args: &crate::abi::WaitArgs) {
    let t = arch::thread_idx() as usize;
    if t < (args.count as usize).min(crate::abi::WAIT_MAX) {
        let (slot, value) = (args.slots[t] as *const u64, args.values[t]);
        let mut aborted = false;
        spin_until(args.abort as *const u64, &mut aborted, || {
            arch::ld_acquire_sys(slot) >= value
        });
    }
    arch::sync_threads();
}

#[cfg_attr(target_arch = "nvptx64", inline(always))]
pub(crate) const fn div_ceil(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

#[cfg_attr(target_arch = "nvptx64", inline(always))]
pub(crate) const fn align_up(a: usize, b: usize) -> usize {
    a.div_ceil(b) * b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_cover_the_buffer_once() {
        for count in [0usize, 1, 3, 17, 1000, 4099] {
            for nch in [1usize, 2, 3, 16] {
                let mut next = 0;
                for c in 0..nch {
                    let (s, e) = channel_range::<f32>(count, c, nch);
                    assert!(
                        s <= e && s == next.min(count),
                        "count {count} nch {nch} ch {c}"
                    );
                    if e > s {
                        assert_eq!(s % 4, 0, "channel slices start on a pack");
                    }
                    next = next.max(e);
                }
                assert_eq!(next, count);
            }
        }
    }
}
