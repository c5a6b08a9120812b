//! Protocol primitives: how a CTA moves one FIFO step of data between neighbours.
//!
//! A collective holds a [`Prims`] (its send and receive connections and their step counters)
//! and speaks in named steps ([`steps`]): `send`, `recv`, `recv_reduce_send`,
//! `recv_reduce_copy_send`, `recv_copy_send`, `recv_reduce_copy`, `copy_send`, each naming
//! where its data comes from and goes ([`Src`], [`Dst`]: a FIFO slot, or a peer's buffer on a
//! zero-copy connection). Under them, one engine per protocol carries a step: [`simple`], [`ll`]
//! and [`ll128`], chosen per launch at run time; [`copy`] is the data mover all of them use.
//! [`SimpleFan`] is the same for a step with several peers at once (a tree's children).

pub mod copy;
mod direct;
pub mod fan;
pub mod ll;
pub mod ll128;
mod packet;
pub mod simple;
pub mod steps;

pub use direct::{Offer, RingDirect};
pub use fan::SimpleFan;
pub use steps::{Dst, Src};

use crate::abi::{
    proxy_proto_word, stride_bytes, ChannelDev, ConnRecv, ConnSend, FLAG_SIMPLE_PUBLISHER,
    NCCL_STEPS, PROTO_SIMPLE,
};
use crate::arch;

/// A send connection and a receive connection (either may be absent: null), with the step
/// counters this CTA advances.
pub struct Prims {
    pub(super) send: *mut ConnSend,
    pub(super) recv: *mut ConnRecv,
    send_slot_bytes: usize,
    recv_slot_bytes: usize,
    pub(super) send_step: u64,
    pub(super) recv_step: u64,
    /// This thread's index in its group and the group's size (the whole CTA unless
    /// [`Prims::group`] said otherwise).
    pub(super) tid: usize,
    pub(super) nthreads: usize,
    /// The group's named barrier (0: the CTA's `bar.sync 0`).
    bar: u32,
    /// The protocol the steps use (`PROTO_*`): a runtime choice, so one kernel serves all three.
    pub(super) proto: u32,
    /// The communicator's abort flag (null: none), polled while waiting.
    abort: *const u64,
    /// This thread saw the abort flag: it waits no more, so the kernel runs to its end.
    aborted: bool,
    /// FIFO slots one Prims step fills at once (NCCL's slice steps; 1 unless
    /// [`Prims::with_slice`] said otherwise).
    slice: u64,
    /// Steps move data with [`copy::Move::run_inline`] rather than the shared [`copy::Move::run`]
    /// ([`Prims::with_inline_moves`]).
    inline: bool,
    /// Prims steps may leave a publishing warp out of the data ([`Prims::with_flags`]).
    publisher: bool,
    /// The last tail and head values thread 0 acquired: counters only grow, so a value that
    /// already covers a step spares the poll (and its round trip) for that step.
    tail_seen: u64,
    pub(super) head_seen: u64,
    /// The receive steps below this were announced to a proxy at once
    /// ([`Prims::promise_recv`]): their steps need no word of their own.
    promised: u64,
}

/// Before waiting for the steps below `end` of receive connection `rc`: where a proxy fills
/// its FIFO, tells it that they carry protocol `proto` (`PROTO_*`), so that it flushes only
/// the Prims steps of a GPU-memory FIFO ([`ConnRecv::proxy_proto`]). A direct connection has
/// no such word. One thread calls it.
///
/// # Safety
/// `rc` points at a connection wired by the host.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
pub(super) unsafe fn announce_recv(rc: *const ConnRecv, end: u64, proto: u32) {
    let at = (*rc).proxy_proto as *mut u64;
    if !at.is_null() {
        // A plain store: the proxy only reads it, and what it unblocks (the tail) is acquired
        // by the wait that follows.
        arch::st_volatile(at, proxy_proto_word(end, proto));
    }
}

/// The FIFO slots a Prims step fills when asked for `steps`: the largest power of two not
/// above it (so it divides NCCL_STEPS), from 1 to half the FIFO.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
pub fn slice_steps(steps: u32) -> u32 {
    1 << steps.clamp(1, NCCL_STEPS / 2).ilog2()
}

/// Spins between two looks at the abort flag (it lives in host memory: a look costs a trip
/// over PCIe, the spins only local polls).
const ABORT_POLL: u32 = 1024;

impl Prims {
    /// The ring connections of a channel.
    ///
    /// # Safety
    /// `ch` points at this CTA's channel in device memory, wired by the host.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn new(ch: *mut ChannelDev, slot_bytes: u32) -> Prims {
        Prims::on(&mut (*ch).send, &mut (*ch).recv, slot_bytes)
    }

    /// Any pair of connections; a null one is never touched.
    ///
    /// # Safety
    /// Non-null pointers point at connections in device memory, wired by the host.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn on(send: *mut ConnSend, recv: *mut ConnRecv, slot_bytes: u32) -> Prims {
        Prims::between(send, slot_bytes, recv, slot_bytes)
    }

    /// Like [`Prims::on`], for connections whose FIFO slots differ in size.
    ///
    /// # Safety
    /// As [`Prims::on`].
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn between(
        send: *mut ConnSend,
        send_slot_bytes: u32,
        recv: *mut ConnRecv,
        recv_slot_bytes: u32,
    ) -> Prims {
        Prims {
            send,
            recv,
            // A proxied connection spaces its slots by its own stride (abi::ConnSend).
            send_slot_bytes: match send.as_ref() {
                Some(c) if c.proxy_stride != 0 => stride_bytes(c.proxy_stride) as usize,
                _ => send_slot_bytes as usize,
            },
            recv_slot_bytes: match recv.as_ref() {
                Some(c) if c.proxy_stride != 0 => stride_bytes(c.proxy_stride) as usize,
                _ => recv_slot_bytes as usize,
            },
            send_step: if send.is_null() { 0 } else { (*send).step },
            recv_step: if recv.is_null() { 0 } else { (*recv).step },
            tid: arch::thread_idx() as usize,
            nthreads: arch::block_dim() as usize,
            bar: 0,
            proto: PROTO_SIMPLE,
            abort: core::ptr::null(),
            aborted: false,
            slice: 1,
            inline: false,
            publisher: false,
            tail_seen: if recv.is_null() { 0 } else { (*recv).tail_seen },
            head_seen: if send.is_null() { 0 } else { (*send).head_seen },
            promised: 0,
        }
    }

    /// Runs the steps on threads `first..first + count` of the CTA alone, which meet at named
    /// barrier `bar` (1..=7, each group its own, and `bar` + 8 is its workers'; on GPUs `count`
    /// is whole warps): two groups then move two streams of steps at once.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub fn group(mut self, first: usize, count: usize, bar: u32) -> Prims {
        self.tid = arch::thread_idx() as usize - first;
        self.nthreads = count;
        self.bar = bar;
        self
    }

    /// Every thread of the group meets here.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub(super) fn sync(&self) {
        if self.bar == 0 {
            arch::sync_threads();
        } else {
            arch::barrier_named(self.bar, self.nthreads as u32);
        }
    }

    /// Takes the launch's `FLAG_*` bits ([`crate::abi::CollArgs::flags`]).
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub fn with_flags(mut self, flags: u32) -> Prims {
        self.publisher = flags & FLAG_SIMPLE_PUBLISHER != 0;
        self
    }

    /// Gives up waiting once the u64 at `flag` (host-mapped; null: never) is non-zero.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub fn with_abort(mut self, flag: u64) -> Prims {
        self.abort = flag as *const u64;
        self
    }

    /// Spins until `ready()`, or until the abort flag is raised (then never waits again).
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub(super) unsafe fn wait(&mut self, mut ready: impl FnMut() -> bool) {
        let mut spins = 0u32;
        while !self.aborted && !ready() {
            arch::spin_pause();
            spins += 1;
            if spins == ABORT_POLL {
                spins = 0;
                self.aborted = !self.abort.is_null() && arch::ld_volatile(self.abort) != 0;
            }
        }
    }

    /// Carries the following steps with protocol `proto` (`PROTO_*`). Every thread of the CTA
    /// makes the same choice; the connections must have the protocol's FIFOs.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub fn with_proto(mut self, proto: u32) -> Prims {
        self.proto = proto;
        self
    }

    /// Lets each Prims step fill `steps` consecutive FIFO slots (1, 2 or 4: a divisor of
    /// NCCL_STEPS, else a slice could run past the FIFO's end; others round down), so a step
    /// moves `steps` slots' worth of data for one wait and one publish. Both ends of every
    /// connection must use the same value for an operation: each rounds its step counters up
    /// to a multiple of `steps` (the counters are equal at both ends, so they stay equal, and a
    /// step never straddles the end of the FIFO). Call it after [`Prims::with_proto`]; LL and
    /// LL128 steps ignore it.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub fn with_slice(mut self, steps: u32) -> Prims {
        let steps = slice_steps(steps) as u64;
        if self.proto == PROTO_SIMPLE && steps > 1 {
            self.slice = steps;
            self.send_step = self.send_step.next_multiple_of(steps);
            self.recv_step = self.recv_step.next_multiple_of(steps);
        }
        self
    }

    /// Moves each step's data with code inlined here instead of a call to the one body per
    /// (type, reduction): for kernels with few call sites (send/recv), where the shared body
    /// measured slower ([`copy::Move::run_inline`]).
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub fn with_inline_moves(mut self) -> Prims {
        self.inline = true;
        self
    }

    /// Like [`Prims::wait`], for the lanes `mask` of a warp polling together: `ready` is this
    /// lane's view, and they go on once every lane is ready (or the abort flag was seen).
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub(super) unsafe fn warp_wait(&mut self, mask: u32, mut ready: impl FnMut() -> bool) {
        let mut spins = 0u32;
        loop {
            let ok = ready();
            if arch::vote_all(mask, ok || self.aborted) {
                return;
            }
            arch::spin_pause();
            spins += 1;
            if spins == ABORT_POLL {
                spins = 0;
                let raised = !self.abort.is_null() && arch::ld_volatile(self.abort) != 0;
                self.aborted = arch::vote_any(mask, raised);
            }
        }
    }

    /// Tells a proxy that fills the receive connection that this CTA will read its next
    /// `steps` steps (Prims): it may then post their receives together with other
    /// connections' (grouped receives, `maxRecvs`), knowing they will come. Every thread of the
    /// group calls it; thread 0 writes.
    ///
    /// # Safety
    /// As [`Prims::on`].
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn promise_recv(&mut self, steps: u64) {
        if self.recv.is_null() || self.proto != PROTO_SIMPLE {
            return;
        }
        let end = self.recv_step + steps;
        if self.tid == 0 {
            announce_recv(self.recv, end, PROTO_SIMPLE);
        }
        self.promised = end;
    }

    /// Saves the step counters for the next launch on this channel.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn finish(self) {
        if self.tid == 0 {
            if !self.send.is_null() {
                (*self.send).step = self.send_step;
                (*self.send).head_seen = self.head_seen;
            }
            if !self.recv.is_null() {
                (*self.recv).step = self.recv_step;
                (*self.recv).tail_seen = self.tail_seen;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::slice_steps;

    #[test]
    fn slices_divide_the_fifo() {
        let got: [u32; 7] = [0, 1, 2, 3, 4, 5, 9].map(slice_steps);
        assert_eq!(got, [1, 1, 2, 2, 4, 4, 4]);
    }
}
