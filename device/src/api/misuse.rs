//! What a kernel did wrong with the device API, and how it says so.
//!
//! A kernel that passes an id, index or peer past what its device communicator has cannot go
//! on: the access would land in another structure's memory. On the simulator it panics with
//! the message (the stream fails with it). On a GPU it writes a fault record into host-mapped
//! memory of the device communicator, then traps: the trap ends the context, but the record
//! is host memory, so `nccl::DeviceComm::fault` can still say what the kernel passed. Where
//! several threads fault at once, each writes the record (no host-memory atomics, which not
//! every system has): the words may come from different threads, each a true misuse.

use super::DevComm;
#[cfg(target_arch = "nvptx64")]
use crate::arch;

/// Words of the fault record: the [`Misuse`] code (0: none, written last), the value the
/// kernel passed, the limit it passed, the CTA.
pub const FAULT_WORDS: usize = 4;

/// What a kernel passed wrong.
#[repr(u64)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Misuse {
    /// `lsa_ptr`, `lsa_to_rank`: a peer not below `lsa_size`.
    LsaPeer = 1,
    /// A put or signal to a rank not below `nranks`.
    Rank,
    /// A barrier (or a put's outcome word) of a CTA index not below `MAX_BARRIERS`.
    BarrierIndex,
    /// A signal id not below `MAX_SIGNALS`.
    SignalId,
    /// A counter id not below `MAX_COUNTERS`.
    CounterId,
    /// A put or signal to a rank outside the LSA team, on a device communicator without GIN.
    NoGin,
    /// An LL block not below `ll_blocks`.
    LlBlock,
    /// An LL peer not below `lsa_size`.
    LlPeer,
    /// An LL slot not below `ll_slots`.
    LlSlot,
    /// `multimem_ptr` on a window without a multicast object.
    NoMultimem,
}

impl Misuse {
    const ALL: [Misuse; 10] = [
        Misuse::LsaPeer,
        Misuse::Rank,
        Misuse::BarrierIndex,
        Misuse::SignalId,
        Misuse::CounterId,
        Misuse::NoGin,
        Misuse::LlBlock,
        Misuse::LlPeer,
        Misuse::LlSlot,
        Misuse::NoMultimem,
    ];

    /// The misuse of fault record code `code`.
    #[inline]
    pub fn from_code(code: u64) -> Option<Misuse> {
        Misuse::ALL.into_iter().find(|m| *m as u64 == code)
    }

    /// What was wrong, in words, and what the limit is called.
    #[inline]
    pub const fn what(self) -> (&'static str, &'static str) {
        match self {
            Misuse::LsaPeer => ("LSA peer past the team", "lsa_size"),
            Misuse::Rank => ("rank past the communicator", "nranks"),
            Misuse::BarrierIndex => ("barrier index (CTA) past MAX_BARRIERS", "MAX_BARRIERS"),
            Misuse::SignalId => ("signal id past MAX_SIGNALS", "MAX_SIGNALS"),
            Misuse::CounterId => ("counter id past MAX_COUNTERS", "MAX_COUNTERS"),
            Misuse::NoGin => (
                "put or signal to a rank outside the LSA team with no GIN queue (register a \
                 window before Comm::dev_comm)",
                "lsa_size",
            ),
            Misuse::LlBlock => (
                "LL block past the device communicator's ll_blocks",
                "ll_blocks",
            ),
            Misuse::LlPeer => ("LL peer past the LSA team", "lsa_size"),
            Misuse::LlSlot => (
                "LL slot past the device communicator's ll_slots",
                "ll_slots",
            ),
            Misuse::NoMultimem => (
                "multimem pointer (at this offset) of a window with no multicast object (NVLS \
                 off, or the window is not symmetric)",
                "multicast bytes",
            ),
        }
    }
}

impl DevComm {
    /// Stops the kernel: it passed `value` where `misuse` wants less than `limit`.
    #[cold]
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    #[cfg_attr(not(target_arch = "nvptx64"), inline)]
    pub(crate) fn misuse(&self, misuse: Misuse, value: u64, limit: u64) -> ! {
        #[cfg(not(target_arch = "nvptx64"))]
        {
            let (what, limit_name) = misuse.what();
            panic!(
                "device API: {what}: {value} (the device communicator's {limit_name} is {limit})"
            );
        }
        #[cfg(target_arch = "nvptx64")]
        {
            if self.fault != 0 {
                let record = self.fault as *mut u64;
                // SAFETY: the host made `fault` a live host-mapped record of FAULT_WORDS words.
                unsafe {
                    arch::st_volatile(record.add(1), value);
                    arch::st_volatile(record.add(2), limit);
                    arch::st_volatile(record.add(3), arch::block_idx() as u64);
                    // The code last: a reader that sees it sees the rest.
                    arch::fence_sys();
                    arch::st_volatile(record, misuse as u64);
                    arch::fence_sys();
                }
            }
            arch::trap()
        }
    }
}
