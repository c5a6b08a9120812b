//! The data mover under every primitive: reads up to two sources (a FIFO slot and a user
//! buffer), reduces them, and writes up to two destinations, all threads of the CTA sharing the
//! work in 16-byte packs (coalesced, several packs in flight per thread).

use crate::arch::{self, Pack16};
use crate::ops::{map1, map2, pack_elems, RedOp};
use crate::types::Elem;

/// Packs each thread keeps in flight per loop iteration. 8 was slower on 4xH200 at 128-512 MiB
/// (AllReduce 0.77-0.81 of NCCL against 0.95-0.96 with 4, Reduce 0.75 against 0.89, same
/// run: results/h200x4-unroll-*), and with the hunk layout it gained nothing (AllReduce 0.93
/// against 0.95 at 512 MiB: results/h200x4-hunks-unroll*).
const UNROLL: usize = 4;
/// Threads of a warp.
const WARP: usize = 32;

/// Runs `$body` once for each `$u` in 0..UNROLL (UNROLL ≤ 8), as straight-line code with
/// constant indices.
macro_rules! each_unrolled {
    ($u:ident => $body:block) => {{
        const _: () = assert!(UNROLL <= 8);
        each_unrolled!(@ $u $body 0 1 2 3 4 5 6 7);
    }};
    (@ $u:ident $body:block $($k:literal)*) => {
        $(
            if $k < UNROLL {
                let $u: usize = $k;
                $body
            }
        )*
    };
}

/// Runs `$body` once for each `$k` in 0..`$limit` (`$limit` ≤ 8, a constant), as
/// straight-line code with constant indices (see [`each_unrolled`]).
macro_rules! each_below {
    ($limit:expr, $k:ident => $body:block) => {{
        const _: () = assert!($limit <= 8);
        each_below!(@ $limit, $k $body 0 1 2 3 4 5 6 7);
    }};
    (@ $limit:expr, $k:ident $body:block $($i:literal)*) => {
        $(
            if $i < $limit {
                let $k: usize = $i;
                $body
            }
        )*
    };
}

/// The sources and destinations of one step; a null pointer is an absent one.
#[derive(Clone, Copy)]
pub struct Move<T> {
    /// Data received from the previous rank (already reduced upstream).
    pub recv: *const T,
    /// This rank's own input; `pre` of the operator applies to it.
    pub input: *const T,
    pub output: *mut T,
    pub send: *mut T,
    /// Apply the operator's `post` (this step produces the final value).
    pub post: bool,
}

impl<T: Elem> Move<T> {
    /// Nothing to read or write yet: fill in what a step uses with struct update syntax.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub fn none() -> Move<T> {
        Move {
            recv: core::ptr::null(),
            input: core::ptr::null(),
            output: core::ptr::null_mut(),
            send: core::ptr::null_mut(),
            post: false,
        }
    }

    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn aligned(&self) -> bool {
        let bits =
            self.recv as usize | self.input as usize | self.output as usize | self.send as usize;
        bits.is_multiple_of(16)
    }

    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub(crate) fn combine<O: RedOp<T>>(&self, op: &O, r: Pack16, x: Pack16) -> Pack16 {
        let mut v = if self.input.is_null() {
            r
        } else {
            let x = if O::HAS_PRE {
                map1::<T>(x, |a| op.pre(a))
            } else {
                x
            };
            if self.recv.is_null() {
                x
            } else {
                map2::<T>(r, x, |a, b| op.reduce(a, b))
            }
        };
        if O::HAS_POST && self.post {
            v = map1::<T>(v, |a| op.post(a));
        }
        v
    }

    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn combine_one<O: RedOp<T>>(&self, op: &O, r: T, x: T) -> T {
        let mut v = if self.input.is_null() {
            r
        } else {
            let x = op.pre(x);
            if self.recv.is_null() {
                x
            } else {
                op.reduce(r, x)
            }
        };
        if self.post {
            v = op.post(v);
        }
        v
    }

    /// Moves `n` elements; thread `tid` of `nthreads` takes its share. Every pointer that is
    /// not null must be valid for `n` elements.
    ///
    /// Not inlined: one body per (type, reduction) instead of one per step call site keeps the
    /// PTX, and the driver's JIT time, small. `self` and `op` come by value, so the pointers
    /// and the scalar live in registers: behind a reference, every store (an asm block that
    /// may write any memory) would make the loop load them again.
    #[inline(never)]
    pub unsafe fn run<O: RedOp<T>>(self, op: O, n: usize, tid: usize, nthreads: usize) {
        self.run_inline(&op, n, tid, nthreads)
    }

    /// [`Move::run`], then the group's barrier (`bar` 0: the CTA's; else named barrier `bar` of
    /// `bar_threads` threads), in one body.
    ///
    /// The barrier sits in this function, not after the call: lanes leave the mover's loops at
    /// different times, and the driver's JIT compiles a barrier right after a call return as if
    /// the warp were whole again, so a split warp reached it (compute-sanitizer's synccheck:
    /// "divergent threads in warp" at the Simple step's barrier on one H100; a trap on a
    /// partial `activemask` there fired on the hardware too: results/h100-compute-sanitizer.txt).
    /// Here the JIT sees the loops end and guards the barrier for a split warp, as it does for
    /// every other barrier of the kernels.
    #[inline(never)]
    pub unsafe fn run_then_meet<O: RedOp<T>>(
        self,
        op: O,
        n: usize,
        tid: usize,
        nthreads: usize,
        bar: u32,
        bar_threads: u32,
    ) {
        self.run_inline(&op, n, tid, nthreads);
        if bar == 0 {
            arch::sync_threads();
        } else {
            arch::barrier_named(bar, bar_threads);
        }
    }

    /// [`Move::run`] inlined at the call site, as every step was before it had its own
    /// body. The send/recv kernel keeps that: its family is small, and with the shared body
    /// 4xH200 sendrecv at 512 MiB measured 0.65-0.66 of NCCL, against 0.80 inlined (same
    /// 8 connections per peer: results/h200x4-sendrecv-inline-8conns.txt).
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn run_inline<O: RedOp<T>>(&self, op: &O, n: usize, tid: usize, nthreads: usize) {
        let pe = pack_elems::<T>();
        let npacks = if self.aligned() { n / pe } else { 0 };
        // Whole hunks first, as NCCL: a warp takes UNROLL * lanes consecutive packs, its lanes
        // interleaved, so a thread's packs lie at constant distances from one address per
        // buffer (immediate offsets in the loads and stores, instead of an address register
        // per pack and buffer). On the simulator a CTA under 32 threads is one narrow warp.
        let lanes = if cfg!(target_arch = "nvptx64") {
            WARP
        } else {
            WARP.min(nthreads)
        };
        let (warp, lane, nwarps) = (tid / lanes, tid % lanes, nthreads / lanes);
        let hunk = UNROLL * lanes;
        let nhunks = npacks / hunk;
        let p = |ptr: *const T, i: usize| (ptr as *const Pack16).add(i);
        // Threads past the last whole warp (the simulator's odd CTAs) only take the rest.
        let mut h = if warp < nwarps { warp } else { nhunks };
        while h < nhunks {
            let at = h * hunk + lane;
            let mut r = [Pack16::default(); 8];
            let mut x = [Pack16::default(); 8];
            // Spelled out rather than a `for`: LLVM does not always unroll that fully (with 4,
            // the uint8 body that Broadcast and AllGather run kept r and x in local memory), and
            // arrays indexed at run time live in local memory, not registers.
            each_unrolled!(u => {
                if !self.recv.is_null() {
                    r[u] = arch::ld_pack(p(self.recv, at + u * lanes));
                }
                if !self.input.is_null() {
                    x[u] = arch::ld_pack(p(self.input, at + u * lanes));
                }
            });
            each_unrolled!(u => {
                let v = self.combine(op, r[u], x[u]);
                let k = at + u * lanes;
                if !self.output.is_null() {
                    arch::st_pack((self.output as *mut Pack16).add(k), v);
                }
                if !self.send.is_null() {
                    arch::st_pack((self.send as *mut Pack16).add(k), v);
                }
            });
            h += nwarps;
        }
        let mut i = nhunks * hunk + tid;
        while i < npacks {
            let r = if self.recv.is_null() {
                Pack16::default()
            } else {
                arch::ld_pack(p(self.recv, i))
            };
            let x = if self.input.is_null() {
                Pack16::default()
            } else {
                arch::ld_pack(p(self.input, i))
            };
            let v = self.combine(op, r, x);
            if !self.output.is_null() {
                arch::st_pack((self.output as *mut Pack16).add(i), v);
            }
            if !self.send.is_null() {
                arch::st_pack((self.send as *mut Pack16).add(i), v);
            }
            i += nthreads;
        }
        // What packs did not cover: the tail, or everything when a buffer is not 16-byte aligned.
        let mut e = npacks * pe + tid;
        while e < n {
            let r = if self.recv.is_null() {
                T::default()
            } else {
                core::ptr::read_volatile(self.recv.add(e))
            };
            let x = if self.input.is_null() {
                T::default()
            } else {
                core::ptr::read_volatile(self.input.add(e))
            };
            let v = self.combine_one(op, r, x);
            if !self.output.is_null() {
                core::ptr::write_volatile(self.output.add(e), v);
            }
            if !self.send.is_null() {
                core::ptr::write_volatile(self.send.add(e), v);
            }
            e += nthreads;
        }
    }
}

/// Packs each thread keeps in flight in [`copy_local`]: a copy inside one GPU's memory waits
/// on HBM latency alone, so more loads in flight per SM than the FIFO steps' [`UNROLL`].
const LOCAL_UNROLL: usize = 8;

/// Copies `n` bytes from `src` to `dst` in one GPU's memory (a send to ourselves), thread
/// `tid` of `nthreads` taking its share: whole hunks of `LOCAL_UNROLL` packs per lane
/// first, the rest as [`Move::run_inline`] moves it.
///
/// # Safety
/// `src` and `dst` are valid for `n` bytes and do not overlap.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
pub unsafe fn copy_local(src: *const u8, dst: *mut u8, n: usize, tid: usize, nthreads: usize) {
    let mut done = 0;
    if (src as usize | dst as usize).is_multiple_of(16) {
        let lanes = if cfg!(target_arch = "nvptx64") {
            WARP
        } else {
            WARP.min(nthreads)
        };
        let (warp, lane, nwarps) = (tid / lanes, tid % lanes, nthreads / lanes);
        let hunk = LOCAL_UNROLL * lanes;
        let nhunks = n / 16 / hunk;
        let (from, to) = (src as *const Pack16, dst as *mut Pack16);
        let mut h = if warp < nwarps { warp } else { nhunks };
        while h < nhunks {
            let at = h * hunk + lane;
            let mut x = [Pack16::default(); LOCAL_UNROLL];
            each_below!(LOCAL_UNROLL, u => {
                x[u] = arch::ld_pack(from.add(at + u * lanes));
            });
            each_below!(LOCAL_UNROLL, u => {
                arch::st_pack(to.add(at + u * lanes), x[u]);
            });
            h += nwarps;
        }
        done = nhunks * hunk * 16;
    }
    Move {
        input: src.add(done),
        output: dst.add(done),
        ..Move::none()
    }
    .run_inline(&crate::ops::Sum, n - done, tid, nthreads);
}

/// Peers one [`Fan`] step reads from, or writes to, at most: a tree's children (the next rank
/// of a node's chain and two child nodes, [`crate::abi::TREE_MAX_CHILDREN`]).
pub const FAN: usize = crate::abi::TREE_MAX_CHILDREN;

/// The sources and destinations of a step with several peers ([`crate::prims::fan`]): up to
/// [`FAN`] received slots and this rank's input, reduced together, into this rank's output and
/// up to [`FAN`] send slots; a null pointer is an absent one. Every buffer is read or written
/// once per element, so a tree rank with three children reduces them and its input in one
/// pass, and sends a result to three children in one pass.
#[derive(Clone, Copy)]
pub struct Fan<T> {
    /// Data received from peers (partial sums: the operator's `pre` was applied upstream).
    pub recv: [*const T; FAN],
    /// This rank's own input; `pre` of the operator applies to it.
    pub input: *const T,
    pub output: *mut T,
    pub send: [*mut T; FAN],
    /// Apply the operator's `post` (this step produces the final value).
    pub post: bool,
}

impl<T: Elem> Fan<T> {
    /// Nothing to read or write yet: fill in what a step uses with struct update syntax.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub fn none() -> Fan<T> {
        Fan {
            recv: [core::ptr::null(); FAN],
            input: core::ptr::null(),
            output: core::ptr::null_mut(),
            send: [core::ptr::null_mut(); FAN],
            post: false,
        }
    }

    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn aligned(&self) -> bool {
        let mut bits = self.input as usize | self.output as usize;
        each_below!(FAN, k => {
            bits |= self.recv[k] as usize | self.send[k] as usize;
        });
        bits.is_multiple_of(16)
    }

    /// [`Move::run_then_meet`] for several peers: moves `n` elements (thread `tid` of
    /// `nthreads` takes its share), then meets at the group's barrier (`bar` 0: the CTA's;
    /// else named barrier `bar` of `bar_threads` threads), in one body for the reason given
    /// there. Every pointer that is not null must be valid for `n` elements.
    #[inline(never)]
    pub unsafe fn run_then_meet<O: RedOp<T>>(
        self,
        op: O,
        n: usize,
        tid: usize,
        nthreads: usize,
        bar: u32,
        bar_threads: u32,
    ) {
        self.run_inline(&op, n, tid, nthreads);
        if bar == 0 {
            arch::sync_threads();
        } else {
            arch::barrier_named(bar, bar_threads);
        }
    }

    /// The element loop of [`Fan::run_then_meet`], in the layout of [`Move::run_inline`]:
    /// whole hunks per warp, then single packs, then single elements. Sources are reduced in
    /// a fixed order (input first, then the peers in order), so every element is reduced alike
    /// whichever loop takes it.
    // `have` is set after the last peer too, where nothing reads it: the unrolled body is the
    // same for every peer.
    #[allow(unused_assignments)]
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn run_inline<O: RedOp<T>>(&self, op: &O, n: usize, tid: usize, nthreads: usize) {
        let pe = pack_elems::<T>();
        let npacks = if self.aligned() { n / pe } else { 0 };
        let lanes = if cfg!(target_arch = "nvptx64") {
            WARP
        } else {
            WARP.min(nthreads)
        };
        let (warp, lane, nwarps) = (tid / lanes, tid % lanes, nthreads / lanes);
        let hunk = UNROLL * lanes;
        let nhunks = npacks / hunk;
        let p = |ptr: *const T, i: usize| (ptr as *const Pack16).add(i);
        let has_input = !self.input.is_null();
        let mut h = if warp < nwarps { warp } else { nhunks };
        while h < nhunks {
            let at = h * hunk + lane;
            // The sum so far, and whether it holds anything yet (the same for every element).
            let mut v = [Pack16::default(); 8];
            if has_input {
                each_unrolled!(u => {
                    v[u] = arch::ld_pack(p(self.input, at + u * lanes));
                });
                if O::HAS_PRE {
                    each_unrolled!(u => {
                        v[u] = map1::<T>(v[u], |a| op.pre(a));
                    });
                }
            }
            let mut have = has_input;
            each_below!(FAN, k => {
                let r = self.recv[k];
                if !r.is_null() {
                    let mut x = [Pack16::default(); 8];
                    each_unrolled!(u => {
                        x[u] = arch::ld_pack(p(r, at + u * lanes));
                    });
                    each_unrolled!(u => {
                        v[u] = if have {
                            map2::<T>(x[u], v[u], |a, b| op.reduce(a, b))
                        } else {
                            x[u]
                        };
                    });
                    have = true;
                }
            });
            if O::HAS_POST && self.post {
                each_unrolled!(u => {
                    v[u] = map1::<T>(v[u], |a| op.post(a));
                });
            }
            each_unrolled!(u => {
                let k = at + u * lanes;
                if !self.output.is_null() {
                    arch::st_pack((self.output as *mut Pack16).add(k), v[u]);
                }
            });
            each_below!(FAN, s => {
                let d = self.send[s];
                if !d.is_null() {
                    each_unrolled!(u => {
                        arch::st_pack((d as *mut Pack16).add(at + u * lanes), v[u]);
                    });
                }
            });
            h += nwarps;
        }
        let mut i = nhunks * hunk + tid;
        while i < npacks {
            let mut v = Pack16::default();
            if has_input {
                v = arch::ld_pack(p(self.input, i));
                if O::HAS_PRE {
                    v = map1::<T>(v, |a| op.pre(a));
                }
            }
            let mut have = has_input;
            each_below!(FAN, k => {
                let r = self.recv[k];
                if !r.is_null() {
                    let x = arch::ld_pack(p(r, i));
                    v = if have {
                        map2::<T>(x, v, |a, b| op.reduce(a, b))
                    } else {
                        x
                    };
                    have = true;
                }
            });
            if O::HAS_POST && self.post {
                v = map1::<T>(v, |a| op.post(a));
            }
            if !self.output.is_null() {
                arch::st_pack((self.output as *mut Pack16).add(i), v);
            }
            each_below!(FAN, s => {
                let d = self.send[s];
                if !d.is_null() {
                    arch::st_pack((d as *mut Pack16).add(i), v);
                }
            });
            i += nthreads;
        }
        let mut e = npacks * pe + tid;
        while e < n {
            let mut v = T::default();
            if has_input {
                v = core::ptr::read_volatile(self.input.add(e));
                if O::HAS_PRE {
                    v = op.pre(v);
                }
            }
            let mut have = has_input;
            each_below!(FAN, k => {
                let r = self.recv[k];
                if !r.is_null() {
                    let x = core::ptr::read_volatile(r.add(e));
                    v = if have { op.reduce(x, v) } else { x };
                    have = true;
                }
            });
            if O::HAS_POST && self.post {
                v = op.post(v);
            }
            if !self.output.is_null() {
                core::ptr::write_volatile(self.output.add(e), v);
            }
            each_below!(FAN, s => {
                let d = self.send[s];
                if !d.is_null() {
                    core::ptr::write_volatile(d.add(e), v);
                }
            });
            e += nthreads;
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::ops::Sum;
    use std::{vec, vec::Vec};

    /// Runs the mover for every thread of a CTA in turn (it has no barriers inside) and checks
    /// that every element (in whole hunks, in the packs after them, in the tail) got its sum in
    /// both destinations, for CTAs of narrow, whole and partial warps: an element no thread
    /// took keeps its poison.
    #[test]
    fn threads_share_every_element() {
        for nthreads in [1, 8, 24, 32, 40, 64, 96, 512] {
            for n in [0usize, 3, 4, 127, 128, 129, 4 * 128 * 4 + 7, 5000] {
                // 16-byte aligned buffers with room for n u32s.
                let words = n.div_ceil(4) + 1;
                let a: Vec<Pack16> = (0..words)
                    .map(|k| Pack16(core::array::from_fn(|j| (4 * k + j) as u32)))
                    .collect();
                let b: Vec<Pack16> = (0..words).map(|_| Pack16([1000; 4])).collect();
                let mut out = vec![Pack16([u32::MAX; 4]); words];
                let mut send = vec![Pack16::default(); words];
                let mv = Move {
                    recv: a.as_ptr() as *const u32,
                    input: b.as_ptr() as *const u32,
                    output: out.as_mut_ptr() as *mut u32,
                    send: send.as_mut_ptr() as *mut u32,
                    post: false,
                };
                for tid in 0..nthreads {
                    // SAFETY: every pointer covers n elements.
                    unsafe { mv.run_inline(&Sum, n, tid, nthreads) };
                }
                let out = unsafe { core::slice::from_raw_parts(out.as_ptr() as *const u32, n) };
                let send = unsafe { core::slice::from_raw_parts(send.as_ptr() as *const u32, n) };
                for e in 0..n {
                    let want = e as u32 + 1000;
                    assert_eq!(
                        (out[e], send[e]),
                        (want, want),
                        "{nthreads} threads, n {n}, e {e}"
                    );
                }
            }
        }
    }

    /// The mover of several peers, run for every thread of a CTA in turn: every element of the
    /// output and of every send slot holds `pre(input)` plus every received value, with `post`
    /// when asked, for any set of peers, with and without input, on aligned buffers (hunks,
    /// packs, tail) and on buffers one element off (elements only). PreMulSum's `pre` must
    /// apply to the input alone and once; Avg's `post` once.
    #[test]
    fn fan_reduces_every_peer_once() {
        use crate::ops::{Avg, PreMulSum};
        for nthreads in [1, 24, 64, 96] {
            for n in [0usize, 5, 129, 4 * 128 * 4 + 7, 3000] {
                for off in [0usize, 1] {
                    for nrecv in 0..=FAN {
                        for with_input in [false, true] {
                            if nrecv == 0 && !with_input {
                                continue;
                            }
                            let nsend = (nrecv + n) % (FAN + 1);
                            fan_case(
                                nthreads,
                                n,
                                off,
                                nrecv,
                                with_input,
                                nsend,
                                PreMulSum::<u32>::new(3),
                            );
                            fan_case(
                                nthreads,
                                n,
                                off,
                                nrecv,
                                with_input,
                                nsend,
                                Avg::<u32>::new(4),
                            );
                        }
                    }
                }
            }
        }
    }

    fn fan_case<O: RedOp<u32>>(
        nthreads: usize,
        n: usize,
        off: usize,
        nrecv: usize,
        with_input: bool,
        nsend: usize,
        op: O,
    ) {
        // 16-byte aligned buffers with room for n + off u32s.
        let words = (n + off).div_ceil(4) + 1;
        let fill = |f: &dyn Fn(usize) -> u32| -> Vec<Pack16> {
            (0..words)
                .map(|k| Pack16(core::array::from_fn(|j| f(4 * k + j))))
                .collect()
        };
        let recvs: Vec<Vec<Pack16>> = (0..FAN)
            .map(|k| fill(&|e| (e * 7 + k * 1000 + 1) as u32))
            .collect();
        let input = fill(&|e| e as u32 + 5);
        let mut out = vec![Pack16([u32::MAX; 4]); words];
        let mut sends: Vec<Vec<Pack16>> = (0..FAN)
            .map(|_| vec![Pack16([u32::MAX; 4]); words])
            .collect();
        let at = |v: &Vec<Pack16>| unsafe { (v.as_ptr() as *const u32).add(off) };
        let at_mut = |v: &mut Vec<Pack16>| unsafe { (v.as_mut_ptr() as *mut u32).add(off) };
        let mut mv = Fan::<u32>::none();
        for (k, r) in recvs.iter().take(nrecv).enumerate() {
            mv.recv[k] = at(r);
        }
        if with_input {
            mv.input = at(&input);
        }
        mv.output = at_mut(&mut out);
        for (k, d) in sends.iter_mut().take(nsend).enumerate() {
            mv.send[k] = at_mut(d);
        }
        mv.post = true;
        for tid in 0..nthreads {
            // SAFETY: every pointer covers n elements.
            unsafe { mv.run_inline(&op, n, tid, nthreads) };
        }
        for e in 0..n {
            let i = e + off;
            let mut want = if with_input { op.pre(i as u32 + 5) } else { 0 };
            for k in 0..nrecv {
                want = want.wrapping_add((i * 7 + k * 1000 + 1) as u32);
            }
            let want = op.post(want);
            let got = unsafe { *at(&out).add(e) };
            assert_eq!(
                got, want,
                "output: {nthreads} threads, n {n}+{off}, {nrecv} recv, input {with_input}, e {e}"
            );
            for (k, s) in sends.iter().enumerate() {
                let got = unsafe { *at(s).add(e) };
                let want = if k < nsend { want } else { u32::MAX };
                assert_eq!(
                    got, want,
                    "send {k}: {nthreads} threads, n {n}+{off}, e {e}"
                );
            }
        }
    }
}
