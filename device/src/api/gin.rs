//! GIN (GPU-initiated networking) and signals: puts, signals and counters a kernel posts
//! itself, to any rank of its communicator.
//!
//! To a rank of the LSA team, a put is stores into the peer's window by the CTA's threads and
//! a signal an atomic add into the peer's signal word; to any other rank, the kernel posts the
//! op into its communicator's queue in host-mapped memory (`crate::abi::gin`) and the proxy
//! thread carries it over the network: the payload into the peer's window, then its signal.
//!
//! # Signals and counters
//!
//! Signal `id` (below [`MAX_SIGNALS`]) of a rank counts the signals every rank raised there
//! with that id; [`DevComm::wait_signal`] waits until it reached a value. Signals only grow: a
//! kernel that runs again waits for the previous total plus its own (pass the total in its
//! argument). Counter `id` (below [`MAX_COUNTERS`]) counts this rank's puts that named it and
//! whose source was read: the source may then be written again.
//!
//! # What a signal orders
//!
//! The data of a put is visible at the target before its signal is seen there (for every
//! reader that waits for the signal with [`DevComm::wait_signal`]). Puts to one peer through
//! the network land in the order they were posted; puts to an LSA peer are stores, ordered
//! for a reader only by a signal or a barrier after them. A signal alone
//! ([`DevComm::signal`]) orders the writes its thread made before it (a CTA's: after
//! `arch::sync_threads`).

use super::{Aborted, DevComm, Misuse, Window};
use crate::abi::gin::{GinOp, GinQueue, GIN_NONE, GIN_PUT, GIN_SIGNAL, GIN_SLOTS};
pub use crate::abi::gin::{MAX_COUNTERS, MAX_SIGNALS};
use crate::arch::{self, Pack16};

/// Where a put lands: byte `offset` of rank `peer`'s part of `window` ([`Window::at`]).
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    pub peer: u32,
    pub window: &'a Window,
    pub offset: usize,
}

impl Window {
    /// Byte `offset` of communicator rank `peer`'s part of this window, as a put's target.
    #[inline]
    pub fn at(&self, peer: u32, offset: usize) -> Target<'_> {
        Target {
            peer,
            window: self,
            offset,
        }
    }
}

impl DevComm {
    /// Where communicator rank `rank` sits in the LSA team, if it is a member.
    ///
    /// # Safety
    /// `self` came from the host and the communicator lives.
    #[inline]
    pub unsafe fn lsa_index(&self, rank: u32) -> Option<u32> {
        (0..self.lsa_size).find(|&l| self.lsa_to_rank(l) == rank)
    }

    /// Signal word of LSA rank `lsa_peer`'s area: signal `id` raised by rank `src`.
    #[inline]
    unsafe fn signal_word(&self, lsa_peer: u32, id: u32, src: u32) -> *mut u64 {
        self.area_word(
            lsa_peer,
            self.signals_at() + (id * self.nranks + src) as usize,
        )
    }

    /// This rank's own counter word `id` (the puts to LSA peers that named it).
    #[inline]
    unsafe fn counter_word(&self, id: u32) -> *mut u64 {
        self.area_word(self.lsa_rank, self.counters_at() + id as usize)
    }

    /// Puts `bytes` at `src` (this GPU's memory) at `to` (`window.at(peer, offset)`); then
    /// raises signal `signal` at the target's rank, and counter `counter` here once
    /// the source was read. Every thread of the CTA calls it alike. Returns once the source
    /// was read (LSA peers) or the op was queued (others: [`DevComm::flush`] or the counter
    /// says when the source was read); `Err(Aborted)`, in every thread, when the communicator
    /// was aborted while the queue was full.
    ///
    /// # Safety
    /// `self` and the target's window came from the host for this communicator and live;
    /// `src..src+bytes` is readable; the target's rank is below `nranks`; the CTA's index is
    /// below `MAX_BARRIERS`.
    #[inline]
    pub unsafe fn put(
        &self,
        to: Target<'_>,
        src: *const u8,
        bytes: usize,
        signal: Option<u32>,
        counter: Option<u32>,
    ) -> Result<(), Aborted> {
        let Target {
            peer,
            window: dst,
            offset: dst_offset,
        } = to;
        let (signal, counter) = (
            self.id_or_none(signal, Misuse::SignalId),
            self.id_or_none(counter, Misuse::CounterId),
        );
        if peer >= self.nranks {
            self.misuse(Misuse::Rank, peer as u64, self.nranks as u64);
        }
        // The simulator checks what a GPU does not spend the compares on.
        #[cfg(not(target_arch = "nvptx64"))]
        if (dst_offset as u64)
            .checked_add(bytes as u64)
            .is_none_or(|end| end > dst.bytes)
        {
            panic!(
                "device API: a put of {bytes} bytes at offset {dst_offset} is past the window's \
                 {} bytes",
                dst.bytes
            );
        }
        // The CTA's writes of the source come first.
        arch::sync_threads();
        let mut ok = true;
        match self.lsa_index(peer) {
            Some(l) => {
                if bytes > 0 {
                    copy_cta(self.lsa_ptr(dst, dst_offset, l), src, bytes);
                }
                arch::sync_threads();
                if arch::thread_idx() == 0 {
                    arch::fence_sys();
                    if signal != GIN_NONE {
                        arch::red_add_release_sys(self.signal_word(l, signal, self.rank), 1);
                    }
                    if counter != GIN_NONE {
                        arch::atomic_add_u64(self.counter_word(counter), 1);
                    }
                }
            }
            None if arch::thread_idx() == 0 => {
                let op = GinOp::new(
                    GIN_PUT,
                    peer,
                    (dst.handle, dst_offset as u64),
                    (src as u64, bytes as u64),
                    signal,
                    counter,
                );
                ok = self.post(op).is_ok();
            }
            None => {}
        }
        self.cta_outcome(ok)
    }

    /// Raises signal `id` at rank `peer`, after this thread's earlier writes. One thread
    /// calls it (each call is one signal). `Err(Aborted)` when the communicator was aborted
    /// while the queue was full.
    ///
    /// # Safety
    /// `self` came from the host and lives; `peer < nranks`, `id < MAX_SIGNALS`.
    #[inline]
    pub unsafe fn signal(&self, peer: u32, id: u32) -> Result<(), Aborted> {
        let id = self.id_or_none(Some(id), Misuse::SignalId);
        if peer >= self.nranks {
            self.misuse(Misuse::Rank, peer as u64, self.nranks as u64);
        }
        match self.lsa_index(peer) {
            Some(l) => {
                arch::fence_sys();
                arch::red_add_release_sys(self.signal_word(l, id, self.rank), 1);
                Ok(())
            }
            None => self.post(GinOp::new(GIN_SIGNAL, peer, (0, 0), (0, 0), id, GIN_NONE)),
        }
    }

    /// Signal `id` of this rank: every signal raised here with that id so far.
    ///
    /// # Safety
    /// `self` came from the host and lives; `id < MAX_SIGNALS`.
    #[inline]
    pub unsafe fn read_signal(&self, id: u32) -> u64 {
        let id = self.id_or_none(Some(id), Misuse::SignalId);
        (0..self.nranks)
            .map(|src| arch::ld_acquire_sys(self.signal_word(self.lsa_rank, id, src)))
            .sum()
    }

    /// Waits until signal `id` of this rank reached `least`; what the signals' puts wrote is
    /// then visible to the calling thread. `Err(Aborted)` when the communicator was aborted.
    ///
    /// # Safety
    /// As [`DevComm::read_signal`].
    #[inline]
    pub unsafe fn wait_signal(&self, id: u32, least: u64) -> Result<(), Aborted> {
        self.wait_until(|| self.read_signal(id) >= least)
    }

    /// Counter `id`: this rank's puts that named it whose source was read.
    ///
    /// # Safety
    /// `self` came from the host and lives; `id < MAX_COUNTERS`.
    #[inline]
    pub unsafe fn read_counter(&self, id: u32) -> u64 {
        let id = self.id_or_none(Some(id), Misuse::CounterId);
        let mut n = arch::ld_acquire_sys(self.counter_word(id));
        if self.gin != 0 {
            let q = self.gin as *const GinQueue;
            n += arch::ld_acquire_sys(core::ptr::addr_of!((*q).counters[id as usize]));
        }
        n
    }

    /// Waits until counter `id` reached `least`. `Err(Aborted)` when the communicator was
    /// aborted.
    ///
    /// # Safety
    /// As [`DevComm::read_counter`].
    #[inline]
    pub unsafe fn wait_counter(&self, id: u32, least: u64) -> Result<(), Aborted> {
        self.wait_until(|| self.read_counter(id) >= least)
    }

    /// Spins until `ready`, or `Err(Aborted)` once the communicator was aborted.
    #[inline]
    unsafe fn wait_until(&self, ready: impl FnMut() -> bool) -> Result<(), Aborted> {
        let mut aborted = false;
        crate::coll::spin_until(self.abort as *const u64, &mut aborted, ready);
        match aborted {
            false => Ok(()),
            true => Err(Aborted),
        }
    }

    /// Waits until the source of every op this communicator's kernels posted to the queue so
    /// far was read (puts to LSA peers read theirs before they return).
    ///
    /// # Safety
    /// `self` came from the host and lives.
    #[inline]
    pub unsafe fn flush(&self) -> Result<(), Aborted> {
        if self.gin == 0 {
            return Ok(());
        }
        let q = self.gin as *const GinQueue;
        let posted = arch::ld_acquire_sys(self.head_word());
        self.wait_until(|| arch::ld_acquire_sys(core::ptr::addr_of!((*q).completed)) >= posted)
    }

    /// Posts `op` into the queue (one thread): a ticket, a free slot, the op, then its
    /// sequence number with a release.
    #[inline]
    unsafe fn post(&self, op: GinOp) -> Result<(), Aborted> {
        if self.gin == 0 {
            // No proxy: the host made this device communicator without GIN (no network, or
            // no window registered before it).
            self.misuse(Misuse::NoGin, op.peer as u64, self.lsa_size as u64);
        }
        let q = self.gin as *mut GinQueue;
        let ticket = arch::atomic_add_u64(self.head_word(), 1);
        self.wait_until(|| {
            arch::ld_acquire_sys(core::ptr::addr_of!((*q).consumed)) + GIN_SLOTS as u64 > ticket
        })?;
        let slot = core::ptr::addr_of_mut!((*q).ring[ticket as usize % GIN_SLOTS]);
        let words = &op as *const GinOp as *const u64;
        // Every word but the sequence number (word 0), then the fence, then the release.
        for w in 1..core::mem::size_of::<GinOp>() / 8 {
            arch::st_volatile((slot as *mut u64).add(w), *words.add(w));
        }
        arch::fence_sys();
        arch::st_release_sys(core::ptr::addr_of_mut!((*slot).seq), ticket + 1);
        Ok(())
    }

    /// A signal or counter id as a [`GinOp`] holds it; an id past the limit stops the kernel.
    #[inline]
    fn id_or_none(&self, id: Option<u32>, kind: Misuse) -> u32 {
        let max = match kind {
            Misuse::CounterId => MAX_COUNTERS,
            _ => MAX_SIGNALS,
        };
        match id {
            None => GIN_NONE,
            Some(i) if i < max => i,
            Some(i) => self.misuse(kind, i as u64, max as u64),
        }
    }

    /// Thread 0's outcome, for every thread of the CTA (through a word of this rank's area).
    #[inline]
    unsafe fn cta_outcome(&self, ok: bool) -> Result<(), Aborted> {
        let word = self.put_outcome_word(arch::block_idx());
        if arch::thread_idx() == 0 {
            arch::st_volatile(word, !ok as u64);
        }
        arch::sync_threads();
        let failed = arch::ld_volatile(word) != 0;
        arch::sync_threads();
        match failed {
            false => Ok(()),
            true => Err(Aborted),
        }
    }
}

/// Copies `bytes` from `src` to `dst` with every thread of the CTA: 16-byte vectors where
/// both ends and the length allow, bytes otherwise.
#[inline]
unsafe fn copy_cta(dst: *mut u8, src: *const u8, bytes: usize) {
    let (t, n) = (arch::thread_idx() as usize, arch::block_dim() as usize);
    if (dst as usize | src as usize | bytes).is_multiple_of(16) {
        let (d, s) = (dst as *mut Pack16, src as *const Pack16);
        for i in (t..bytes / 16).step_by(n) {
            arch::st_pack(d.add(i), arch::ld_pack(s.add(i)));
        }
    } else {
        for i in (t..bytes).step_by(n) {
            *dst.add(i) = *src.add(i);
        }
    }
}
