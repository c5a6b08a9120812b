//! The Simple protocol: a step's data goes into a FIFO slot with ordinary stores; the CTA then
//! synchronises, and one thread publishes the step with a system-scope release on the peer's
//! tail counter. The receiver's acquire of that counter makes the whole slot visible. Flow
//! control runs the other way: the receiver releases `head` once it has consumed a slot, and a
//! sender never runs more than NCCL_STEPS slots ahead of it.

use crate::abi::{ChannelDev, NCCL_STEPS};
use crate::arch;
use crate::ops::RedOp;
use crate::prims::copy::Move;
use crate::types::Elem;

/// One channel's send connection (to the ring's next) and receive connection (from its prev),
/// with the step counters this CTA advances.
pub struct Simple {
    ch: *mut ChannelDev,
    slot_bytes: usize,
    send_step: u64,
    recv_step: u64,
    tid: usize,
    nthreads: usize,
}

impl Simple {
    /// # Safety
    /// `ch` points at this CTA's channel in device memory, wired by the host.
    #[inline(always)]
    pub unsafe fn new(ch: *mut ChannelDev, slot_bytes: u32) -> Simple {
        Simple {
            ch,
            slot_bytes: slot_bytes as usize,
            send_step: (*ch).send.step,
            recv_step: (*ch).recv.step,
            tid: arch::thread_idx() as usize,
            nthreads: arch::block_dim() as usize,
        }
    }

    /// Elements of T one step carries at most.
    pub fn step_elems<T>(&self) -> usize {
        self.slot_bytes / core::mem::size_of::<T>()
    }

    #[inline(always)]
    unsafe fn slot(&self, fifo: u64, step: u64) -> u64 {
        fifo + (step % NCCL_STEPS as u64) * self.slot_bytes as u64
    }

    /// One step: waits for the receive slot and a free send slot, moves the data, publishes.
    /// Every thread of the CTA calls it with the same arguments; `recv`/`send` say which
    /// connections take part, `mv` carries only the user-buffer pointers.
    #[inline(always)]
    pub unsafe fn step<T: Elem, O: RedOp<T>>(
        &mut self,
        op: &O,
        recv: bool,
        send: bool,
        mut mv: Move<T>,
        n: usize,
    ) {
        let ch = self.ch;
        if self.tid == 0 {
            if recv {
                let tail = (*ch).recv.tail as *const u64;
                while arch::ld_acquire_sys(tail) <= self.recv_step {
                    arch::spin_pause();
                }
            }
            if send {
                let head = (*ch).send.head as *const u64;
                while arch::ld_acquire_sys(head) + (NCCL_STEPS as u64) <= self.send_step {
                    arch::spin_pause();
                }
            }
        }
        arch::sync_threads();
        if recv {
            mv.recv = self.slot((*ch).recv.fifo, self.recv_step) as *const T;
        }
        if send {
            mv.send = self.slot((*ch).send.fifo, self.send_step) as *mut T;
        }
        mv.run(op, n, self.tid, self.nthreads);
        arch::sync_threads();
        if self.tid == 0 {
            if send {
                arch::st_release_sys((*ch).send.tail as *mut u64, self.send_step + 1);
            }
            if recv {
                arch::st_release_sys((*ch).recv.head as *mut u64, self.recv_step + 1);
            }
        }
        if send {
            self.send_step += 1;
        }
        if recv {
            self.recv_step += 1;
        }
    }

    /// Saves the step counters for the next launch on this channel.
    #[inline(always)]
    pub unsafe fn finish(self) {
        if self.tid == 0 {
            (*self.ch).send.step = self.send_step;
            (*self.ch).recv.step = self.recv_step;
        }
    }
}
