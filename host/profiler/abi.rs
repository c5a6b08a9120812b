//! NCCL's profiler plugin ABI, versions 4 to 6 (NCCL 2.27–2.29): the event descriptor, the
//! state arguments and the plugin's table, as `#[repr(C)]` types.
//!
//! One descriptor layout serves all three versions. Version 5 widened `type` from a byte to
//! eight bytes and appended `parentGroup` to the collective and point-to-point members; a
//! version-4 plugin reads `type` as the descriptor's first byte, which on a little-endian
//! machine is the low byte of the eight, and never reads past its 104 bytes. The loader
//! (`load.rs`) and the emitters (`mod.rs`) handle what differs in meaning: which event types
//! and states exist, and who a collective's parent is.

use std::ffi::{c_char, c_int, c_void};

// Event types: bits of the activation mask, and `Descr::ty`.
pub const GROUP: u64 = 1 << 0;
pub const COLL: u64 = 1 << 1;
pub const P2P: u64 = 1 << 2;
pub const PROXY_OP: u64 = 1 << 3;
pub const PROXY_STEP: u64 = 1 << 4;
pub const PROXY_CTRL: u64 = 1 << 5;
pub const KERNEL_CH: u64 = 1 << 6;
pub const NET_PLUGIN: u64 = 1 << 7;
/// Version 5 on.
pub const GROUP_API: u64 = 1 << 8;
pub const COLL_API: u64 = 1 << 9;
pub const P2P_API: u64 = 1 << 10;
pub const KERNEL_LAUNCH: u64 = 1 << 11;
/// Version 6 on: collectives run by the copy engines.
pub const CE_COLL: u64 = 1 << 12;
pub const CE_SYNC: u64 = 1 << 13;
pub const CE_BATCH: u64 = 1 << 14;

/// The event types of each version: a plugin of an older one never sees the newer ones.
pub const fn types_of(version: u32) -> u64 {
    match version {
        4 => (1 << 8) - 1,
        5 => (1 << 12) - 1,
        _ => (1 << 15) - 1,
    }
}

// States (`recordEventState`) this library records.
/// A kernel channel stopped (its argument: the GPU's timer then).
pub const STATE_KERNEL_CH_STOP: c_int = 22;
/// Version 5 on: the group's `ncclGroupStart` returned, its `ncclGroupEnd` began.
pub const STATE_GROUP_START_API_STOP: c_int = 23;
pub const STATE_GROUP_END_API_START: c_int = 24;
/// A proxy step (`ncclProfileProxyStep`, version 4's states): a send waits for its kernel to
/// fill the slot, then for the network; a receive waits for the network, then for its kernel
/// to consume the slot.
pub const STATE_STEP_SEND_GPU_WAIT: c_int = 8;
pub const STATE_STEP_SEND_WAIT: c_int = 9;
pub const STATE_STEP_RECV_WAIT: c_int = 10;
pub const STATE_STEP_RECV_GPU_WAIT: c_int = 12;
/// A proxy operation moved from appended to progressing (version 4's only `ProxyOp` state).
pub const STATE_PROXY_OP_IN_PROGRESS: c_int = 19;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct GroupApi {
    pub graph_captured: bool,
    pub group_depth: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct CollApi {
    pub func: *const c_char,
    pub count: usize,
    pub datatype: *const c_char,
    pub root: c_int,
    pub stream: *mut c_void,
    pub graph_captured: bool,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct P2pApi {
    pub func: *const c_char,
    pub count: usize,
    pub datatype: *const c_char,
    pub stream: *mut c_void,
    pub graph_captured: bool,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelLaunch {
    pub stream: *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Coll {
    pub seq_number: u64,
    pub func: *const c_char,
    pub send_buff: *const c_void,
    pub recv_buff: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub datatype: *const c_char,
    pub n_channels: u8,
    pub n_warps: u8,
    pub algo: *const c_char,
    pub proto: *const c_char,
    /// Version 5 on.
    pub parent_group: *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct P2p {
    pub func: *const c_char,
    pub buff: *mut c_void,
    pub datatype: *const c_char,
    pub count: usize,
    pub peer: c_int,
    pub n_channels: u8,
    /// Version 5 on.
    pub parent_group: *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProxyOp {
    pub pid: c_int,
    pub channel_id: u8,
    pub peer: c_int,
    pub n_steps: c_int,
    pub chunk_size: c_int,
    pub is_send: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProxyStep {
    pub step: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelCh {
    pub channel_id: u8,
    pub p_timer: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct CeColl {
    pub seq_number: u64,
    pub func: *const c_char,
    pub send_buff: *const c_void,
    pub recv_buff: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub datatype: *const c_char,
    pub sync_strategy: *const c_char,
    pub intra_batch_sync: bool,
    pub batch_size: u32,
    pub num_batches: u32,
    pub ce_seq_num: u32,
    pub stream: *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct CeSync {
    pub is_complete: bool,
    pub n_ranks: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct CeBatch {
    pub num_ops: c_int,
    pub total_bytes: usize,
    pub use_intra_sync: bool,
}

/// The member of the descriptor's union that `ty` selects.
#[repr(C)]
#[derive(Clone, Copy)]
pub union Body {
    pub group_api: GroupApi,
    pub coll_api: CollApi,
    pub p2p_api: P2pApi,
    pub kernel_launch: KernelLaunch,
    pub coll: Coll,
    pub p2p: P2p,
    pub proxy_op: ProxyOp,
    pub proxy_step: ProxyStep,
    pub kernel_ch: KernelCh,
    pub ce_coll: CeColl,
    pub ce_sync: CeSync,
    pub ce_batch: CeBatch,
    /// Zeroes the whole union (NCCL hands plugins zeroed descriptors).
    pub words: [u64; 11],
}

/// `ncclProfilerEventDescr_v5_t` / `_v6_t` (and `_v4_t` read through its first 104 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Descr {
    pub ty: u64,
    pub parent_obj: *mut c_void,
    pub rank: c_int,
    pub body: Body,
}

impl Descr {
    /// A zeroed descriptor of event type `ty` under `parent`, for `rank`.
    pub fn new(ty: u64, parent: *mut c_void, rank: c_int) -> Descr {
        Descr {
            ty,
            parent_obj: parent,
            rank,
            body: Body { words: [0; 11] },
        }
    }
}

/// `ncclDebugLogger_t`.
pub use crate::plugin_log::Logger as LogFn;
/// Versions 5 and 6: `init(context, commId, eActivationMask, commName, nNodes, nranks, rank,
/// logfn)`.
pub type InitV5 = unsafe extern "C" fn(
    *mut *mut c_void,
    u64,
    *mut c_int,
    *const c_char,
    c_int,
    c_int,
    c_int,
    LogFn,
) -> c_int;
/// Version 4: `init(context, eActivationMask, commName, commHash, nNodes, nranks, rank,
/// logfn)`.
pub type InitV4 = unsafe extern "C" fn(
    *mut *mut c_void,
    *mut c_int,
    *const c_char,
    u64,
    c_int,
    c_int,
    c_int,
    LogFn,
) -> c_int;
pub type StartFn = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut Descr) -> c_int;
pub type StopFn = unsafe extern "C" fn(*mut c_void) -> c_int;
/// `recordEventState(eHandle, state, args)`: the arguments are one 8-byte union.
pub type RecordFn = unsafe extern "C" fn(*mut c_void, c_int, *mut u64) -> c_int;
pub type FinalizeFn = unsafe extern "C" fn(*mut c_void) -> c_int;

/// `ncclProfiler_vN_t`: a name and five functions; `init`'s signature depends on the version.
#[repr(C)]
pub struct Table<I> {
    pub name: *const c_char,
    pub init: I,
    pub start_event: StartFn,
    pub stop_event: StopFn,
    pub record_event_state: RecordFn,
    pub finalize: FinalizeFn,
}

// The offsets NCCL's headers give (x86_64 and aarch64, LP64).
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<Descr>() == 112);
    assert!(offset_of!(Descr, body) == 24);
    assert!(offset_of!(Coll, algo) == 88 - 24);
    assert!(offset_of!(Coll, parent_group) == 104 - 24);
    assert!(offset_of!(P2p, n_channels) == 60 - 24);
    assert!(offset_of!(P2p, parent_group) == 64 - 24);
    assert!(offset_of!(CollApi, graph_captured) == 64 - 24);
    assert!(offset_of!(ProxyOp, is_send) == 44 - 24);
    assert!(offset_of!(CeColl, stream) == 104 - 24);
    assert!(offset_of!(KernelCh, p_timer) == 32 - 24);
    assert!(offset_of!(CeBatch, use_intra_sync) == 40 - 24);
    assert!(size_of::<Table<InitV5>>() == 48);
};
