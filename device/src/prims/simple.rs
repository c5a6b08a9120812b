//! The Simple protocol: a step's data goes into a FIFO slot with ordinary stores; the CTA then
//! synchronises, and one thread publishes the step with a system-scope release on the peer's
//! tail counter. The receiver's acquire of that counter makes the whole slot visible. Flow
//! control runs the other way: the receiver releases `head` once it has consumed a slot, and a
//! sender never runs more than NCCL_STEPS slots ahead of it. The same struct carries LL and
//! LL128 steps when asked ([`Simple::with_proto`], [`super::ll`], [`super::ll128`]).
//!
//! With [`FLAG_SIMPLE_PUBLISHER`], a group of three warps or more leaves its last warp out of
//! the data of the steps that send (as NCCL's Simple primitives do): that warp only publishes.
//! The release waits until the step's stores have landed (over NVLink, a round trip), and the
//! workers meanwhile move the next step instead of waiting for it at the next step's barrier.
//! Off by default until 4xH200 measures it: in the kernel lab (no NVLink) busbw moved by -1.6
//! to +1.4% at 64 and 256 MiB (results/h200-lab-simple-publisher.txt).

use crate::abi::{
    proxy_proto_word, stride_bytes, ChannelDev, ConnRecv, ConnSend, FLAG_SIMPLE_PUBLISHER,
    NCCL_STEPS, PROTO_LL, PROTO_LL128, PROTO_SIMPLE,
};
use crate::arch;
use crate::ops::RedOp;
use crate::prims::copy::Move;
use crate::types::Elem;

/// A send connection and a receive connection (either may be absent: null), with the step
/// counters this CTA advances.
pub struct Simple {
    pub(super) send: *mut ConnSend,
    pub(super) recv: *mut ConnRecv,
    send_slot_bytes: usize,
    recv_slot_bytes: usize,
    pub(super) send_step: u64,
    pub(super) recv_step: u64,
    /// This thread's index in its group and the group's size (the whole CTA unless
    /// [`Simple::group`] said otherwise).
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
    /// FIFO slots one Simple step fills at once (NCCL's slice steps; 1 unless
    /// [`Simple::with_slice`] said otherwise).
    slice: u64,
    /// Steps move data with [`Move::run_inline`] rather than the shared [`Move::run`]
    /// ([`Simple::with_inline_moves`]).
    inline: bool,
    /// Simple steps may leave a publishing warp out of the data ([`Simple::with_flags`]).
    publisher: bool,
    /// The last tail and head values thread 0 acquired: counters only grow, so a value that
    /// already covers a step spares the poll (and its round trip) for that step.
    tail_seen: u64,
    pub(super) head_seen: u64,
    /// The receive steps below this were announced to a proxy at once
    /// ([`Simple::promise_recv`]): their steps need no word of their own.
    promised: u64,
}

/// Before waiting for the steps below `end` of receive connection `rc`: where a proxy fills
/// its FIFO, tells it that they carry protocol `proto` (`PROTO_*`), so that it flushes only
/// the Simple steps of a GPU-memory FIFO ([`ConnRecv::proxy_proto`]). A direct connection has
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

/// The FIFO slots a Simple step fills when asked for `steps`: the largest power of two not
/// above it (so it divides NCCL_STEPS), from 1 to half the FIFO.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
pub fn slice_steps(steps: u32) -> u32 {
    1 << steps.clamp(1, NCCL_STEPS / 2).ilog2()
}

/// Threads of the publishing group that a Simple step leaves out of the data: a warp on GPUs;
/// on the simulator one thread (its CTAs are a few threads), so its tests take this path too.
const POSTERS: usize = if cfg!(target_arch = "nvptx64") { 32 } else { 1 };

/// The named barrier where the workers of a group meet apart from its publisher: group `bar`'s
/// plus 8 (groups use 1..=7; the whole CTA's, 0, uses 15).
#[cfg_attr(target_arch = "nvptx64", inline(always))]
fn worker_barrier(bar: u32) -> u32 {
    if bar == 0 {
        15
    } else {
        bar + 8
    }
}

/// Spins between two looks at the abort flag (it lives in host memory: a look costs a trip
/// over PCIe, the spins only local polls).
const ABORT_POLL: u32 = 1024;

impl Simple {
    /// The ring connections of a channel.
    ///
    /// # Safety
    /// `ch` points at this CTA's channel in device memory, wired by the host.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn new(ch: *mut ChannelDev, slot_bytes: u32) -> Simple {
        Simple::on(&mut (*ch).send, &mut (*ch).recv, slot_bytes)
    }

    /// Any pair of connections; a null one is never touched.
    ///
    /// # Safety
    /// Non-null pointers point at connections in device memory, wired by the host.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn on(send: *mut ConnSend, recv: *mut ConnRecv, slot_bytes: u32) -> Simple {
        Simple::between(send, slot_bytes, recv, slot_bytes)
    }

    /// Like [`Simple::on`], for connections whose FIFO slots differ in size.
    ///
    /// # Safety
    /// As [`Simple::on`].
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn between(
        send: *mut ConnSend,
        send_slot_bytes: u32,
        recv: *mut ConnRecv,
        recv_slot_bytes: u32,
    ) -> Simple {
        Simple {
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
    pub fn group(mut self, first: usize, count: usize, bar: u32) -> Simple {
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
    pub fn with_flags(mut self, flags: u32) -> Simple {
        self.publisher = flags & FLAG_SIMPLE_PUBLISHER != 0;
        self
    }

    /// Threads of the group that move a Simple step's data: with a publisher, all but its warp
    /// when the step sends (the release of its tail waits for the stores to the peer; a head
    /// release after loads alone is short) and the group has three warps or more; else all
    /// (then thread 0 also publishes). Every thread of the group decides alike for each step.
    /// Only Simple steps ask (LL and LL128 steps meet and publish their own way).
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn workers(&self, send: bool) -> usize {
        if self.publisher && send && self.nthreads >= 3 * POSTERS {
            self.nthreads - POSTERS
        } else {
            self.nthreads
        }
    }

    /// The workers meet here, without the publisher ([`Simple::workers`] threads).
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn sync_workers(&self, workers: usize) {
        if workers == self.nthreads {
            self.sync();
        } else {
            arch::barrier_named(worker_barrier(self.bar), workers as u32);
        }
    }

    /// Publishes a finished step: its data to the next rank (tail), its slot back to the
    /// previous one (head).
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn publish(&self, recv: bool, send: bool, bytes: usize) {
        if send {
            let sizes = (*self.send).proxy_sizes as *mut u64;
            if !sizes.is_null() {
                // A proxy sends each slot of the step: tell it how many bytes each holds
                // (ordered before the tail by the release below).
                for k in 0..self.slice {
                    let at = (self.send_step + k) % NCCL_STEPS as u64;
                    let done = k as usize * self.send_slot_bytes;
                    let len = bytes.saturating_sub(done).min(self.send_slot_bytes);
                    arch::st_volatile(sizes.add(at as usize), len as u64);
                }
            }
            arch::st_release_sys((*self.send).tail as *mut u64, self.send_step + self.slice);
        }
        if recv {
            arch::st_release_sys((*self.recv).head as *mut u64, self.recv_step + self.slice);
        }
    }

    /// Moves both step counters past a finished step.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn advance(&mut self, recv: bool, send: bool) {
        if send {
            self.send_step += self.slice;
        }
        if recv {
            self.recv_step += self.slice;
        }
    }

    /// Gives up waiting once the u64 at `flag` (host-mapped; null: never) is non-zero.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub fn with_abort(mut self, flag: u64) -> Simple {
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
    pub fn with_proto(mut self, proto: u32) -> Simple {
        self.proto = proto;
        self
    }

    /// Lets each Simple step fill `steps` consecutive FIFO slots (1, 2 or 4: a divisor of
    /// NCCL_STEPS, else a slice could run past the FIFO's end; others round down), so a step
    /// moves `steps` slots' worth of data for one wait and one publish. Both ends of every
    /// connection must use the same value for an operation: each rounds its step counters up
    /// to a multiple of `steps` (the counters are equal at both ends, so they stay equal, and a
    /// step never straddles the end of the FIFO). Call it after [`Simple::with_proto`]; LL and
    /// LL128 steps ignore it.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub fn with_slice(mut self, steps: u32) -> Simple {
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
    /// measured slower ([`Move::run_inline`]).
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub fn with_inline_moves(mut self) -> Simple {
        self.inline = true;
        self
    }

    /// Like [`Simple::wait`], for the lanes `mask` of a warp polling together: `ready` is this
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

    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn slot(fifo: u64, step: u64, slot_bytes: usize) -> u64 {
        fifo + (step % NCCL_STEPS as u64) * slot_bytes as u64
    }

    /// One step: waits for the receive slot and a free send slot, moves the data, publishes.
    /// Every thread of the CTA calls it with the same arguments; `recv`/`send` say which
    /// connections take part, `mv` carries only the user-buffer pointers.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn step<T: Elem, O: RedOp<T>>(
        &mut self,
        op: &O,
        recv: bool,
        send: bool,
        mv: Move<T>,
        n: usize,
    ) {
        self.step_to(op, recv, send, mv, n, false, core::ptr::null_mut())
    }

    /// [`Simple::step`] on connections that agreed on zero-copy for this operation (Simple
    /// only; see [`Simple::ring_handshake`]). With `recv_direct`, the peer already wrote the
    /// step's data into our buffer: no FIFO slot is read, and `mv.recv` names where the data
    /// lies (null: nothing to pass on, so nothing moves). With a non-null `send_to`, the data
    /// goes there (the successor's buffer) instead of a FIFO slot. The counters, waits and publishes are a FIFO step's, so
    /// flow control and the step counts stay as they were at both ends.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn step_to<T: Elem, O: RedOp<T>>(
        &mut self,
        op: &O,
        recv: bool,
        send: bool,
        mut mv: Move<T>,
        n: usize,
        recv_direct: bool,
        send_to: *mut T,
    ) {
        match self.proto {
            PROTO_LL => return self.step_ll(op, recv, send, mv, n),
            PROTO_LL128 => return self.step_ll128(op, recv, send, mv, n),
            _ => {}
        }
        let (sc, rc) = (self.send, self.recv);
        let slice = self.slice;
        let workers = self.workers(send);
        if self.tid >= workers {
            // The publisher: once the workers are past a step's data, it publishes the step
            // while they go on with the next.
            self.sync();
            if self.tid == workers {
                self.publish(recv, send, n * core::mem::size_of::<T>());
            }
            self.advance(recv, send);
            return;
        }
        if self.tid == 0 {
            if recv && self.tail_seen < self.recv_step + slice {
                let (tail, need) = ((*rc).tail as *const u64, self.recv_step + slice);
                if need > self.promised {
                    announce_recv(rc, need, PROTO_SIMPLE);
                }
                let mut seen = self.tail_seen;
                self.wait(|| {
                    seen = arch::ld_acquire_sys(tail);
                    seen >= need
                });
                self.tail_seen = seen;
            }
            // A free slot for every step of the slice: the peer consumed up to `head`.
            let need = (self.send_step + slice).saturating_sub(NCCL_STEPS as u64);
            if send && self.head_seen < need {
                let head = (*sc).head as *const u64;
                let mut seen = self.head_seen;
                self.wait(|| {
                    seen = arch::ld_acquire_sys(head);
                    seen >= need
                });
                self.head_seen = seen;
            }
        }
        self.sync_workers(workers);
        if recv && !recv_direct {
            mv.recv = Simple::slot((*rc).fifo, self.recv_step, self.recv_slot_bytes) as *const T;
        }
        if send {
            mv.send = if send_to.is_null() {
                Simple::slot((*sc).fifo, self.send_step, self.send_slot_bytes) as *mut T
            } else {
                send_to
            };
        }
        // A direct receive with nothing to pass on or store has no data to move.
        let moved = if mv.output.is_null() && mv.send.is_null() {
            0
        } else {
            n
        };
        // With a publisher, the barrier after the data hands it the step; without, thread 0
        // publishes.
        if self.inline {
            mv.run_inline(op, moved, self.tid, workers);
            self.sync();
        } else {
            mv.run_then_meet(
                *op,
                moved,
                self.tid,
                workers,
                self.bar,
                self.nthreads as u32,
            );
        }
        if workers == self.nthreads && self.tid == 0 {
            self.publish(recv, send, n * core::mem::size_of::<T>());
        }
        self.advance(recv, send);
    }

    /// Tells a proxy that fills the receive connection that this CTA will read its next
    /// `steps` steps (Simple): it may then post their receives together with other
    /// connections' (grouped receives, `maxRecvs`), knowing they will come. Every thread of the
    /// group calls it; thread 0 writes.
    ///
    /// # Safety
    /// As [`Simple::on`].
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
