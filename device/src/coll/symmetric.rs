//! The symmetric path: collectives on buffers in windows (NCCL 2.27's symmetric memory), as
//! loads from the peers' memory instead of steps through FIFOs. Every rank of the node maps
//! every other rank's windows and its symmetric scratch ([`SymDev`]); an input in a window is
//! read where it lies, any other input is first copied into the rank's staging area.
//!
//! AllReduce, ReduceScatter and AllGather, one-shot: CTA `c` of every rank owns the same slice
//! of each rank's block (AllReduce: the elements; ReduceScatter: the elements of each of the
//! `nranks` blocks of the input; AllGather: the bytes of the input).
//! 1. It stages its slices of the input when the input is not in a window ([`SYM_SRC_STAGED`]).
//! 2. Arrive: it writes, into slot (c, arrive, me) of every rank's scratch, where its input
//!    lies and the launch number, released after its staging stores; then waits until every
//!    rank's slot (c, arrive, r) of its own scratch holds the launch number.
//! 3. It reads its slice from every rank (in rank order, so every rank computes the same bits)
//!    and writes the reduction to its own output (ReduceScatter: of block `me` of every rank;
//!    AllGather: no reduction, rank `r`'s slice goes to output block `r`).
//! 4. Depart: the same exchange in the depart slots. Once it passes, no rank reads this rank's
//!    input or staging area any more: the user may overwrite the input, and the next launch
//!    may stage into the area again.
//!
//! Small calls (at most [`crate::abi::SYM_LL_MAX_BYTES`] per rank block, [`CollArgs::proto`]
//! LL) need no barrier at all: CTA `c` pushes its slice of the input as LL lines (8 payload
//! bytes and the launch number as flag, in one 16-byte store) into slot (launch parity, me, c)
//! of every rank's LL area (ReduceScatter: its slice of block `r` to rank `r`), then polls the
//! lines every rank pushed into its own area and reduces them in rank order (AllGather: writes
//! rank `r`'s lines to output block `r`). A slot half is written again two launches of CTA
//! `c` later, and by then its reader is done with it: a rank's CTA `c` pushes launch k only
//! after its own launch k-1 received every rank's lines of k-1, which each pushed after its
//! launch k-2 (the last reader of the half) ended, in stream order.
//!
//! AllReduce two-shot ([`FLAG_SYM_TWO_SHOT`], the loads form on 3 ranks or more): rank `r`
//! owns block `r` of the elements, and CTA `c` the same slice of every block. After the
//! arrival, CTA `c` reduces its slice of its own block from every rank's input into its
//! output, then publishes it in its own staging area at the block's place (only this rank
//! reads its input's own block, so the place is free), exchanges "published", and copies the
//! other ranks' reduced slices from their staging areas into its output. Each rank reads
//! `2 (n-1)/n` of the data instead of `n-1`.
//!
//! The launch number is counted per CTA in the rank's own [`SymDev::launches`] (every rank
//! runs the same sequence of symmetric launches, so the numbers agree); a graph's replays count
//! on. A slot only grows, so a waiter needs `>=`: a peer may already have arrived for the next
//! launch.

use super::{align_up, div_ceil, spin_until};
use super::{channel_range, scalar_bits};
use crate::abi::{
    sym_src_parts, Coll, CollArgs, DevComm, SymDev, SymSlot, FLAG_SYM_TWO_SHOT, PROTO_LL,
    SYM_FLAG_BYTES, SYM_LL_CTA_BYTES, SYM_MAX_CTAS, SYM_MAX_RANKS, SYM_PHASES, SYM_SRC_STAGED,
};
use crate::arch::{self, Pack16};
use crate::ops::{map1, map2, pack_elems, RedOp, RedOpKind};
use crate::prims::ll::{load8, store8};
use crate::types::Elem;

const ARRIVE: usize = 0;
const DEPART: usize = 1;
/// Two-shot: this CTA's slice of its block, reduced, is in its staging area.
const PUBLISHED: usize = 2;

/// Runs a one-shot AllReduce, ReduceScatter or AllGather (`C`; AllGather as bytes) as CTA
/// `block_idx`.
///
/// # Safety
/// As [`super::run`]; the host chose the symmetric path for this call on every rank: `args.sym`
/// is the communicator's [`SymDev`], every rank launched the same grid, and `args.sym_src`
/// names where this rank's input lies.
#[inline(never)]
pub unsafe fn run<T: Elem, O: RedOp<T>, const C: u32>(args: &CollArgs) {
    let comm = &*(args.comm as *const DevComm);
    if args.sym == 0 {
        arch::trap();
    }
    let sym = args.sym as *mut SymDev;
    let (rank, nranks) = ((*sym).rank as usize, (*sym).nranks as usize);
    if nranks > SYM_MAX_RANKS || rank >= nranks {
        arch::trap();
    }
    let coll = match Coll::from_raw(C) {
        Some(c @ (Coll::AllReduce | Coll::ReduceScatter | Coll::AllGather)) => c,
        _ => arch::trap(),
    };
    let (cta, grid) = (arch::block_idx() as usize, arch::grid_dim() as usize);
    let mut k = Cta {
        sym,
        rank,
        nranks,
        cta,
        tid: arch::thread_idx() as usize,
        nthreads: arch::block_dim() as usize,
        launch: arch::ld_volatile(&(*sym).launches[cta]) + 1,
        abort: comm.abort_flag as *const u64,
        aborted: false,
    };
    let op = O::new(scalar_bits::<T>(args));
    if args.proto == PROTO_LL {
        match coll {
            Coll::AllGather => k.ll_all_gather(args, grid),
            _ => k.ll_reduce::<T, O>(&op, args, grid, coll == Coll::ReduceScatter),
        }
        arch::sync_threads(); // every thread read the launch number before it moves on
    } else if coll == Coll::AllReduce && args.flags & FLAG_SYM_TWO_SHOT != 0 {
        k.two_shot::<T, O>(&op, args, grid);
    } else {
        let count = args.count as usize;
        let (start, end) = channel_range::<T>(count, cta, grid);
        let (input, output) = (args.sendbuff as *const T, args.recvbuff as *mut T);
        if args.sym_src == SYM_SRC_STAGED {
            let blocks = if coll == Coll::ReduceScatter {
                nranks
            } else {
                1
            };
            let stage = k.stage_of::<T>(rank);
            for b in 0..blocks {
                let at = b * count + start;
                k.copy::<T>(stage.add(at), input.add(at), end - start);
            }
        }
        k.exchange(ARRIVE, args.sym_src, args.sym_dst);
        match coll {
            Coll::AllReduce if args.mc_dst != 0 && k.all_alike(args.sym_src, args.sym_dst) => {
                k.switch_slice::<T, O>(&op, args, grid)
            }
            Coll::AllGather if args.mc_dst != 0 && k.all_alike(args.sym_src, args.sym_dst) => {
                k.switch_gather::<T>(args, grid)
            }
            Coll::ReduceScatter if args.mc_src != 0 && k.all_alike(args.sym_src, args.sym_dst) => {
                k.switch_scatter::<T, O>(&op, args, grid)
            }
            Coll::AllGather => k.gather_slice::<T>(output, count, start, end),
            Coll::ReduceScatter => k.reduce_slice::<T, O>(&op, output, rank * count, start, end),
            _ => k.reduce_slice::<T, O>(&op, output, 0, start, end),
        }
        k.exchange(DEPART, 0, 0);
    }
    if k.tid == 0 {
        arch::st_volatile(&mut (*sym).launches[cta], k.launch);
    }
}

/// One CTA of a symmetric launch: its place, its launch number, and the abort flag.
struct Cta {
    sym: *mut SymDev,
    rank: usize,
    nranks: usize,
    cta: usize,
    tid: usize,
    nthreads: usize,
    launch: u64,
    abort: *const u64,
    aborted: bool,
}

impl Cta {
    /// The staging area of rank `r`, as this rank maps it.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn stage_of<T>(&self, r: usize) -> *mut T {
        ((*self.sym).scratch[r] + SYM_FLAG_BYTES as u64) as *mut T
    }

    /// Where rank `r`'s input lies, as this rank maps it, given the `src` it arrived with.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn source_of<T>(&self, src: u64, r: usize) -> *const T {
        match sym_src_parts(src) {
            None => self.stage_of::<T>(r),
            Some((slot, offset)) => {
                let table = (*self.sym).windows as *const u64;
                (arch::ld_volatile(table.add(slot * SYM_MAX_RANKS + r)) + offset) as *const T
            }
        }
    }

    /// The slots of `phase` for this CTA in rank `r`'s scratch as this rank maps it: one per
    /// rank.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn slots_of(&self, r: usize, phase: usize) -> *mut SymSlot {
        let at = (self.cta * SYM_PHASES + phase) * SYM_MAX_RANKS * core::mem::size_of::<SymSlot>();
        ((*self.sym).scratch[r] + at as u64) as *mut SymSlot
    }

    /// Copies `n` elements from `src` to `dst`, 16 bytes a thread where both are aligned.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn copy<T: Elem>(&self, dst: *mut T, src: *const T, n: usize) {
        let pe = pack_elems::<T>();
        let aligned = (dst as usize).is_multiple_of(16) && (src as usize).is_multiple_of(16);
        let packs = if aligned { n / pe } else { 0 };
        let mut i = self.tid;
        while i < packs {
            let v = arch::ld_pack((src as *const Pack16).add(i));
            arch::st_pack((dst as *mut Pack16).add(i), v);
            i += self.nthreads;
        }
        let mut e = packs * pe + self.tid;
        while e < n {
            dst.add(e).write(src.add(e).read());
            e += self.nthreads;
        }
    }

    /// Whether every rank arrived with its input at `src` and its output at `dst` (the same
    /// window slots, the same offsets): every rank reads the same slots, so all decide alike.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn all_alike(&self, src: u64, dst: u64) -> bool {
        let arrived = self.slots_of(self.rank, ARRIVE);
        (0..self.nranks).all(|r| {
            let slot = arrived.add(r);
            arch::ld_volatile(&(*slot).src) == src && arch::ld_volatile(&(*slot).dst) == dst
        })
    }

    /// The multimem AllReduce (NVLS on windows): this rank reduces its block of the elements
    /// (this CTA's slice of it) through the switch from every rank's input at once, and stores
    /// the result to every rank's output at once. The host asks only for (type, reduction)
    /// pairs the switch has, and for a count that splits into whole packs per rank.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn switch_slice<T: Elem, O: RedOp<T>>(&self, op: &O, args: &CollArgs, grid: usize) {
        // The switch adds raw inputs: a reduction with `pre` (a float average divides first,
        // a premultiplied sum multiplies) cannot go through it; the host never asks.
        let Some(mc) = arch::multimem_op(T::DTYPE, O::KIND).filter(|_| !O::HAS_PRE) else {
            arch::trap();
        };
        let pe = pack_elems::<T>();
        let block = args.count as usize / self.nranks;
        let (start, end) = channel_range::<T>(block, self.cta, grid);
        let first = (self.rank * block + start) / pe;
        let (src, dst) = (args.mc_src as *const Pack16, args.mc_dst as *mut Pack16);
        let mut j = first + self.tid;
        while j < first + (end - start) / pe {
            let mut v = arch::multimem_ld_reduce::<T>(mc, src.add(j));
            if O::HAS_POST {
                v = map1::<T>(v, |a| op.post(a));
            }
            arch::multimem_st(dst.add(j), v);
            j += self.nthreads;
        }
    }

    /// The multimem AllGather (NVLS on windows): this rank stores its input (this CTA's slice
    /// of it) into its block of every rank's output at once, through the output's multicast
    /// address. The host asks only for blocks of whole packs, 16-byte aligned.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn switch_gather<T: Elem>(&self, args: &CollArgs, grid: usize) {
        let pe = pack_elems::<T>();
        let count = args.count as usize;
        let (start, end) = channel_range::<T>(count, self.cta, grid);
        let src = args.sendbuff as *const Pack16;
        let dst = (args.mc_dst as *mut Pack16).add(self.rank * count / pe);
        let mut j = start / pe + self.tid;
        while j < end / pe {
            arch::multimem_st(dst.add(j), arch::ld_pack(src.add(j)));
            j += self.nthreads;
        }
    }

    /// The multimem ReduceScatter (NVLS on windows): this rank reduces its block of every
    /// rank's input (this CTA's slice of it) through the switch, from the input's multicast
    /// address, and stores it into its own output. The host asks only for (type, reduction)
    /// pairs the switch has, without `pre`, and for blocks of whole packs, 16-byte aligned.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn switch_scatter<T: Elem, O: RedOp<T>>(&self, op: &O, args: &CollArgs, grid: usize) {
        let Some(mc) = arch::multimem_op(T::DTYPE, O::KIND).filter(|_| !O::HAS_PRE) else {
            arch::trap();
        };
        let pe = pack_elems::<T>();
        let count = args.count as usize;
        let (start, end) = channel_range::<T>(count, self.cta, grid);
        let src = (args.mc_src as *const Pack16).add(self.rank * count / pe);
        let dst = args.recvbuff as *mut Pack16;
        let mut j = start / pe + self.tid;
        while j < end / pe {
            let mut v = arch::multimem_ld_reduce::<T>(mc, src.add(j));
            if O::HAS_POST {
                v = map1::<T>(v, |a| op.post(a));
            }
            arch::st_pack(dst.add(j), v);
            j += self.nthreads;
        }
    }

    /// Where every rank's input lies (as it arrived), `offset` elements in.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn sources<T>(&self, offset: usize) -> [*const T; SYM_MAX_RANKS] {
        let mut srcs = [core::ptr::null::<T>(); SYM_MAX_RANKS];
        let arrived = self.slots_of(self.rank, ARRIVE);
        for (r, s) in srcs.iter_mut().enumerate().take(self.nranks) {
            let src = self.source_of::<T>(arch::ld_volatile(&(*arrived.add(r)).src), r);
            *s = src.add(offset);
        }
        srcs
    }

    /// Copies elements `start..end` of every rank's input into its block of `output` (blocks
    /// of `count`).
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn gather_slice<T: Elem>(&self, output: *mut T, count: usize, start: usize, end: usize) {
        let srcs = self.sources::<T>(0);
        for (r, src) in srcs.iter().enumerate().take(self.nranks) {
            self.copy::<T>(output.add(r * count + start), src.add(start), end - start);
        }
    }

    /// Reduces elements `start..end` of every rank's input, `offset` elements in (in rank
    /// order), into `output`.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn reduce_slice<T: Elem, O: RedOp<T>>(
        &self,
        op: &O,
        output: *mut T,
        offset: usize,
        start: usize,
        end: usize,
    ) {
        let n = self.nranks;
        let srcs = self.sources::<T>(offset);
        let pe = pack_elems::<T>();
        let aligned = (output.add(start) as usize).is_multiple_of(16)
            && srcs[..n]
                .iter()
                .all(|s| (s.add(start) as usize).is_multiple_of(16));
        let packs = if aligned { (end - start) / pe } else { 0 };
        let mut i = self.tid;
        while i < packs {
            let at = start + i * pe;
            let acc =
                reduce_ranks::<T, O>(op, n, |r| arch::ld_pack(srcs[r].add(at) as *const Pack16));
            arch::st_pack(output.add(at) as *mut Pack16, acc);
            i += self.nthreads;
        }
        // The tail (or everything, unaligned): element by element.
        let mut at = start + packs * pe + self.tid;
        while at < end {
            // One element in the first lane of a pack.
            let acc = reduce_ranks::<T, O>(op, n, |r| {
                let mut v = Pack16::default();
                (&mut v as *mut Pack16 as *mut T).write(srcs[r].add(at).read());
                v
            });
            output
                .add(at)
                .write((&acc as *const Pack16 as *const T).read());
            at += self.nthreads;
        }
    }

    /// The LL lines rank `r` pushes to rank `to` for this CTA in this launch's half, as this
    /// rank maps `to`'s scratch.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn ll_slot(&self, to: usize, from: usize) -> *mut Pack16 {
        let half = (self.launch % 2) as usize;
        let at = SYM_FLAG_BYTES
            + (*self.sym).stage_bytes as usize
            + ((half * SYM_MAX_RANKS + from) * SYM_MAX_CTAS + self.cta) * SYM_LL_CTA_BYTES;
        ((*self.sym).scratch[to] + at as u64) as *mut Pack16
    }

    /// The two-shot AllReduce (see the module's text), ending with the depart exchange.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn two_shot<T: Elem, O: RedOp<T>>(&mut self, op: &O, args: &CollArgs, grid: usize) {
        let count = args.count as usize;
        let per = align_up(div_ceil(count, self.nranks), pack_elems::<T>());
        // This CTA's slice of rank r's block: elements start..end.
        let cta = self.cta;
        let slice = move |r: usize| {
            let first = (r * per).min(count);
            let (s, e) = channel_range::<T>((first + per).min(count) - first, cta, grid);
            (first + s, first + e)
        };
        let (input, output) = (args.sendbuff as *const T, args.recvbuff as *mut T);
        let mine = self.stage_of::<T>(self.rank);
        if args.sym_src == SYM_SRC_STAGED {
            for r in 0..self.nranks {
                let (s, e) = slice(r);
                self.copy::<T>(mine.add(s), input.add(s), e - s);
            }
        }
        self.exchange(ARRIVE, args.sym_src, args.sym_dst);
        if args.mc_dst != 0 && self.all_alike(args.sym_src, args.sym_dst) {
            // Through the switch (see `switch_slice`), with the two-shot's phases still
            // stepped through: every rank takes the same branch, and a rank without the
            // multicast addresses would have published other places.
            self.switch_slice::<T, O>(op, args, grid);
            self.exchange(PUBLISHED, 0, 0);
            self.exchange(DEPART, 0, 0);
            return;
        }
        let (s, e) = slice(self.rank);
        self.reduce_slice::<T, O>(op, output, 0, s, e);
        arch::sync_threads(); // the slice is reduced before the CTA copies it on
        self.copy::<T>(mine.add(s), output.add(s), e - s);
        self.exchange(PUBLISHED, 0, 0);
        for r in (0..self.nranks).filter(|&r| r != self.rank) {
            let (s, e) = slice(r);
            self.copy::<T>(output.add(s), self.stage_of::<T>(r).add(s), e - s);
        }
        self.exchange(DEPART, 0, 0);
    }

    /// This CTA's LL lines of a block of `bytes`: the first, and how many.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn ll_lines(&self, bytes: usize, grid: usize) -> (usize, usize) {
        let per = (SYM_LL_CTA_BYTES / 16).min(bytes.div_ceil(8).div_ceil(grid));
        let first = self.cta * per;
        (
            first,
            bytes.div_ceil(8).min(first + per).saturating_sub(first),
        )
    }

    /// Pushes this CTA's lines of a block of `bytes` to every rank: to rank `r`, the block at
    /// `input + r * stride` (a stride of 0: the same block to all).
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn ll_push(&self, input: *const u8, stride: usize, bytes: usize, grid: usize) {
        let (first, lines) = self.ll_lines(bytes, grid);
        let flag = self.launch as u32;
        let mut i = self.tid;
        while i < lines {
            let at = (first + i) * 8;
            let mut x = load8(input.add(at), bytes - at);
            for r in 0..self.nranks {
                if stride != 0 {
                    x = load8(input.add(r * stride + at), bytes - at);
                }
                let line = Pack16([x.0[0], flag, x.0[1], flag]);
                arch::st_volatile_pack(self.ll_slot(r, self.rank).add(i), line);
            }
            i += self.nthreads;
        }
    }

    /// Waits for line `i` of rank `from`'s push to this CTA in this launch; its 8 payload
    /// bytes in the first two lanes.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn ll_take(&mut self, from: usize, i: usize) -> Pack16 {
        let line = self.ll_slot(self.rank, from).add(i);
        let flag = self.launch as u32;
        let mut v = Pack16::default();
        spin_until(self.abort, &mut self.aborted, || {
            v = arch::ld_volatile_pack(line);
            v.0[1] == flag && v.0[3] == flag
        });
        Pack16([v.0[0], v.0[2], 0, 0])
    }

    /// The LL one-shot AllReduce (ReduceScatter with `scatter`: block `r` of the input goes
    /// to rank `r`) of this CTA's lines: push, then poll, reduce in rank order, write. A
    /// thread reads its input lines before it writes the same output lines, so in place is
    /// safe.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn ll_reduce<T: Elem, O: RedOp<T>>(
        &mut self,
        op: &O,
        args: &CollArgs,
        grid: usize,
        scatter: bool,
    ) {
        let bytes = args.count as usize * core::mem::size_of::<T>();
        let stride = if scatter { bytes } else { 0 };
        self.ll_push(args.sendbuff as *const u8, stride, bytes, grid);
        let (first, lines) = self.ll_lines(bytes, grid);
        let output = args.recvbuff as *mut u8;
        let mut i = self.tid;
        while i < lines {
            let at = (first + i) * 8;
            let acc = reduce_ranks::<T, O>(op, self.nranks, |r| self.ll_take(r, i));
            store8(output.add(at), bytes - at, acc);
            i += self.nthreads;
        }
    }

    /// The LL one-shot AllGather of this CTA's lines (`args.count` bytes a rank): push the
    /// input to every rank, then write rank `r`'s lines to output block `r`.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn ll_all_gather(&mut self, args: &CollArgs, grid: usize) {
        let bytes = args.count as usize;
        self.ll_push(args.sendbuff as *const u8, 0, bytes, grid);
        let (first, lines) = self.ll_lines(bytes, grid);
        let output = args.recvbuff as *mut u8;
        let mut i = self.tid;
        while i < lines {
            let at = (first + i) * 8;
            for r in 0..self.nranks {
                let v = self.ll_take(r, i);
                store8(output.add(r * bytes + at), bytes - at, v);
            }
            i += self.nthreads;
        }
    }

    /// Every rank's CTA arrives in `phase` before any goes on; `src` goes with the arrival.
    /// Thread `r < nranks` tells rank `r` and waits for it. Once the abort flag is raised the
    /// waits end (the results are then undefined, as NCCL's after an abort).
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn exchange(&mut self, phase: usize, src: u64, dst: u64) {
        arch::sync_threads();
        if self.tid < self.nranks {
            let r = self.tid;
            let theirs = self.slots_of(r, phase).add(self.rank);
            // The CTA's stores before the barrier above (the staged input) go out first.
            arch::fence_sys();
            arch::st_volatile(&mut (*theirs).src, src);
            arch::st_volatile(&mut (*theirs).dst, dst);
            arch::st_release_sys(&mut (*theirs).seq, self.launch);
            let mine = self.slots_of(self.rank, phase).add(r);
            let launch = self.launch;
            spin_until(self.abort, &mut self.aborted, || {
                arch::ld_acquire_sys(&(*mine).seq) >= launch
            });
        }
        arch::sync_threads();
    }
}

/// The reduction of `n` ranks' packs (`get(r)`: rank `r`'s), in rank order, with the
/// reduction's `pre` on each and `post` on the result. The narrow floats (fp16, bf16, fp8)
/// sum and multiply in f32, rounded once at the end, as NCCL's symmetric kernels do: in
/// their own precision a sum over ranks loses low bits at every step (2048 + 1 is 2048 in
/// fp16). Max and Min need no width.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
unsafe fn reduce_ranks<T: Elem, O: RedOp<T>>(
    op: &O,
    n: usize,
    mut get: impl FnMut(usize) -> Pack16,
) -> Pack16 {
    let widen = T::IS_FLOAT
        && core::mem::size_of::<T>() < 4
        && !matches!(O::KIND, RedOpKind::Max | RedOpKind::Min);
    let acc = if widen {
        let lanes = pack_elems::<T>();
        let mut wide = [0f32; 16];
        for r in 0..n {
            let v = pre::<T, O>(op, get(r));
            let p = &v as *const Pack16 as *const T;
            for (l, w) in wide.iter_mut().enumerate().take(lanes) {
                let x = p.add(l).read().to_f64() as f32;
                *w = match (r, O::KIND) {
                    (0, _) => x,
                    (_, RedOpKind::Prod) => *w * x,
                    _ => *w + x,
                };
            }
        }
        let mut out = Pack16::default();
        let po = &mut out as *mut Pack16 as *mut T;
        for (l, w) in wide.iter().enumerate().take(lanes) {
            po.add(l).write(T::from_f64(*w as f64));
        }
        out
    } else {
        let mut acc = pre::<T, O>(op, get(0));
        for r in 1..n {
            acc = map2::<T>(acc, pre::<T, O>(op, get(r)), |a, b| op.reduce(a, b));
        }
        acc
    };
    match O::HAS_POST {
        true => map1::<T>(acc, |x| op.post(x)),
        false => acc,
    }
}

#[cfg_attr(target_arch = "nvptx64", inline(always))]
fn pre<T: Elem, O: RedOp<T>>(op: &O, v: Pack16) -> Pack16 {
    match O::HAS_PRE {
        true => map1::<T>(v, |x| op.pre(x)),
        false => v,
    }
}
