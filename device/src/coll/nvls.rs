//! NVLS (NVLink SHARP): AllReduce, ReduceScatter and AllGather where the NVSwitch reduces and
//! multicasts. Every rank holds the same multicast-bound scratch buffer; its channel regions
//! ([`NvlsChannel`]) are reached two ways: this rank's own copy through the unicast address, and
//! every rank's copy at once through the multicast address, where `multimem.ld_reduce` returns
//! the reduction of all copies and `multimem.st` writes all of them.
//!
//! The user's buffers are not bound to the multicast object (that needs registration): data is
//! copied into the scratch and out of it. The copies are also where the reductions that the
//! switch cannot do happen: PreMulSum's and float Avg's scaling on the way in, integer Avg's
//! division once on the reduced value.
//!
//! Per channel a call moves in pieces, each in one half of the region, halves alternating
//! (the piece counter persists across launches, so consecutive calls alternate too):
//! - AllReduce: copy the piece in; barrier; rank r reduces slice r of the piece through the
//!   multicast address and stores the result through it (every rank receives it); barrier;
//!   copy the whole piece out.
//! - ReduceScatter: copy every rank's block of the piece in; barrier; rank r reduces block r
//!   through the multicast address straight into its output.
//! - AllGather: store our block of the piece through the multicast address; barrier; copy every
//!   block out.
//!
//! Why one or two barriers a piece suffice: a rank writes half h for piece k only after it
//! passed a barrier of piece k-1, and every rank arrives there only after it finished reading
//! piece k-2, the last user of half h.
//!
//! The barrier: `multimem.red.release` adds 1 to the channel's counter on every rank; a rank
//! passes once its own copy (unicast, acquire) counts every rank's arrival: `barriers * nranks`.

use super::{align_up, channel_range, div_ceil, scalar_bits, spin_until};
use crate::abi::{Coll, CollArgs, DevComm, NvlsChannel, NVLS_CTRL_BYTES};
use crate::arch::{self, McOp, Pack16};
use crate::ops::{map1, pack_elems, RedOp};
use crate::types::Elem;

struct Nvls<T, O> {
    op: O,
    nranks: usize,
    rank: usize,
    tid: usize,
    nthreads: usize,
    ch: *mut NvlsChannel,
    uc: u64,
    mc: u64,
    half_bytes: usize,
    barriers: u64,
    pieces: u64,
    abort: *const u64,
    aborted: bool,
    _t: core::marker::PhantomData<T>,
}

/// Runs NVLS collective `C` (as [`super::run`]) as CTA `block_idx` (one NVLS channel).
///
/// # Safety
/// As [`super::run`]; the host set up NVLS (`DevComm::nvls`) and launched at most
/// `nvls_nchannels` CTAs, and chose NVLS only for a (type, reduction) in
/// [`arch::multimem_op`] (AllGather: any, it moves bytes).
///
/// Not inlined, as the protocols' bodies (`super::run_with`): the entry point then holds no
/// NVLS registers on its ring and tree paths.
#[inline(never)]
pub unsafe fn run<T: Elem, O: RedOp<T>, const C: u32>(args: &CollArgs) {
    let comm = &*(args.comm as *const DevComm);
    let coll = Coll::from_raw(C);
    let reduces = matches!(coll, Some(Coll::AllReduce | Coll::ReduceScatter));
    let mc_op = match arch::multimem_op(T::DTYPE, O::KIND) {
        Some(op) => op,
        // Folded away per kernel: a (type, op) without a multimem form has no NVLS reduction.
        None if reduces => arch::trap(),
        None => McOp::Add,
    };
    let ch_id = arch::block_idx() as usize;
    if comm.nvls == 0 || ch_id >= comm.nvls_nchannels as usize {
        arch::trap();
    }
    let ch = (comm.nvls as *mut NvlsChannel).add(ch_id);
    let c = *ch;
    let mut k = Nvls::<T, O> {
        op: O::new(scalar_bits::<T>(args)),
        nranks: comm.nranks as usize,
        rank: comm.rank as usize,
        tid: arch::thread_idx() as usize,
        nthreads: arch::block_dim() as usize,
        ch,
        uc: c.uc,
        mc: c.mc,
        half_bytes: c.half_bytes as usize,
        barriers: c.barriers,
        pieces: c.pieces,
        abort: comm.abort_flag as *const u64,
        aborted: false,
        _t: core::marker::PhantomData,
    };
    let (count, grid) = (args.count as usize, arch::grid_dim() as usize);
    let (start, end) = channel_range::<T>(count, ch_id, grid);
    let (input, output) = (args.sendbuff as *const T, args.recvbuff as *mut T);
    match coll {
        Some(Coll::AllReduce) => k.all_reduce(mc_op, input, output, start, end),
        Some(Coll::ReduceScatter) => k.reduce_scatter(mc_op, input, output, count, start, end),
        Some(Coll::AllGather) => k.all_gather(input, output, count, start, end),
        _ => arch::trap(),
    }
    k.finish();
}

impl<T: Elem, O: RedOp<T>> Nvls<T, O> {
    const SZ: usize = core::mem::size_of::<T>();

    /// Elements one half holds.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn cap(&self) -> usize {
        self.half_bytes / Self::SZ
    }

    /// (unicast, multicast) addresses of the current piece's half.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn half(&self) -> (u64, u64) {
        let at = NVLS_CTRL_BYTES + (self.pieces % 2) * self.half_bytes as u64;
        (self.uc + at, self.mc + at)
    }

    /// Every rank of the channel arrives before any goes on (see the module's comment).
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn barrier(&mut self) {
        arch::sync_threads();
        self.barriers += 1;
        if self.tid == 0 {
            // Everything the CTA wrote (ordered before this thread by the barrier) goes out
            // before the arrival.
            arch::fence_sys();
            arch::multimem_red_add_u64(self.mc as *mut u64, 1);
            let (target, counter) = (self.barriers * self.nranks as u64, self.uc as *const u64);
            spin_until(self.abort, &mut self.aborted, || {
                arch::ld_acquire_sys(counter) >= target
            });
        }
        arch::sync_threads();
    }

    /// Saves the counters the next launch on this channel starts from.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn finish(&self) {
        if self.tid == 0 {
            (*self.ch).barriers = self.barriers;
            (*self.ch).pieces = self.pieces;
        }
    }

    /// `n` (1..=pack) elements at `src` as a pack (the rest zero), with the reduction's `pre`
    /// step when `pre`.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn pack_in(&self, src: *const T, n: usize, pre: bool) -> Pack16 {
        let v = if n == pack_elems::<T>() && (src as usize).is_multiple_of(16) {
            arch::ld_pack(src as *const Pack16)
        } else {
            let mut v = Pack16::default();
            let d = &mut v as *mut Pack16 as *mut T;
            for i in 0..n {
                d.add(i).write(src.add(i).read());
            }
            v
        };
        match pre && O::HAS_PRE {
            true => map1::<T>(v, |x| self.op.pre(x)),
            false => v,
        }
    }

    /// The first `n` elements of `v` to `dst`.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn pack_out(&self, dst: *mut T, v: Pack16, n: usize) {
        if n == pack_elems::<T>() && (dst as usize).is_multiple_of(16) {
            arch::st_pack(dst as *mut Pack16, v);
        } else {
            let s = &v as *const Pack16 as *const T;
            for i in 0..n {
                dst.add(i).write(s.add(i).read());
            }
        }
    }

    /// The reduction of every rank's pack at multicast address `mc`, `post` applied.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn reduce_pack(&self, mc_op: McOp, mc: u64) -> Pack16 {
        let v = arch::multimem_ld_reduce::<T>(mc_op, mc as *const Pack16);
        match O::HAS_POST {
            true => map1::<T>(v, |x| self.op.post(x)),
            false => v,
        }
    }

    unsafe fn all_reduce(
        &mut self,
        mc_op: McOp,
        input: *const T,
        output: *mut T,
        start: usize,
        end: usize,
    ) {
        let (pe, n) = (pack_elems::<T>(), self.nranks);
        let max_slice = self.cap() / n / pe * pe;
        if max_slice == 0 {
            arch::trap(); // the host gives every rank at least a pack per half
        }
        let mut off = start;
        while off < end {
            let rem = end - off;
            let slice = core::cmp::min(max_slice, align_up(div_ceil(rem, n), pe));
            let piece = core::cmp::min(rem, slice * n);
            let (uc, mc) = self.half();
            let packs = div_ceil(piece, pe);
            let mut i = self.tid;
            while i < packs {
                let e = i * pe;
                let v = self.pack_in(input.add(off + e), core::cmp::min(pe, piece - e), true);
                arch::st_pack((uc + (e * Self::SZ) as u64) as *mut Pack16, v);
                i += self.nthreads;
            }
            self.barrier();
            // Our slice: reduced by the switch, stored back to every rank.
            let (s0, s1) = (
                core::cmp::min(self.rank * slice, piece),
                core::cmp::min((self.rank + 1) * slice, piece),
            );
            let mut e = s0 + self.tid * pe;
            while e < s1 {
                let at = mc + (e * Self::SZ) as u64;
                let v = self.reduce_pack(mc_op, at);
                arch::multimem_st(at as *mut Pack16, v);
                e += self.nthreads * pe;
            }
            self.barrier();
            let mut i = self.tid;
            while i < packs {
                let e = i * pe;
                let v = arch::ld_pack((uc + (e * Self::SZ) as u64) as *const Pack16);
                self.pack_out(output.add(off + e), v, core::cmp::min(pe, piece - e));
                i += self.nthreads;
            }
            self.pieces += 1;
            off += piece;
        }
    }

    /// `count` is each rank's output block; [start, end) this channel's part of it.
    unsafe fn reduce_scatter(
        &mut self,
        mc_op: McOp,
        input: *const T,
        output: *mut T,
        count: usize,
        start: usize,
        end: usize,
    ) {
        let (pe, n) = (pack_elems::<T>(), self.nranks);
        let max_q = self.cap() / n / pe * pe;
        if max_q == 0 {
            arch::trap(); // the host gives every rank at least a pack per half
        }
        let mut off = start;
        while off < end {
            let q = core::cmp::min(end - off, max_q);
            let qa = align_up(q, pe);
            let per_block = qa / pe;
            let (uc, mc) = self.half();
            let mut i = self.tid;
            while i < n * per_block {
                let (j, e) = (i / per_block, (i % per_block) * pe);
                let v = self.pack_in(
                    input.add(j * count + off + e),
                    core::cmp::min(pe, q - e),
                    true,
                );
                arch::st_pack((uc + ((j * qa + e) * Self::SZ) as u64) as *mut Pack16, v);
                i += self.nthreads;
            }
            self.barrier();
            let mut i = self.tid;
            while i < per_block {
                let e = i * pe;
                let v = self.reduce_pack(mc_op, mc + ((self.rank * qa + e) * Self::SZ) as u64);
                self.pack_out(output.add(off + e), v, core::cmp::min(pe, q - e));
                i += self.nthreads;
            }
            self.pieces += 1;
            off += q;
        }
    }

    /// `count` is each rank's input block; [start, end) this channel's part of it.
    unsafe fn all_gather(
        &mut self,
        input: *const T,
        output: *mut T,
        count: usize,
        start: usize,
        end: usize,
    ) {
        let (pe, n) = (pack_elems::<T>(), self.nranks);
        let max_q = self.cap() / n / pe * pe;
        if max_q == 0 {
            arch::trap(); // the host gives every rank at least a pack per half
        }
        let mut off = start;
        while off < end {
            let q = core::cmp::min(end - off, max_q);
            let qa = align_up(q, pe);
            let per_block = qa / pe;
            let (uc, mc) = self.half();
            let mut i = self.tid;
            while i < per_block {
                let e = i * pe;
                let v = self.pack_in(input.add(off + e), core::cmp::min(pe, q - e), false);
                arch::multimem_st(
                    (mc + ((self.rank * qa + e) * Self::SZ) as u64) as *mut Pack16,
                    v,
                );
                i += self.nthreads;
            }
            self.barrier();
            let mut i = self.tid;
            while i < n * per_block {
                let (j, e) = (i / per_block, (i % per_block) * pe);
                let v = arch::ld_pack((uc + ((j * qa + e) * Self::SZ) as u64) as *const Pack16);
                self.pack_out(
                    output.add(j * count + off + e),
                    v,
                    core::cmp::min(pe, q - e),
                );
                i += self.nthreads;
            }
            self.pieces += 1;
            off += q;
        }
    }
}
