//! The symmetric path's part of the ABI: the scratch every rank maps, its flag slots and LL
//! area, and where a launch's input lies (`host/comm/window.rs`, `coll/symmetric.rs`).

use super::MAX_CHANNELS;

/// A launch on the symmetric path (buffers in windows: `host/comm/window.rs`,
/// `coll/symmetric.rs`). Not one of NCCL's tuner algorithms (NCCL runs its symmetric kernels
/// beside them too): a value none of them takes.
pub const ALGO_SYMMETRIC: u32 = 16;

/// A local fold of the deterministic mode (`host/enqueue/deterministic.rs`,
/// `coll/fold.rs`): `nranks` blocks of `count` elements at `sendbuff`, one after the other,
/// reduced in block order into `count` elements at `recvbuff`; no peer is involved. Launched
/// through the ReduceScatter kernel of the type and reduction. Not one of NCCL's algorithms.
pub const ALGO_FOLD: u32 = 17;

/// Ranks the symmetric path serves: one node's, at most this many.
pub const SYM_MAX_RANKS: usize = 8;
/// Windows a communicator holds at once (slots of [`SymDev::windows`]).
pub const SYM_MAX_WINDOWS: usize = 64;
/// Exchanges a CTA of the loads form makes per launch, each in slots of its own: arrive,
/// depart, and the two-shot AllReduce's "reduced block published".
pub const SYM_PHASES: usize = 3;
/// Bytes at the head of each rank's symmetric scratch: the flag slots ([`SymSlot`]), per CTA
/// and phase one slot per rank. The staging area follows.
pub const SYM_FLAG_BYTES: usize =
    MAX_CHANNELS * SYM_PHASES * SYM_MAX_RANKS * core::mem::size_of::<SymSlot>();
/// CTAs of a symmetric launch, at most.
pub const SYM_MAX_CTAS: usize = 16;
/// Bytes of LL lines one CTA of a symmetric LL launch ([`super::CollArgs::proto`] LL) receives from
/// one rank in one half: half of it payload, so a launch moves at most
/// `SYM_MAX_CTAS * SYM_LL_CTA_BYTES / 2` bytes per rank.
pub const SYM_LL_CTA_BYTES: usize = 8192;
/// Bytes of the LL area after a rank's staging area: two halves (by launch parity) of a slot
/// per (source rank, CTA).
pub const SYM_LL_BYTES: usize = 2 * SYM_MAX_RANKS * SYM_MAX_CTAS * SYM_LL_CTA_BYTES;
/// The largest symmetric LL launch, in bytes per rank.
pub const SYM_LL_MAX_BYTES: usize = SYM_MAX_CTAS * SYM_LL_CTA_BYTES / 2;

/// [`super::CollArgs::sym_src`] of a rank whose input is not in a window (or is overwritten in
/// place): the kernel first copies it into the rank's staging area, where peers read it.
pub const SYM_SRC_STAGED: u64 = 0;

/// [`super::CollArgs::sym_src`] of an input at `offset` in window slot `slot`: peers read it through
/// their own mapping of that window.
pub const fn sym_src_window(slot: usize, offset: u64) -> u64 {
    ((slot as u64 + 1) << 48) | (offset & ((1 << 48) - 1))
}

/// Reads a [`super::CollArgs::sym_src`]: None for [`SYM_SRC_STAGED`], else (slot, offset).
pub const fn sym_src_parts(src: u64) -> Option<(usize, u64)> {
    match src >> 48 {
        0 => None,
        s => Some((s as usize - 1, src & ((1 << 48) - 1))),
    }
}

/// One flag slot of the symmetric scratch: a rank's arrival (`seq`: the launch number) and,
/// in the arrive phase, where its input lies (a [`super::CollArgs::sym_src`]) and its output
/// ([`super::CollArgs::sym_dst`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SymSlot {
    pub seq: u64,
    pub src: u64,
    pub dst: u64,
    pub _pad: u64,
}

/// A communicator's symmetric state in device memory ([`super::CollArgs::sym`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SymDev {
    pub rank: u32,
    pub nranks: u32,
    /// Bytes of each rank's staging area (after its [`SYM_FLAG_BYTES`] of flags); its
    /// [`SYM_LL_BYTES`] of LL lines follow.
    pub stage_bytes: u64,
    /// Per rank: its symmetric scratch, as this rank maps it.
    pub scratch: [u64; SYM_MAX_RANKS],
    /// Device address of `[[u64; SYM_MAX_RANKS]; SYM_MAX_WINDOWS]`: per window slot, every
    /// rank's window base as this rank maps it (0: no window in the slot).
    pub windows: u64,
    /// Per CTA, the symmetric launches it ran (this rank's, never shared): every rank runs
    /// the same sequence, so the next launch's number is the same everywhere.
    pub launches: [u64; MAX_CHANNELS],
}

/// Waits one launch of [`WAIT_SIGNALS_ENTRY`] holds, at most.
pub const WAIT_MAX: usize = 8;

/// The kernel that holds a stream until signals arrived (`host/comm/onesided.rs`): one CTA,
/// a thread per wait, watching the abort flag. A kernel, not a stream memory operation: CUDA
/// warns that a stream held by `cuStreamWaitValue64` stalls the hardware queue it shares with
/// other streams, where the signal it waits for may sit behind it.
pub const WAIT_SIGNALS_ENTRY: &str = "nccl_wait_signals";

/// The arguments of [`WAIT_SIGNALS_ENTRY`]: wait `i < count` holds until the u64 at `slots[i]`
/// is at least `values[i]`, or the communicator's abort flag (`abort`, host memory) is raised.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitArgs {
    pub abort: u64,
    pub count: u32,
    pub _pad: u32,
    pub slots: [u64; WAIT_MAX],
    pub values: [u64; WAIT_MAX],
}

const _: () = assert!(core::mem::size_of::<WaitArgs>() == 16 + 16 * WAIT_MAX);
