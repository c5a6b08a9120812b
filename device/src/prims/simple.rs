//! The Simple protocol: a step's data goes into a FIFO slot with ordinary stores; the CTA then
//! synchronises, and one thread publishes the step with a system-scope release on the peer's
//! tail counter. The receiver's acquire of that counter makes the whole slot visible. Flow
//! control runs the other way: the receiver releases `head` once it has consumed a slot, and a
//! sender never runs more than NCCL_STEPS slots ahead of it. [`Prims`] carries LL and LL128
//! steps when asked instead ([`Prims::with_proto`], [`super::ll`], [`super::ll128`]).
//!
//! With [`crate::abi::FLAG_SIMPLE_PUBLISHER`], a group of three warps or more leaves its last warp out of
//! the data of the steps that send (as NCCL's Simple primitives do): that warp only publishes.
//! The release waits until the step's stores have landed (over NVLink, a round trip), and the
//! workers meanwhile move the next step instead of waiting for it at the next step's barrier.
//! Off by default until 4xH200 measures it: in the kernel lab (no NVLink) busbw moved by -1.6
//! to +1.4% at 64 and 256 MiB (results/h200-lab-simple-publisher.txt).

use super::{announce_recv, Dst, Prims, Src};
use crate::abi::{NCCL_STEPS, PROTO_SIMPLE};
use crate::arch;
use crate::ops::RedOp;
use crate::prims::copy::Move;
use crate::types::Elem;

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

impl Prims {
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

    /// The workers meet here, without the publisher ([`Prims::workers`] threads).
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

    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn slot(fifo: u64, step: u64, slot_bytes: usize) -> u64 {
        fifo + (step % NCCL_STEPS as u64) * slot_bytes as u64
    }

    /// Thread 0 waits until the step's receive slot is filled (`recv`) and a slot is free for
    /// its send (`send`); the caller's barrier then passes that on to the group.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn wait_slots(&mut self, recv: bool, send: bool) {
        if self.tid != 0 {
            return;
        }
        let (sc, rc, slice) = (self.send, self.recv, self.slice);
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

    /// One Simple step of `parts` parts of `n` elements each, packed one after another in the
    /// FIFO slot of each connection it uses (`recv`, `send`: absent connections count as
    /// false), the step's size the parts' sum: waits as a step does, then
    /// `part(i, from, to)` moves part `i` from its place in the receive slot (`from`, null
    /// without a receive) and to its place in the send slot (`to`, likewise) with every
    /// thread of the group, inlined ([`Move::run_inline`]: the group's barrier follows), then
    /// the group meets and one thread publishes.
    /// Several small pieces so cross the network as one message (PAT's aggregation).
    ///
    /// # Safety
    /// As [`Prims::send`]; `parts * n` elements fit a slot; `part` only moves data.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn step_parts<T: Elem>(
        &mut self,
        parts: usize,
        n: usize,
        recv: bool,
        send: bool,
        mut part: impl FnMut(usize, *const T, *mut T),
    ) {
        let recv = recv && !self.recv.is_null();
        let send = send && !self.send.is_null();
        self.wait_slots(recv, send);
        self.sync();
        let from = match recv {
            true => {
                Prims::slot((*self.recv).fifo, self.recv_step, self.recv_slot_bytes) as *const T
            }
            false => core::ptr::null(),
        };
        let to = match send {
            true => Prims::slot((*self.send).fifo, self.send_step, self.send_slot_bytes) as *mut T,
            false => core::ptr::null_mut(),
        };
        for i in 0..parts {
            let at = i * n;
            part(
                i,
                if recv { from.add(at) } else { from },
                if send { to.add(at) } else { to },
            );
        }
        // The parts' moves are inlined here (`Move::run_inline`): a barrier right after a
        // mover's call return is what the JIT mishandles (`Move::run_then_meet`).
        self.sync();
        if self.tid == 0 {
            self.publish(recv, send, parts * n * core::mem::size_of::<T>());
        }
        self.advance(recv, send);
    }

    /// One Simple step: waits for the receive slot and a free send slot, moves the data,
    /// publishes ([`Prims::step`] says what the arguments hold). A receive that [`Src::Landed`]
    /// reads no FIFO slot, and a send to [`Dst::Peer`] writes the peer's buffer instead of a
    /// slot; the counters, waits and publishes stay a FIFO step's, so flow control and the
    /// step counts stay as they were at both ends.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub(super) unsafe fn step_simple<T: Elem, O: RedOp<T>>(
        &mut self,
        op: &O,
        mut mv: Move<T>,
        n: usize,
        from: Option<Src<T>>,
        to: Option<Dst<T>>,
    ) {
        let (recv, send) = (from.is_some(), to.is_some());
        let (sc, rc) = (self.send, self.recv);
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
        self.wait_slots(recv, send);
        self.sync_workers(workers);
        match from {
            Some(Src::Fifo) => {
                mv.recv = Prims::slot((*rc).fifo, self.recv_step, self.recv_slot_bytes) as *const T
            }
            Some(Src::Landed(at)) => mv.recv = at,
            None => {}
        }
        match to {
            Some(Dst::Fifo) => {
                mv.send = Prims::slot((*sc).fifo, self.send_step, self.send_slot_bytes) as *mut T
            }
            Some(Dst::Peer(at)) => mv.send = at,
            None => {}
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
}
