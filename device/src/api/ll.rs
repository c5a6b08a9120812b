//! LL sessions: an all-to-all of 8-byte values inside the LSA team with no barrier, what
//! NCCL 2.28's device API calls `ncclLLA2A` and what the library's own small symmetric
//! collectives do (`crate::coll::symmetric`).
//!
//! A value travels as one 16-byte store of `{low half, flag, high half, flag}` into the
//! receiver's memory, the flag being the session's epoch: the receiver polls its line until
//! both flags read the epoch, and then holds the value (each 8-byte half arrives whole, with
//! its flag; both flags current means both halves are). No fence, no counter, no barrier: the
//! cheapest way a few kilobytes cross the team.
//!
//! Each block (one per CTA index, [`DevComm::ll_a2a`]'s `block`) owns, in every rank's area,
//! two halves of `[lsa_size][ll_slots]` lines, used by alternate epochs. A rank writes epoch `k`
//! into the half its peer read in epoch `k - 2`. That is safe when, in every epoch, every rank
//! receives at least one line from every rank it sends to in the next: the sender of epoch
//! `k` then received the peer's line of `k - 1`, which the peer sent after it had ended
//! `k - 2`. A one-shot collective (each rank sends its slice to all and receives everyone's)
//! meets it; an exchange whose pattern of peers changes from one epoch to the next must add
//! a line to each rank it skipped. An epoch with no exchange at all breaks it too: a CTA with
//! nothing to send should not open a session (every rank's alike).

use super::{ll_epochs_at, ll_lines_at, Aborted, DevComm, Misuse};
use crate::arch::{self, Pack16};

/// Bytes of the LL lines of one rank's area.
pub(super) const fn lines_bytes(c: &DevComm) -> usize {
    16 * 2 * c.ll_blocks as usize * c.lsa_size as usize * c.ll_slots as usize
}

/// One epoch of an LL block ([`DevComm::ll_a2a`]): every thread of the CTA makes it, sends and
/// receives, then calls [`LlA2a::end`].
pub struct LlA2a<'a> {
    comm: &'a DevComm,
    block: u32,
    epoch: u64,
    aborted: bool,
    /// This epoch's lines in this rank's own area (`[lsa_size][ll_slots]`): found once, not
    /// per receive.
    inbox: *mut Pack16,
}

impl DevComm {
    /// The next epoch of LL block `block` (`< ll_blocks`, as requested from the host): every
    /// thread of the CTA calls it, and every rank's CTA using the block runs the same epochs.
    ///
    /// # Safety
    /// `self` came from the host and the communicator lives; one CTA at a time uses a block.
    #[inline]
    pub unsafe fn ll_a2a(&self, block: u32) -> LlA2a<'_> {
        if block >= self.ll_blocks {
            self.misuse(Misuse::LlBlock, block as u64, self.ll_blocks as u64);
        }
        let epoch = arch::ld_volatile(self.ll_epoch_word(block)) + 1;
        LlA2a {
            comm: self,
            block,
            epoch,
            aborted: false,
            inbox: self.ll_lines(self.lsa_rank, block, epoch),
        }
    }

    /// The lines of epoch `epoch` of block `block` in LSA rank `to`'s area, as mapped here.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn ll_lines(&self, to: u32, block: u32, epoch: u64) -> *mut Pack16 {
        let half = (epoch % 2) as usize;
        let lines = self.area_word(to, ll_lines_at(self.lsa_size, self.nranks, self.ll_blocks));
        let at = (block as usize * 2 + half) * self.lsa_size as usize * self.ll_slots as usize;
        (lines as *mut Pack16).add(at)
    }

    /// This rank's count of the epochs block `block` ended.
    #[inline]
    unsafe fn ll_epoch_word(&self, block: u32) -> *mut u64 {
        self.area_word(
            self.lsa_rank,
            ll_epochs_at(self.lsa_size, self.nranks) + block as usize,
        )
    }
}

impl LlA2a<'_> {
    /// Lines each rank may send each peer in one epoch (slots `0..slots()`).
    #[inline]
    pub fn slots(&self) -> usize {
        self.comm.ll_slots as usize
    }

    /// Line `slot` that LSA rank `from` sends to LSA rank `to` in this epoch, as mapped here.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    unsafe fn line(&self, to: u32, from: u32, slot: usize) -> *mut Pack16 {
        let c = self.comm;
        if to.max(from) >= c.lsa_size {
            c.misuse(Misuse::LlPeer, to.max(from) as u64, c.lsa_size as u64);
        }
        if slot >= c.ll_slots as usize {
            c.misuse(Misuse::LlSlot, slot as u64, c.ll_slots as u64);
        }
        let lines = match to == c.lsa_rank {
            true => self.inbox,
            false => c.ll_lines(to, self.block, self.epoch),
        };
        lines.add(from as usize * c.ll_slots as usize + slot)
    }

    /// Sends `value` as line `slot` to LSA rank `lsa_peer` (this rank included): one 16-byte
    /// store into its memory.
    ///
    /// # Safety
    /// As [`DevComm::ll_a2a`]; `lsa_peer < lsa_size`, `slot < slots()`, and the module's rule
    /// on epochs holds.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn send(&self, lsa_peer: u32, slot: usize, value: u64) {
        let flag = self.epoch as u32;
        let line = Pack16([value as u32, flag, (value >> 32) as u32, flag]);
        arch::st_volatile_pack(self.line(lsa_peer, self.comm.lsa_rank, slot), line);
    }

    /// Sends `value` as line `slot` to every LSA rank, this one included.
    ///
    /// # Safety
    /// As [`LlA2a::send`].
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn bcast(&self, slot: usize, value: u64) {
        for peer in 0..self.comm.lsa_size {
            self.send(peer, slot, value);
        }
    }

    /// Waits for line `slot` from LSA rank `from` in this epoch and returns its value; Err once
    /// the communicator was aborted (and for every later call of this epoch).
    ///
    /// # Safety
    /// As [`LlA2a::send`], with `from < lsa_size`.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn recv(&mut self, from: u32, slot: usize) -> Result<u64, Aborted> {
        let line = self.line(self.comm.lsa_rank, from, slot);
        let flag = self.epoch as u32;
        let mut v = Pack16::default();
        crate::coll::spin_until(self.comm.abort as *const u64, &mut self.aborted, || {
            v = arch::ld_volatile_pack(line);
            v.0[1] == flag && v.0[3] == flag
        });
        match self.aborted {
            false => Ok(v.0[0] as u64 | (v.0[2] as u64) << 32),
            true => Err(Aborted),
        }
    }

    /// Ends the epoch: every thread of the CTA calls it once it sent and received all it will
    /// in this epoch; the block's next session is the next epoch.
    ///
    /// # Safety
    /// As [`DevComm::ll_a2a`]; every thread of the CTA calls it, none other.
    #[inline]
    pub unsafe fn end(self) {
        arch::sync_threads();
        if arch::thread_idx() == 0 {
            arch::st_volatile(self.comm.ll_epoch_word(self.block), self.epoch);
        }
        // The next session of the block reads the count only after it moved on.
        arch::sync_threads();
    }
}
