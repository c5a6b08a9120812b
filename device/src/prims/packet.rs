//! What the flag-carrying protocols (LL, LL128) share around a step: waiting for credit before
//! filling a slot, finding the step's slots, and giving a slot back once it was read.

use crate::abi::{
    stride_bytes, LL128_SLOT_BYTES, LL_SLOT_BYTES, NCCL_STEPS, PROTO_LL, PROTO_LL128,
    SIZE_LL_LINES, STRIDE_LL_POLL, STRIDE_LL_SEND_POLL,
};
use crate::arch::{self, Pack16};
use crate::prims::copy::Move;
use crate::prims::{announce_recv, Prims};

/// Which FIFO of a connection a step uses.
#[derive(Clone, Copy)]
pub(super) enum Fifo {
    Ll,
    Ll128,
}

impl Prims {
    /// Starts a step: a sender first waits until the slot it fills was consumed NCCL_STEPS
    /// steps ago (thread 0 polls, then the CTA meets). Returns the step's receive and send
    /// slots in `fifo` (null where that direction takes no part), and points `mv`'s `recv` and
    /// `send` at them: only marks for [`Move::combine`], since the lines are read and written
    /// by the protocol itself.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub(super) unsafe fn packet_begin<T>(
        &mut self,
        fifo: Fifo,
        recv: bool,
        send: bool,
        mv: &mut Move<T>,
    ) -> (*const Pack16, *mut Pack16) {
        let (sc, rc) = (self.send, self.recv);
        // A proxy publishes a step's tail once all of its lines landed; wait for that, since the
        // network gave no line its atomicity (the flags then hold, and the loop below reads them
        // as on a direct connection).
        let proxied = recv && (*rc).proxy_stride != 0;
        // Except LL lines landing in order in host memory (`STRIDE_LL_POLL`): their flags
        // suffice, and the proxy only needs to hear that the kernel waits.
        let polls_lines =
            proxied && matches!(fifo, Fifo::Ll) && (*rc).proxy_stride & STRIDE_LL_POLL != 0;
        if polls_lines && self.tid == 0 {
            announce_recv(rc, self.recv_step + 1, PROTO_LL);
        }
        let proxied = proxied && !polls_lines;
        if proxied && self.tid == 0 {
            let (tail, need) = ((*rc).tail as *const u64, self.recv_step + 1);
            if arch::ld_acquire_sys(tail) < need {
                // Not landed yet: the proxy may be waiting to learn the step's protocol (it
                // flushes Simple steps only) before it publishes.
                let proto = match fifo {
                    Fifo::Ll => PROTO_LL,
                    Fifo::Ll128 => PROTO_LL128,
                };
                announce_recv(rc, need, proto);
                self.wait(|| arch::ld_acquire_sys(tail) >= need);
            }
        }
        // The slot is free once the peer consumed the step NCCL_STEPS before it; the head
        // read last time may already say so (no trip to the counter then).
        let need = (self.send_step + 1).saturating_sub(NCCL_STEPS as u64);
        if send && self.tid == 0 && self.head_seen < need {
            // A plain (volatile) load: the slot's writes depend on it by control, and no data
            // is read through it.
            let head = (*sc).head as *const u64;
            let mut seen = self.head_seen;
            self.wait(|| {
                seen = arch::ld_volatile(head);
                seen >= need
            });
            self.head_seen = seen;
        }
        if send || proxied {
            self.sync();
        }
        let fixed = match fifo {
            Fifo::Ll => LL_SLOT_BYTES,
            Fifo::Ll128 => LL128_SLOT_BYTES,
        } as u64;
        // Proxied connections space their slots by their stride, alike for every protocol.
        let stride = |proxy_stride: u64| {
            if proxy_stride != 0 {
                stride_bytes(proxy_stride)
            } else {
                fixed
            }
        };
        let slot = |base: u64, step: u64, stride: u64| base + (step % NCCL_STEPS as u64) * stride;
        let mut r: *const Pack16 = core::ptr::null();
        let mut s: *mut Pack16 = core::ptr::null_mut();
        if recv {
            let base = match fifo {
                Fifo::Ll => (*rc).ll_fifo,
                Fifo::Ll128 => (*rc).ll128_fifo,
            };
            r = slot(base, self.recv_step, stride((*rc).proxy_stride)) as *const Pack16;
            mv.recv = r as *const T;
        }
        if send {
            let base = match fifo {
                Fifo::Ll => (*sc).ll_fifo,
                Fifo::Ll128 => (*sc).ll128_fifo,
            };
            s = slot(base, self.send_step, stride((*sc).proxy_stride)) as *mut Pack16;
            mv.send = s as *mut T;
        }
        (r, s)
    }

    /// Ends a step: once every thread has read its lines, the receive slot goes back to the
    /// sender; both step counters move on.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    /// `polled`: the step's lines were LL ones, read by their flags alone (and, on a send side
    /// with [`STRIDE_LL_SEND_POLL`], checked by their flags before the proxy sends them).
    pub(super) unsafe fn packet_end(
        &mut self,
        recv: bool,
        send: bool,
        sent_bytes: usize,
        polled: bool,
    ) {
        let sizes = if send {
            (*self.send).proxy_sizes as *mut u64
        } else {
            core::ptr::null_mut()
        };
        if !sizes.is_null() {
            // A proxy carries this connection: it learns of the step from `tail` (direct peers
            // poll the flags instead), once every thread's lines were written.
            self.sync();
            if self.tid == 0 {
                let at = (self.send_step % NCCL_STEPS as u64) as usize;
                let tail = (*self.send).tail as *mut u64;
                if polled && (*self.send).proxy_stride & STRIDE_LL_SEND_POLL != 0 {
                    // The proxy checks the lines' flags in host memory before it sends them
                    // (`STRIDE_LL_SEND_POLL`): no release, whose wait for every line to reach
                    // host memory would cost a round trip over PCIe on each step.
                    arch::st_volatile(sizes.add(at), sent_bytes as u64 | SIZE_LL_LINES);
                    arch::st_volatile(tail, self.send_step + 1);
                } else {
                    arch::st_volatile(sizes.add(at), sent_bytes as u64);
                    arch::st_release_sys(tail, self.send_step + 1);
                }
            }
        }
        if recv {
            self.sync();
            if self.tid == 0 {
                let head = (*self.recv).head as *mut u64;
                let stride = (*self.recv).proxy_stride;
                if stride != 0 && !(polled && stride & STRIDE_LL_POLL != 0) {
                    // A proxy reads this head from host memory and then lets the network
                    // overwrite the slot: a system-scope release, as Simple's, orders every
                    // load of the slot before it. Its wait is small beside the network
                    // round trip each step costs anyway.
                    arch::st_release_sys(head, self.recv_step + 1);
                } else {
                    // A plain (volatile) store, no system-scope release: every line of the
                    // slot was loaded and used before the barrier (its flags compared, its
                    // data reduced or stored), so no load of it is still in flight, and a
                    // release here would first wait for this thread's stores to the next peer
                    // to land (a round trip over the link, or PCIe, on every step). The data's
                    // order is carried by the lines' flags: so for LL lines a proxy polls
                    // (`STRIDE_LL_POLL`) too.
                    arch::st_volatile(head, self.recv_step + 1);
                }
            }
            self.recv_step += 1;
        }
        if send {
            self.send_step += 1;
        }
    }
}
