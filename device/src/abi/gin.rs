//! GIN (GPU-initiated networking) as host and device both read it: the queue a kernel posts
//! puts and signals into for peers outside its LSA team, which the communicator's proxy
//! thread carries over the network (`host/comm/gin.rs`), and the signal and counter words.
//!
//! The queue lives in pinned host memory mapped for the GPU (a [`GinQueue`]): a ring of
//! [`GIN_SLOTS`] [`GinOp`]s and the words the proxy writes. A kernel takes a ticket from the
//! device word `head` (an atomic add), waits until `consumed + GIN_SLOTS > ticket` (its slot is
//! free), writes the op and then, with a release, its `seq` (= ticket + 1). The proxy reads the
//! slots in ticket order, copies each op out, then advances `consumed`; `completed` counts the
//! ops whose source was read and sent (in ticket order), and `counters[c]` the puts so
//! completed that asked for counter `c`.

/// Ops the ring holds.
pub const GIN_SLOTS: usize = 256;
/// Signal ids a device communicator has (`DevComm::signal`'s `id`).
pub const MAX_SIGNALS: u32 = 64;
/// Counter ids a device communicator has (`DevComm::put`'s `counter`).
pub const MAX_COUNTERS: u32 = 64;
/// "No signal", "no counter" in a [`GinOp`].
pub const GIN_NONE: u32 = u32::MAX;

/// A put of `bytes` at `src` into `win` of rank `peer` at `offset` (then its signal, if any).
pub const GIN_PUT: u32 = 1;
/// A signal alone.
pub const GIN_SIGNAL: u32 = 2;

/// One op a kernel posted.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GinOp {
    /// Ticket + 1 once the op is written (released last); older values: not yet.
    pub seq: u64,
    pub kind: u32,
    /// The target's communicator rank.
    pub peer: u32,
    /// The window's handle (the same on every rank: registration is collective).
    pub win: u64,
    pub offset: u64,
    /// Device address of the source bytes.
    pub src: u64,
    pub bytes: u64,
    /// Signal id raised at `peer` after the data ([`GIN_NONE`]: none).
    pub signal: u32,
    /// Counter id raised here once the source was read ([`GIN_NONE`]: none).
    pub counter: u32,
    _pad: u64,
}

impl GinOp {
    pub const fn new(
        kind: u32,
        peer: u32,
        (win, offset): (u64, u64),
        (src, bytes): (u64, u64),
        signal: u32,
        counter: u32,
    ) -> GinOp {
        GinOp {
            seq: 0,
            kind,
            peer,
            win,
            offset,
            src,
            bytes,
            signal,
            counter,
            _pad: 0,
        }
    }
}

/// The queue's host-mapped block: the ring, then the proxy's words.
#[repr(C)]
pub struct GinQueue {
    pub ring: [GinOp; GIN_SLOTS],
    /// Ops copied out of the ring (their slots free).
    pub consumed: u64,
    /// Ops whose source was read and sent, in ticket order.
    pub completed: u64,
    _pad: [u64; 6],
    /// Per counter id: puts completed that asked for it.
    pub counters: [u64; MAX_COUNTERS as usize],
}

const _: () = assert!(core::mem::size_of::<GinOp>() == 64);
const _: () = assert!(core::mem::size_of::<GinQueue>() == 64 * GIN_SLOTS + 64 + 8 * 64);
