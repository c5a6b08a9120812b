//! NCCL's profiler plugin (`NCCL_PROFILER_PLUGIN`, ABI versions 4 to 6): a communicator
//! hands the plugin its events, and the plugin times them.
//!
//! Each communicator opens a context of its own in the process's plugin (`init`, closed by
//! `finalize` when the communicator goes). The activation mask is one word per process, as in
//! NCCL: the plugin writes it through the pointer `init` receives, at once or later, and an
//! event is started only where the mask asks for it or for one of its descendants. What this
//! module emits and when (the callers: `comm/profile.rs`, the group's end in `enqueue/group.rs`):
//!
//! - `GroupApi` (v5+): from the first operation of an outermost group (a call outside any
//!   group is a group of its own) to the end of its `ncclGroupEnd`, with the states
//!   `GroupStartApiStop` at its start and `GroupEndApiStart` when the group ends;
//! - `CollApi` / `P2pApi` (v5+): one per call, started and stopped while the call is queued,
//!   with the user's count and type;
//! - `KernelLaunch` (v5+): around each kernel launch;
//! - `Group`, `Coll`, `P2p`: at the launch, with what was chosen (algorithm, protocol, CTAs,
//!   warps); a `Coll`'s parent is its `CollApi` (v4: its `Group`);
//! - `CeColl` and `CeBatch` (v6): collectives run as copy-engine copies.
//!
//! - `KernelCh`: a collective's CTAs, from the GPU's timer stamps (`comm/profile.rs`).
//!
//! - `ProxyOp` and `ProxyStep`: a collective's (ring, double binary tree, PAT) or a send/recv
//!   batch's steps on each network connection, emitted by the proxy thread (`proxy/ops.rs`).
//!
//! Like NCCL, a stopped event's handle may still be another's parent: plugins keep handles valid
//! after `stopEvent`. Not emitted yet: proxy control.

mod abi;
mod load;

pub(crate) use abi::P2P;
pub(crate) use abi::{
    CE_BATCH, CE_COLL, COLL, COLL_API, GROUP, GROUP_API, KERNEL_CH, KERNEL_LAUNCH,
};
pub(crate) use abi::{P2P_API, STATE_GROUP_END_API_START, STATE_GROUP_START_API_STOP};
pub(crate) use abi::{
    STATE_STEP_RECV_GPU_WAIT, STATE_STEP_RECV_WAIT, STATE_STEP_SEND_GPU_WAIT, STATE_STEP_SEND_WAIT,
};

use abi::{Descr, CE_SYNC, NET_PLUGIN, PROXY_CTRL, PROXY_OP, PROXY_STEP};
use load::{Init, Plugin};
use std::ffi::{c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;

/// Whether a profiler plugin is loaded in this process (loading it on first ask).
pub(crate) fn loaded() -> bool {
    load::plugin().is_some()
}

/// The activation mask all contexts share (NCCL's `ncclProfilerEventMask`).
static MASK: AtomicI32 = AtomicI32::new(0);

/// The events below a collective or point-to-point operation: asking for any of them
/// starts their ancestors too.
const BELOW_OPS: u64 = PROXY_OP | PROXY_STEP | KERNEL_CH | NET_PLUGIN;

/// An event the plugin started: its handle (null where the plugin declined or the mask
/// left the event out; stopping or recording it then does nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Event(*mut c_void);

// SAFETY: a handle is an opaque value the plugin gave; the ABI lets any thread pass it back.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Event {
    pub(crate) const NONE: Event = Event(std::ptr::null_mut());

    fn ptr(self) -> *mut c_void {
        self.0
    }
}

/// What a `Coll` event says of a launch.
pub(crate) struct CollLaunch {
    pub func: &'static CStr,
    pub send: *const c_void,
    pub recv: *mut c_void,
    /// Elements (bytes of `ncclInt8` for the copies, as NCCL reports them).
    pub count: usize,
    pub root: c_int,
    pub datatype: &'static CStr,
    pub channels: u32,
    pub warps: u32,
    pub algo: &'static CStr,
    pub proto: &'static CStr,
}

/// What an API event (`CollApi`, `P2pApi`) says of a call.
pub(crate) struct ApiCall {
    pub func: &'static CStr,
    pub count: usize,
    pub datatype: &'static CStr,
    /// Collectives only (point-to-point calls have a peer instead, in their `P2p` event).
    pub root: c_int,
    pub stream: *mut c_void,
    pub graph_captured: bool,
}

/// What a `P2p` event says of one send or receive.
pub(crate) struct P2pLaunch {
    pub func: &'static CStr,
    pub buff: *mut c_void,
    pub datatype: &'static CStr,
    pub count: usize,
    pub peer: c_int,
    pub channels: u32,
}

/// What a `ProxyOp` event says of one launch's steps on one network connection.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ProxyOpDescr {
    pub channel: usize,
    pub peer: usize,
    /// FIFO steps (slots) of the launch on the connection.
    pub steps: u64,
    pub chunk_bytes: usize,
    pub send: bool,
}

/// What a `CeColl` event says of a copy-engine collective.
pub(crate) struct CeLaunch {
    pub func: &'static CStr,
    pub send: *const c_void,
    pub recv: *mut c_void,
    pub bytes: usize,
    pub stream: *mut c_void,
}

// SAFETY (the three launches' descriptions): their pointers are addresses handed to the
// plugin as values, never dereferenced here; the strings are static.
unsafe impl Send for CollLaunch {}
unsafe impl Send for P2pLaunch {}
unsafe impl Send for CeLaunch {}

/// A communicator's context in the plugin.
pub(crate) struct CommProfiler {
    plugin: &'static Plugin,
    context: *mut c_void,
    /// The communicator's name as `init` got it: plugins keep the pointer (NCCL's example
    /// reads it again at finalize), so it lives as long as the context.
    _name: Option<CString>,
    rank: c_int,
    /// Per collective (`ncclFunc_t` order), the `Coll` events started: their `seqNumber`.
    seq: [AtomicU64; 8],
    ce_seq: AtomicU64,
}

// SAFETY: the plugin's context may be used from any thread (the ABI calls it from user
// threads, the proxy and callbacks); this type only passes it back.
unsafe impl Send for CommProfiler {}
// SAFETY: as above.
unsafe impl Sync for CommProfiler {}

impl CommProfiler {
    /// Opens this communicator's context in the process's plugin; None where there is no
    /// plugin, or its `init` failed (the communicator then goes on without one, as NCCL 2.30).
    pub(crate) fn open(
        comm_hash: u64,
        name: Option<&str>,
        nnodes: usize,
        nranks: usize,
        rank: usize,
    ) -> Option<Arc<CommProfiler>> {
        let plugin = load::plugin()?;
        let name = name.and_then(|n| CString::new(n).ok());
        let name_ptr = name.as_ref().map_or(std::ptr::null(), |n| n.as_ptr());
        let mut context = std::ptr::null_mut();
        let (nn, nr, r) = (nnodes as c_int, nranks as c_int, rank as c_int);
        let log = crate::plugin_log::logger_fn();
        // SAFETY: the plugin's init of its version's signature: the context and mask outlive
        // the call (the mask is static, as NCCL's), the name is NUL-terminated or null.
        let rc = unsafe {
            match plugin.init {
                Init::V5(f) => f(
                    &mut context,
                    comm_hash,
                    MASK.as_ptr(),
                    name_ptr,
                    nn,
                    nr,
                    r,
                    log,
                ),
                Init::V4(f) => f(
                    &mut context,
                    MASK.as_ptr(),
                    name_ptr,
                    comm_hash,
                    nn,
                    nr,
                    r,
                    log,
                ),
            }
        };
        if rc != 0 {
            log::info!(
                "PROFILER/Plugin: {}'s init failed ({rc}) for rank {rank}: this communicator \
                 goes on without a profiler",
                plugin.name
            );
            return None;
        }
        if plugin.version < 6 {
            // Its version has no copy-engine events.
            MASK.fetch_and(!((CE_COLL | CE_SYNC | CE_BATCH) as i32), Ordering::Relaxed);
        }
        log::info!(
            "PROFILER/Plugin: rank {rank}: {} (v{}), event mask 0x{:x}",
            plugin.name,
            plugin.version,
            MASK.load(Ordering::Relaxed)
        );
        Some(Arc::new(CommProfiler {
            plugin,
            context,
            _name: name,
            rank: r,
            seq: Default::default(),
            ce_seq: AtomicU64::new(0),
        }))
    }

    /// The event types asked for now, of those the plugin's version has.
    pub(crate) fn mask(&self) -> u64 {
        MASK.load(Ordering::Relaxed) as u32 as u64 & abi::types_of(self.plugin.version)
    }

    fn start(&self, mut d: Descr) -> Event {
        if d.ty & abi::types_of(self.plugin.version) == 0 {
            return Event::NONE;
        }
        let mut handle = std::ptr::null_mut();
        // SAFETY: the descriptor is a zeroed `ncclProfilerEventDescr_v6_t` whose strings are
        // static; the handle slot outlives the call.
        unsafe { (self.plugin.start)(self.context, &mut handle, &mut d) };
        Event(handle)
    }

    /// Stops `e` (nothing for [`Event::NONE`]).
    pub(crate) fn stop(&self, e: Event) {
        if !e.ptr().is_null() {
            // SAFETY: a handle this plugin returned.
            unsafe { (self.plugin.stop)(e.ptr()) };
        }
    }

    /// Records state `state` of `e` with the 8 bytes of `arg` (none: a null pointer).
    pub(crate) fn record(&self, e: Event, state: c_int, arg: Option<u64>) {
        let api_state = state == STATE_GROUP_START_API_STOP || state == STATE_GROUP_END_API_START;
        if e.ptr().is_null() || (self.plugin.version < 5 && api_state) {
            return;
        }
        let mut a = arg.unwrap_or(0);
        let args = match arg {
            Some(_) => &mut a as *mut u64,
            None => std::ptr::null_mut(),
        };
        // SAFETY: a handle this plugin returned; the arguments are one 8-byte union or null.
        unsafe { (self.plugin.record)(e.ptr(), state, args) };
    }

    /// Starts a group's `GroupApi` event (`depth`: the group nesting, 1 for a call outside
    /// any group) and records `GroupStartApiStop`.
    pub(crate) fn group_api(&self, mask: u64, depth: u32, graph_captured: bool) -> Event {
        if mask & !PROXY_CTRL == 0 {
            return Event::NONE;
        }
        let mut d = Descr::new(GROUP_API, std::ptr::null_mut(), 0);
        d.body.group_api = abi::GroupApi {
            graph_captured,
            group_depth: depth as c_int,
        };
        let e = self.start(d);
        self.record(e, STATE_GROUP_START_API_STOP, None);
        e
    }

    /// Starts a call's `CollApi` (a collective) or `P2pApi` event under its group's.
    pub(crate) fn api(&self, mask: u64, p2p: bool, group: Event, c: &ApiCall) -> Event {
        let mut d;
        if p2p {
            if mask & (P2P_API | P2P | BELOW_OPS) == 0 {
                return Event::NONE;
            }
            d = Descr::new(P2P_API, group.ptr(), 0);
            d.body.p2p_api = abi::P2pApi {
                func: c.func.as_ptr(),
                count: c.count,
                datatype: c.datatype.as_ptr(),
                stream: c.stream,
                graph_captured: c.graph_captured,
            };
        } else {
            if mask & (COLL_API | COLL | BELOW_OPS | CE_COLL | CE_SYNC | CE_BATCH) == 0 {
                return Event::NONE;
            }
            d = Descr::new(COLL_API, group.ptr(), 0);
            d.body.coll_api = abi::CollApi {
                func: c.func.as_ptr(),
                count: c.count,
                datatype: c.datatype.as_ptr(),
                root: c.root,
                stream: c.stream,
                graph_captured: c.graph_captured,
            };
        }
        self.start(d)
    }

    /// Starts a `KernelLaunch` event on `stream` under the group's `GroupApi`.
    pub(crate) fn kernel_launch(&self, mask: u64, group: Event, stream: *mut c_void) -> Event {
        if mask & KERNEL_LAUNCH == 0 {
            return Event::NONE;
        }
        let mut d = Descr::new(KERNEL_LAUNCH, group.ptr(), 0);
        d.body.kernel_launch = abi::KernelLaunch { stream };
        self.start(d)
    }

    /// Starts a launch's `Group` event (NCCL's gate: either kind of operation below it).
    pub(crate) fn group(&self, mask: u64) -> Event {
        if mask & (GROUP | COLL | P2P | BELOW_OPS) == 0 {
            return Event::NONE;
        }
        self.start(Descr::new(GROUP, std::ptr::null_mut(), 0))
    }

    /// Starts a launch's `Coll` event: its parent the call's `CollApi` (v4: the `Group`).
    pub(crate) fn coll(&self, mask: u64, api: Event, group: Event, c: &CollLaunch) -> Event {
        // Counted whether or not the event starts (every profiled launch), as NCCL counts.
        let seq = self.seq[func_index(c.func)].fetch_add(1, Ordering::Relaxed);
        if mask & (COLL | BELOW_OPS) == 0 {
            return Event::NONE;
        }
        let parent = if self.plugin.version == 4 { group } else { api };
        let mut d = Descr::new(COLL, parent.ptr(), self.rank);
        d.body.coll = abi::Coll {
            seq_number: seq,
            func: c.func.as_ptr(),
            send_buff: c.send,
            recv_buff: c.recv,
            count: c.count,
            root: c.root,
            datatype: c.datatype.as_ptr(),
            n_channels: c.channels.min(255) as u8,
            n_warps: c.warps.min(255) as u8,
            algo: c.algo.as_ptr(),
            proto: c.proto.as_ptr(),
            parent_group: group.ptr(),
        };
        self.start(d)
    }

    /// Starts a `ProxyOp` event under the `Coll` or `P2p` event `parent`: the steps of one
    /// launch on one network connection, as the proxy thread moves them (`proxy/ops.rs`).
    pub(crate) fn proxy_op(&self, mask: u64, parent: Event, op: &ProxyOpDescr) -> Event {
        if mask & (PROXY_OP | PROXY_STEP) == 0 {
            return Event::NONE;
        }
        let mut d = Descr::new(PROXY_OP, parent.ptr(), self.rank);
        d.body.proxy_op = abi::ProxyOp {
            pid: std::process::id() as c_int,
            channel_id: op.channel.min(255) as u8,
            peer: op.peer as c_int,
            n_steps: op.steps.min(c_int::MAX as u64) as c_int,
            chunk_size: op.chunk_bytes.min(c_int::MAX as usize) as c_int,
            is_send: op.send as c_int,
        };
        let e = self.start(d);
        self.record(e, abi::STATE_PROXY_OP_IN_PROGRESS, None);
        e
    }

    /// Starts a `ProxyStep` event, step `step` of the `ProxyOp` event `op`.
    pub(crate) fn proxy_step(&self, mask: u64, op: Event, step: u64) -> Event {
        if mask & PROXY_STEP == 0 {
            return Event::NONE;
        }
        let mut d = Descr::new(PROXY_STEP, op.ptr(), self.rank);
        d.body.proxy_step = abi::ProxyStep {
            step: step.min(c_int::MAX as u64) as c_int,
        };
        self.start(d)
    }

    /// Starts a launch's `P2p` event: its parent the call's `P2pApi` (v4: the `Group`).
    pub(crate) fn p2p(&self, mask: u64, api: Event, group: Event, p: &P2pLaunch) -> Event {
        if mask & (P2P | BELOW_OPS) == 0 {
            return Event::NONE;
        }
        let parent = if self.plugin.version == 4 { group } else { api };
        let mut d = Descr::new(P2P, parent.ptr(), self.rank);
        d.body.p2p = abi::P2p {
            func: p.func.as_ptr(),
            buff: p.buff,
            datatype: p.datatype.as_ptr(),
            count: p.count,
            peer: p.peer,
            n_channels: p.channels.min(255) as u8,
            parent_group: group.ptr(),
        };
        self.start(d)
    }

    /// A channel of a launch ran from `start` to `stop` (the GPU's ns timer): its `KernelCh`
    /// event under the launch's `Coll`, started, stopped with `KernelChStop`, stopped.
    pub(crate) fn kernel_channel(&self, coll: Event, channel: u32, start: u64, stop: u64) {
        let mut d = Descr::new(KERNEL_CH, coll.ptr(), 0);
        d.body.kernel_ch = abi::KernelCh {
            channel_id: channel.min(255) as u8,
            p_timer: start,
        };
        let e = self.start(d);
        self.record(e, abi::STATE_KERNEL_CH_STOP, Some(stop));
        self.stop(e);
    }

    /// Starts a `CeColl` event under the call's `CollApi` (`sync`: "UC", the copies'
    /// handshakes through peers' memory; NCCL says "MC" for its multicast form).
    pub(crate) fn ce_coll(&self, mask: u64, api: Event, c: &CeLaunch) -> Event {
        if mask & (CE_COLL | CE_SYNC | CE_BATCH) == 0 {
            return Event::NONE;
        }
        let seq = self.ce_seq.fetch_add(1, Ordering::Relaxed);
        let mut d = Descr::new(CE_COLL, api.ptr(), self.rank);
        d.body.ce_coll = abi::CeColl {
            seq_number: seq,
            func: c.func.as_ptr(),
            send_buff: c.send,
            recv_buff: c.recv,
            count: c.bytes,
            root: 0,
            datatype: c"ncclInt8".as_ptr(),
            sync_strategy: c"UC".as_ptr(),
            intra_batch_sync: false,
            batch_size: 0,
            num_batches: 0,
            ce_seq_num: seq as u32,
            stream: c.stream,
        };
        self.start(d)
    }

    /// Starts a `CeBatch` event (`ops` copies of `bytes` in all) under `ce_coll`.
    pub(crate) fn ce_batch(&self, mask: u64, ce_coll: Event, ops: usize, bytes: usize) -> Event {
        if mask & CE_BATCH == 0 || ce_coll == Event::NONE {
            return Event::NONE;
        }
        let mut d = Descr::new(CE_BATCH, ce_coll.ptr(), self.rank);
        d.body.ce_batch = abi::CeBatch {
            num_ops: ops as c_int,
            total_bytes: bytes,
            use_intra_sync: false,
        };
        self.start(d)
    }
}

/// The `seqNumber` counter of a collective's name.
fn func_index(func: &CStr) -> usize {
    const NAMES: [&str; 7] = [
        "Broadcast",
        "Reduce",
        "AllGather",
        "ReduceScatter",
        "AllReduce",
        "AlltoAll",
        "Gather",
    ];
    let f = func.to_str().unwrap_or("");
    NAMES.iter().position(|n| *n == f).unwrap_or(7)
}

impl Drop for CommProfiler {
    /// Closes the context (NCCL finalizes only a context `init` set).
    fn drop(&mut self) {
        if !self.context.is_null() {
            // SAFETY: the context this plugin's init gave; nothing uses it after this.
            unsafe { (self.plugin.finalize)(self.context) };
        }
    }
}
