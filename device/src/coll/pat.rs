//! PAT: AllGather and ReduceScatter along binomial trees over ranks `2^k` apart (NCCL's
//! parallel aggregated trees), for one rank per node, where a ring pays n − 1 network
//! latencies in a row and these pay ceil(log2 n).
//!
//! Offsets are relative: offset `s` of rank `r` is block `(r + s) mod n`. Every rank walks the
//! same offsets in the same order, so the i-th send on a dimension meets the i-th receive of
//! its peer on that dimension. Dimension `k` joins ranks `2^k` apart (`k < ceil(log2 n)`), on
//! connections of its own ([`PatDev`]).
//!
//! AllGather, dimensions from the highest down: on dimension `k` a rank sends every block it
//! holds at an offset `u` that is a multiple of `2^(k+1)` (its own at 0, the others received
//! on higher dimensions) to rank `r - 2^k`, where it is offset `u + 2^k`, and receives offset
//! `u + 2^k` from rank `r + 2^k`. Offsets past `n - 1` are skipped. A block so reaches every
//! rank along a binomial tree rooted at its owner.
//!
//! ReduceScatter is the mirror image, dimensions from 0 up: the partial sum of offset `t`
//! goes to rank `r + 2^lowbit(t)`, where it is offset `t - 2^lowbit(t)`, once every partial
//! of its lower dimensions came in. A rank keeps the partials it builds (even offsets) in its
//! CTA's scratch, the one of its own block in its output, where the last one becomes final.
//! The sum is folded in a fixed order, not the ring's.
//!
//! Within a dimension sends and receives alternate, one FIFO step each: a rank's i-th send
//! waits only for its peer's (i − NCCL_STEPS)-th receive, and its i-th receive for its other
//! peer's i-th send, so no cycle of waits can form. Each piece of a channel's slice runs
//! every dimension before the next piece starts (ReduceScatter's scratch holds one piece).
//!
//! A slice small enough for dimension 0's `n / 2` offsets to share one FIFO slot goes as one
//! piece, and each dimension as two steps: one send packing all its offsets' parts, then one
//! receive (NCCL's aggregation): ceil(log2 n) network messages each way instead of n − 1.

use super::Kernel;
use crate::abi::{pat_dims, Coll, CollArgs, ConnRecv, ConnSend, DevComm, PatDev, PROTO_SIMPLE};
use crate::arch;
use crate::ops::{pack_elems, RedOp, Reduced};
use crate::prims::copy::Move;
use crate::prims::{Dst, Prims, Src};
use crate::types::Elem;

/// Runs collective `C` on the PAT connections of [`CollArgs::pat`]: AllGather or
/// ReduceScatter, Simple steps.
///
/// # Safety
/// As [`super::run`], with `args.pat` wired by the host.
#[inline(never)]
pub unsafe fn run<T: Elem, O: RedOp<T>, const C: u32>(args: &CollArgs) {
    let mut k = Kernel::<T, O, PROTO_SIMPLE>::new(args);
    match Coll::from_raw(C) {
        Some(Coll::AllGather) => all_gather(&mut k),
        Some(Coll::ReduceScatter) => reduce_scatter(&mut k),
        _ => arch::trap(),
    }
}

/// This CTA's connections and this rank.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
unsafe fn place<T, O, const P: u32>(k: &Kernel<T, O, P>) -> (&'static PatDev, usize) {
    let pd = &*(k.args.pat as *const PatDev).add(arch::block_idx() as usize);
    (pd, (*(k.args.comm as *const DevComm)).rank as usize)
}

/// The steps of one dimension, on its send and receive connections.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
unsafe fn dim_prims<T, O, const P: u32>(
    k: &Kernel<T, O, P>,
    pd: &PatDev,
    send: u64,
    recv: u64,
) -> Prims {
    let (send, recv) = (send as *mut ConnSend, recv as *mut ConnRecv);
    Prims::between(send, pd.slot_bytes, recv, pd.slot_bytes)
        .with_abort(k.abort_flag)
        .with_flags(k.args.flags)
}

/// Ends a dimension: saves its step counters, and lets every thread see them before another
/// dimension's [`Prims`] reads a connection this one used.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
unsafe fn end_dim(p: Prims) {
    p.finish();
    arch::sync_threads();
}

/// Offsets a rank sends (and receives) on the dimension of distance `d`: the multiples of
/// `2d` below `n - d`.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
fn offsets(n: usize, d: usize) -> usize {
    (n - d - 1) / (2 * d) + 1
}

/// Largest slice a CTA moves in one aggregated piece: dimension 0's `n / 2` parts share a
/// step of `chunk` elements, each part a whole number of packs. Both ends of every
/// connection decide alike from the slice (the same on every rank).
#[cfg_attr(target_arch = "nvptx64", inline(always))]
fn aggregate_piece<T>(chunk: usize, n: usize) -> usize {
    chunk / (n / 2) / pack_elems::<T>() * pack_elems::<T>()
}

/// AllGather (see the module's text). `count` is the per-rank count.
///
/// # Safety
/// See [`run`].
pub unsafe fn all_gather<T: Elem, O: RedOp<T>>(k: &mut Kernel<T, O, PROTO_SIMPLE>) {
    let (n, input, output) = (k.nranks, k.input, k.output);
    let count = k.args.count as usize;
    let (pd, me) = place(k);
    let own = output.add(me * count);
    let in_place = core::ptr::eq(input, own);
    if n == 1 {
        if !in_place {
            k.local_copy(input.add(k.start), own.add(k.start), k.end - k.start);
        }
        return;
    }
    let op = k.op;
    let at = |s: usize| output.add(((me + s) % n) * count);
    let (top, chunk) = (pat_dims(n), k.max_chunk());
    if k.start < k.end && k.end - k.start <= aggregate_piece::<T>(chunk, n) {
        // The whole slice in one piece, each dimension one step of its offsets' parts.
        let (m, off, tid, nt) = (k.end - k.start, k.start, k.tid, k.nthreads);
        for dim in (0..top).rev() {
            let d = 1usize << dim;
            let mut p = dim_prims(k, pd, pd.down_send[dim], pd.down_recv[dim]);
            let parts = offsets(n, d);
            // A step of sends, then one of receives: a step that did both would wait for its
            // receive before sending, and so would its peer.
            p.step_parts::<T>(parts, m, false, true, |i, _, to| {
                let u = 2 * d * i;
                let (src, copy) = match u {
                    0 if dim == top - 1 && !in_place => (input.add(off), own.add(off)),
                    0 => (input.add(off), core::ptr::null_mut()),
                    _ => (at(u).add(off) as *const T, core::ptr::null_mut()),
                };
                let send = Move {
                    input: src,
                    output: copy,
                    send: to,
                    ..Move::none()
                };
                send.run_inline(&op, m, tid, nt);
            });
            p.step_parts::<T>(parts, m, true, false, |i, from, _| {
                let u = 2 * d * i;
                let recv = Move {
                    recv: from,
                    output: at(u + d).add(off),
                    ..Move::none()
                };
                recv.run_inline(&op, m, tid, nt);
            });
            end_dim(p);
        }
        return;
    }
    let mut off = k.start;
    while off < k.end {
        let m = core::cmp::min(chunk, k.end - off);
        for dim in (0..top).rev() {
            let d = 1usize << dim;
            let mut p = dim_prims(k, pd, pd.down_send[dim], pd.down_recv[dim]);
            let mut u = 0;
            while u + d < n {
                if u == 0 {
                    // Our own block, copied into place with its first send (in place: there).
                    let copy = match dim == top - 1 && !in_place {
                        true => own.add(off),
                        false => core::ptr::null_mut(),
                    };
                    p.copy_send(&op, input.add(off), copy, m, Dst::Fifo);
                } else {
                    p.send(&op, at(u).add(off), m, Dst::Fifo);
                }
                p.recv(&op, at(u + d).add(off), m, Src::Fifo);
                u += 2 * d;
            }
            end_dim(p);
        }
        off += m;
    }
}

/// ReduceScatter (see the module's text). `count` is the per-rank count.
///
/// # Safety
/// See [`run`]; `PatDev::scratch` holds `scratch_bytes` on every rank alike.
pub unsafe fn reduce_scatter<T: Elem, O: RedOp<T>>(k: &mut Kernel<T, O, PROTO_SIMPLE>) {
    let (n, input, output) = (k.nranks, k.input, k.output);
    let count = k.args.count as usize;
    let (pd, me) = place(k);
    if n == 1 {
        k.local_copy(input.add(k.start), output.add(k.start), k.end - k.start);
        return;
    }
    let (op, summed) = (k.op, Reduced(k.op));
    // Partials kept at once: one per even offset from 2 to n - 1, a piece each.
    let kept_slots = (n - 1) / 2;
    let pack = pack_elems::<T>();
    let room = pd.scratch_bytes as usize / core::mem::size_of::<T>() / kept_slots.max(1);
    let chunk = match kept_slots {
        0 => k.max_chunk(),
        _ => core::cmp::min(k.max_chunk(), room / pack * pack),
    };
    if chunk == 0 {
        // The host sizes the scratch for a pack per partial at least.
        arch::trap();
    }
    let scratch = pd.scratch as *mut T;
    let mine = |t: usize| input.add(((me + t) % n) * count);
    let top = pat_dims(n);
    if k.start < k.end && k.end - k.start <= aggregate_piece::<T>(chunk, n) {
        // The whole slice in one piece, each dimension one step of its offsets' parts (the
        // same choices as the steps below, as moves: a partial read back is a `recv` of the
        // move, which no `pre` touches).
        let (m, off, tid, nt) = (k.end - k.start, k.start, k.tid, k.nthreads);
        let kept = |t: usize| scratch.add((t / 2 - 1) * m);
        for dim in 0..top {
            let d = 1usize << dim;
            let last = dim == top - 1;
            let mut p = dim_prims(k, pd, pd.up_send[dim], pd.up_recv[dim]);
            let parts = offsets(n, d);
            // Sends, then receives, in steps of their own (as AllGather's).
            p.step_parts::<T>(parts, m, false, true, |i, _, to| {
                let t = 2 * d * i + d;
                let send = match dim == 0 || t + 1 >= n {
                    true => Move {
                        input: mine(t).add(off),
                        send: to,
                        ..Move::none()
                    },
                    false => Move {
                        recv: kept(t),
                        send: to,
                        ..Move::none()
                    },
                };
                send.run_inline(&op, m, tid, nt);
            });
            p.step_parts::<T>(parts, m, true, false, |i, from, _| {
                let u = 2 * d * i;
                let dst = match u {
                    0 => output.add(off),
                    _ => kept(u),
                };
                let recv = Move {
                    recv: from,
                    output: dst,
                    post: last,
                    ..Move::none()
                };
                match dim {
                    0 => Move {
                        input: mine(u).add(off),
                        ..recv
                    }
                    .run_inline(&op, m, tid, nt),
                    _ => Move { input: dst, ..recv }.run_inline(&summed, m, tid, nt),
                }
            });
            end_dim(p);
        }
        return;
    }
    let kept = |t: usize| scratch.add((t / 2 - 1) * chunk);
    let mut off = k.start;
    while off < k.end {
        let m = core::cmp::min(chunk, k.end - off);
        for dim in 0..top {
            let d = 1usize << dim;
            let mut p = dim_prims(k, pd, pd.up_send[dim], pd.up_recv[dim]);
            let mut u = 0;
            while u + d < n {
                // Offset t's partial: its input alone on dimension 0, or where it had no
                // partner on dimension 0 (t = n - 1); else what it kept.
                let t = u + d;
                if dim == 0 || t + 1 >= n {
                    p.send(&op, mine(t).add(off), m, Dst::Fifo);
                } else {
                    p.send(&summed, kept(t), m, Dst::Fifo);
                }
                // Offset u receives: on dimension 0 its first partner (every u that receives
                // has one there), later ones add to what it kept; only offset 0 receives on
                // the last dimension, whose sum is final.
                let dst = match u {
                    0 => output.add(off),
                    _ => kept(u),
                };
                match (dim == 0, dim == top - 1) {
                    (true, true) => p.recv_reduce_copy(&op, mine(u).add(off), dst, m, Src::Fifo),
                    (true, false) => p.recv_reduce_keep(&op, mine(u).add(off), dst, m, Src::Fifo),
                    (false, true) => p.recv_reduce_copy(&summed, dst, dst, m, Src::Fifo),
                    (false, false) => p.recv_reduce_keep(&summed, dst, dst, m, Src::Fifo),
                }
                u += 2 * d;
            }
            end_dim(p);
        }
        off += m;
    }
}
