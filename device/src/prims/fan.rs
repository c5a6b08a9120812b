//! Simple steps with several peers at once: a step receives one FIFO slot from each of up to
//! [`FAN`] receive connections, reduces them with this rank's input, and writes the result to
//! this rank's output and to one FIFO slot of each of up to [`FAN`] send connections, in one
//! pass over the data ([`Fan`]). A tree rank with three children so reduces a chunk in one
//! step and broadcasts it in one step, where one-peer steps ([`super::Prims`]) took one per
//! child.
//!
//! The step model is Simple's, per connection: a receive slot is ready once the sender's
//! `tail` covers the step, a send slot is free once the receiver's `head` is within
//! NCCL_STEPS of it; after the data, the CTA meets and one thread publishes every send
//! connection's `tail` (and the step's size, to a proxy) and every receive connection's
//! `head` with system-scope releases. Each connection keeps its own step counter, saved for
//! the next launch. Every connection given takes part in every step.
//!
//! Simple only, one FIFO slot per step (no slices), and every thread moves data: the publishing
//! warp of `FLAG_SIMPLE_PUBLISHER` ([`super::simple`]) is not used here.

use crate::abi::{
    stride_bytes, ConnRecv, ConnSend, DIRECT_DECLINE, DIRECT_OFF, NCCL_STEPS, PROTO_SIMPLE,
};
use crate::arch;
use crate::ops::RedOp;
use crate::prims::announce_recv;
use crate::prims::copy::{Fan, FAN};
use crate::prims::direct::{
    answer_tag, link_answer, link_destination, link_direct, link_offer, offer_tag, Offer,
};
use crate::types::Elem;

/// Spins between two looks at the abort flag (as [`super::Prims`]'s waits).
const ABORT_POLL: u32 = 1024;

/// Up to [`FAN`] receive and [`FAN`] send connections (null: absent) and their step counters.
pub struct SimpleFan {
    recv: [*mut ConnRecv; FAN],
    send: [*mut ConnSend; FAN],
    recv_slot_bytes: [usize; FAN],
    send_slot_bytes: [usize; FAN],
    recv_step: [u64; FAN],
    send_step: [u64; FAN],
    /// The last `tail` (receive) and `head` (send) value thread 0 acquired per connection:
    /// counters only grow, so one that already covers a step spares its poll.
    tail_seen: [u64; FAN],
    head_seen: [u64; FAN],
    /// This thread's index in its group, the group's size and named barrier (0: the CTA).
    tid: usize,
    nthreads: usize,
    bar: u32,
    /// The communicator's abort flag (null: none), polled while waiting.
    abort: *const u64,
    /// This thread saw the abort flag: it waits no more, so the kernel runs to its end.
    aborted: bool,
    /// Zero-copy ([`SimpleFan::tree_handshake`]), per connection: where the peer writes into
    /// our output (its start; 0: the FIFO), and where we write into the peer's.
    recv_here: [u64; FAN],
    send_to: [u64; FAN],
}

impl SimpleFan {
    /// Steps over the non-null connections of `recv` and `send`, whose FIFO slots hold
    /// `slot_bytes` (a proxied connection spaces them by its own stride).
    ///
    /// # Safety
    /// Non-null pointers point at connections in device memory, wired by the host.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn new(
        recv: [*mut ConnRecv; FAN],
        send: [*mut ConnSend; FAN],
        slot_bytes: u32,
    ) -> SimpleFan {
        let mut f = SimpleFan {
            recv,
            send,
            recv_slot_bytes: [slot_bytes as usize; FAN],
            send_slot_bytes: [slot_bytes as usize; FAN],
            recv_step: [0; FAN],
            send_step: [0; FAN],
            tail_seen: [0; FAN],
            head_seen: [0; FAN],
            tid: arch::thread_idx() as usize,
            nthreads: arch::block_dim() as usize,
            bar: 0,
            abort: core::ptr::null(),
            aborted: false,
            recv_here: [0; FAN],
            send_to: [0; FAN],
        };
        for i in 0..FAN {
            if let Some(c) = recv[i].as_ref() {
                f.recv_step[i] = c.step;
                if c.proxy_stride != 0 {
                    f.recv_slot_bytes[i] = stride_bytes(c.proxy_stride) as usize;
                }
            }
            if let Some(c) = send[i].as_ref() {
                f.send_step[i] = c.step;
                if c.proxy_stride != 0 {
                    f.send_slot_bytes[i] = stride_bytes(c.proxy_stride) as usize;
                }
            }
        }
        f
    }

    /// Runs the steps on threads `first..first + count` of the CTA alone, which meet at named
    /// barrier `bar` (1..=7; on GPUs `count` is whole warps), as [`super::Prims::group`].
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub fn group(mut self, first: usize, count: usize, bar: u32) -> SimpleFan {
        self.tid = arch::thread_idx() as usize - first;
        self.nthreads = count;
        self.bar = bar;
        self
    }

    /// Gives up waiting once the u64 at `flag` (host-mapped; null: never) is non-zero.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub fn with_abort(mut self, flag: u64) -> SimpleFan {
        self.abort = flag as *const u64;
        self
    }

    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn sync(&self) {
        if self.bar == 0 {
            arch::sync_threads();
        } else {
            arch::barrier_named(self.bar, self.nthreads as u32);
        }
    }

    /// Spins until the u64 at `counter` reaches `need` (acquire, system scope), or until the
    /// abort flag is raised; returns the last value read.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn wait(&mut self, counter: *const u64, need: u64) -> u64 {
        let mut spins = 0u32;
        loop {
            let seen = arch::ld_acquire_sys(counter);
            if seen >= need || self.aborted {
                return seen;
            }
            arch::spin_pause();
            spins += 1;
            if spins == ABORT_POLL {
                spins = 0;
                self.aborted = !self.abort.is_null() && arch::ld_volatile(self.abort) != 0;
            }
        }
    }

    /// The zero-copy handshake of a tree's links ([`super::Prims::tree_handshake`]'s, over several
    /// connections at once), before the first step: on every receive connection `i` with
    /// `recv_on[i]` we offer our output (`offer`; or decline: not `registered`, or `offer` is
    /// [`DIRECT_DECLINE`]); on every send connection `i` whose `send_reach[i]` is not
    /// [`DIRECT_OFF`] we take the peer's offer of a `bytes`-long buffer if we registered and can
    /// reach it. Every offer is posted before any wait, every answer after the offer it
    /// answers, so no wait depends on itself. The steps then read a direct receive from our
    /// output and write a direct send into the peer's, at the step's place (`at`), with the
    /// counters as through the FIFO. Returns how many receive connections went direct.
    ///
    /// # Safety
    /// Every thread of the group calls it alike; both ends of each connection run it for the
    /// same collective, with `recv_on` at one end equal to `send_reach != DIRECT_OFF` at the
    /// other (p2p connections only), and take a step on it at least.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn tree_handshake(
        &mut self,
        recv_on: [bool; FAN],
        send_reach: [u64; FAN],
        registered: bool,
        offer: Offer,
        bytes: u64,
    ) -> u64 {
        let offering = registered && offer.addr != DIRECT_DECLINE;
        let recv_on: [bool; FAN] = core::array::from_fn(|i| recv_on[i] && !self.recv[i].is_null());
        let send_on: [bool; FAN] =
            core::array::from_fn(|i| send_reach[i] != DIRECT_OFF && !self.send[i].is_null());
        if self.tid == 0 {
            let o = if offering { offer } else { Offer::DECLINE };
            for (i, _) in recv_on.iter().enumerate().filter(|(_, &on)| on) {
                link_offer(self.recv[i], self.recv_step[i] + 1, o);
            }
            for (i, _) in send_on.iter().enumerate().filter(|(_, &on)| on) {
                let tag = self.send_step[i] + 1;
                self.wait(offer_tag(self.send[i]), tag);
                link_answer(self.send[i], tag, send_reach[i], registered, bytes);
            }
            for (i, _) in recv_on.iter().enumerate().filter(|(_, &on)| on && offering) {
                self.wait(answer_tag(self.recv[i]), self.recv_step[i] + 1);
            }
        }
        self.sync();
        let mut direct = 0;
        for i in 0..FAN {
            if send_on[i] {
                self.send_to[i] = link_destination(self.send[i]);
            }
            if recv_on[i] && offering && link_direct(self.recv[i], self.recv_step[i] + 1) {
                self.recv_here[i] = offer.addr;
                direct += 1;
            }
        }
        direct
    }

    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn slot(fifo: u64, step: u64, slot_bytes: usize) -> u64 {
        fifo + (step % NCCL_STEPS as u64) * slot_bytes as u64
    }

    /// Receives from every receive connection, reduces what arrived with `src` (`pre`
    /// applied), stores the final value (`post` applied) in `dst` and sends it on every send
    /// connection: a tree's root. `n` elements at element `at` of the buffers.
    ///
    /// # Safety
    /// `src` and `dst` hold `at + n` elements; the connections were wired by the host.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn recv_reduce_copy_send<T: Elem, O: RedOp<T>>(
        &mut self,
        op: &O,
        src: *const T,
        dst: *mut T,
        at: usize,
        n: usize,
    ) {
        self.step(op, src, dst, true, at, n)
    }

    /// Receives from every receive connection (none: a leaf), reduces with `src`, sends the
    /// sum on: a tree's way up.
    ///
    /// # Safety
    /// As [`SimpleFan::recv_reduce_copy_send`].
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn recv_reduce_send<T: Elem, O: RedOp<T>>(
        &mut self,
        op: &O,
        src: *const T,
        at: usize,
        n: usize,
    ) {
        self.step(op, src, core::ptr::null_mut(), false, at, n)
    }

    /// Receives a finished block, stores it in `dst` (null: it landed there already, through
    /// a direct connection) and sends it on every send connection: a tree's way down.
    ///
    /// # Safety
    /// As [`SimpleFan::recv_reduce_copy_send`].
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn recv_copy_send<T: Elem, O: RedOp<T>>(
        &mut self,
        op: &O,
        dst: *mut T,
        at: usize,
        n: usize,
    ) {
        self.step(op, core::ptr::null(), dst, false, at, n)
    }

    /// One step over every connection: waits for each receive slot and each free send slot,
    /// reduces the received slots with `input` (null: none; the operator's `pre` applies to
    /// it) into `output` (null: none) and every send slot, applying `post` when asked, and
    /// publishes. `n` elements (at most a slot's worth) at element `at` of the buffers: a
    /// connection that went direct ([`SimpleFan::tree_handshake`]) reads from our output or
    /// writes into the peer's there instead of a slot. Every thread of the group calls it with
    /// the same arguments.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn step<T: Elem, O: RedOp<T>>(
        &mut self,
        op: &O,
        input: *const T,
        output: *mut T,
        post: bool,
        at: usize,
        n: usize,
    ) {
        if self.tid == 0 {
            // Every proxy that fills a receive connection hears of the step before any wait,
            // so that none holds a landed step while we wait on another connection.
            for i in 0..FAN {
                if !self.recv[i].is_null() && self.tail_seen[i] <= self.recv_step[i] {
                    announce_recv(self.recv[i], self.recv_step[i] + 1, PROTO_SIMPLE);
                }
            }
            for i in 0..FAN {
                let need = self.recv_step[i] + 1;
                if !self.recv[i].is_null() && self.tail_seen[i] < need {
                    self.tail_seen[i] = self.wait((*self.recv[i]).tail as *const u64, need);
                }
                // The peer consumed up to `head`: our next slot is free once it is within
                // NCCL_STEPS of the step.
                let need = (self.send_step[i] + 1).saturating_sub(NCCL_STEPS as u64);
                if !self.send[i].is_null() && self.head_seen[i] < need {
                    self.head_seen[i] = self.wait((*self.send[i]).head as *const u64, need);
                }
            }
        }
        self.sync();
        let mut mv = Fan {
            input,
            output,
            post,
            ..Fan::none()
        };
        let size = core::mem::size_of::<T>() as u64;
        for i in 0..FAN {
            if let Some(c) = self.recv[i].as_ref() {
                mv.recv[i] = match self.recv_here[i] {
                    0 => Self::slot(c.fifo, self.recv_step[i], self.recv_slot_bytes[i]),
                    here => here + at as u64 * size,
                } as _;
            }
            if let Some(c) = self.send[i].as_ref() {
                mv.send[i] = match self.send_to[i] {
                    0 => Self::slot(c.fifo, self.send_step[i], self.send_slot_bytes[i]),
                    to => to + at as u64 * size,
                } as _;
            }
        }
        mv.run_then_meet(
            *op,
            n,
            self.tid,
            self.nthreads,
            self.bar,
            self.nthreads as u32,
        );
        if self.tid == 0 {
            let bytes = (n * core::mem::size_of::<T>()) as u64;
            for i in 0..FAN {
                if let Some(c) = self.send[i].as_ref() {
                    let sizes = c.proxy_sizes as *mut u64;
                    if !sizes.is_null() {
                        // A proxy sends the slot: its byte count, ordered before the tail by
                        // the release below.
                        let at = self.send_step[i] % NCCL_STEPS as u64;
                        arch::st_volatile(sizes.add(at as usize), bytes);
                    }
                    arch::st_release_sys(c.tail as *mut u64, self.send_step[i] + 1);
                }
                if let Some(c) = self.recv[i].as_ref() {
                    arch::st_release_sys(c.head as *mut u64, self.recv_step[i] + 1);
                }
            }
        }
        for i in 0..FAN {
            self.send_step[i] += 1;
            self.recv_step[i] += 1;
        }
    }

    /// Saves the step counters for the next launch on these connections.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn finish(self) {
        if self.tid == 0 {
            for i in 0..FAN {
                if let Some(c) = self.send[i].as_mut() {
                    c.step = self.send_step[i];
                }
                if let Some(c) = self.recv[i].as_mut() {
                    c.step = self.recv_step[i];
                }
            }
        }
    }
}
