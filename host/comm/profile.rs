//! A communicator's side of the profiler plugin (`crate::profiler`): a call's [`Task`] from its
//! API event to its launch's events, and the names NCCL gives plugins for what it launches.

use super::call::{CollCall, P2pOp};
use super::group_scope;
use super::plan::LaunchPlan;
use super::Comm;
use crate::cuda::{Device, HostMem, StreamHandle};
use crate::error::Result;
use crate::profiler::{ApiCall, CeLaunch, CollLaunch, CommProfiler, Event, P2pLaunch, KERNEL_CH};
use crate::transport::Dir;
use crate::tune::Coll;
use nccl_device::abi::{ChannelStamp, MAX_CHANNELS, PROFILE_LAUNCHES, PROTO_LL, PROTO_LL128};
use nccl_device::abi::{ALGO_NVLS, ALGO_PAT, ALGO_RING, ALGO_SYMMETRIC, ALGO_TREE};
use nccl_device::types::DataType;
use std::collections::VecDeque;
use std::ffi::{c_void, CStr};
use std::mem::size_of;
use std::sync::{Arc, Mutex};

/// A communicator's profiling: its context in the plugin, and the ring its kernels stamp
/// their channels' times in.
pub(crate) struct Profiling {
    pub prof: Arc<CommProfiler>,
    pub stamps: Arc<ChannelStamps>,
}

impl Profiling {
    /// Opens the communicator's context where a plugin is loaded (`open`), with the ring of
    /// channel stamps in host memory of `device`.
    pub(crate) fn new(prof: Arc<CommProfiler>, device: &Device) -> Result<Profiling> {
        let bytes = PROFILE_LAUNCHES as usize * MAX_CHANNELS * size_of::<ChannelStamp>();
        let stamps = Arc::new(ChannelStamps {
            mem: device.alloc_host_mem(bytes)?,
            prof: prof.clone(),
            state: Mutex::new(StampState::default()),
        });
        Ok(Profiling { prof, stamps })
    }
}

/// The kernels' channel stamps ([`nccl_device::abi::DevComm::profile_stamps`]) and the
/// launches whose `KernelCh` events wait on them: a launch's channels become events once all
/// of its CTAs stamped their stop (at the communicator's next timed launch, or when it goes).
pub(crate) struct ChannelStamps {
    mem: HostMem,
    /// The context the channels are reported to (kept open until they are: the drop drains).
    prof: Arc<CommProfiler>,
    state: Mutex<StampState>,
}

#[derive(Default)]
struct StampState {
    /// Timed launches so far (the last one's `profile_slot`).
    launches: u32,
    pending: VecDeque<Pending>,
}

/// A timed launch whose channels are not all reported yet.
struct Pending {
    slot: u32,
    coll: Event,
    /// Per channel, whether its event went out.
    reported: Vec<bool>,
}

impl ChannelStamps {
    /// Where the kernels stamp.
    pub(crate) fn device_ptr(&self) -> u64 {
        self.mem.ptr
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StampState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reports every channel that stamped its stop, oldest launch first.
    fn drain(&self, st: &mut StampState) {
        let size = size_of::<ChannelStamp>();
        for p in st.pending.iter_mut() {
            let base = (p.slot % PROFILE_LAUNCHES) as usize * MAX_CHANNELS;
            for (c, done) in p.reported.iter_mut().enumerate() {
                let at = (base + c) * size;
                let word = |k: usize| self.mem.load_u64(at + 8 * k).unwrap_or(0);
                if *done || word(0) != p.slot as u64 {
                    continue;
                }
                // The times were written before the slot number: read them after it.
                std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
                self.prof.kernel_channel(p.coll, c as u32, word(1), word(2));
                *done = true;
            }
        }
        st.pending.retain(|p| p.reported.iter().any(|d| !d));
    }

    /// The `profile_slot` of the next launch (reports what earlier ones finished first). A
    /// launch a whole ring older that is still unreported is given up (its place is reused).
    fn next_slot(&self) -> u32 {
        let mut st = self.lock();
        self.drain(&mut st);
        st.launches = st.launches.wrapping_add(1).max(1);
        let slot = st.launches;
        let stale = |p: &Pending| p.slot % PROFILE_LAUNCHES == slot % PROFILE_LAUNCHES;
        if st.pending.iter().any(stale) {
            log::info!("profiler: a launch's channel times were never stamped: not reported");
            st.pending.retain(|p| !stale(p));
        }
        slot
    }

    /// Launch `slot` of `channels` CTAs went out under `coll`.
    fn launched(&self, slot: u32, channels: u32, coll: Event) {
        self.lock().pending.push_back(Pending {
            slot,
            coll,
            reported: vec![false; (channels as usize).min(MAX_CHANNELS)],
        });
    }
}

impl Drop for ChannelStamps {
    /// The communicator's kernels are done (its drop waits for them): what they stamped goes
    /// out before the contexts close.
    fn drop(&mut self) {
        let mut st = std::mem::take(&mut *self.lock());
        self.drain(&mut st);
    }
}

/// A call's profiling: its group's `GroupApi` event and its own API event, with the mask as it
/// was when the call was made (NCCL keeps that snapshot for the call's later events).
#[derive(Clone)]
pub(crate) struct Task {
    prof: Arc<CommProfiler>,
    stamps: Arc<ChannelStamps>,
    mask: u64,
    group_api: Event,
    api: Event,
    /// The call's stream was being captured into a CUDA graph.
    captured: bool,
}

impl Task {
    /// The call is queued: its API event ends.
    pub(crate) fn queued(&self) {
        self.prof.stop(self.api);
    }

    /// Runs `launch` (a kernel launch on `stream`) inside a `KernelLaunch` event.
    pub(crate) fn launch<R>(&self, stream: StreamHandle, launch: impl FnOnce() -> R) -> R {
        let e = self
            .prof
            .kernel_launch(self.mask, self.group_api, stream_ptr(stream));
        let r = launch();
        self.prof.stop(e);
        r
    }

    /// Launches collective `c` as `plan` (`launch`): inside a `KernelLaunch` event, then its
    /// `Group` and `Coll` events; where `KernelCh` is asked for (and the stream is not being
    /// captured: a graph's replays would reuse one slot), its CTAs stamp their times,
    /// reported as the communicator's later launches find them.
    pub(crate) fn launch_coll(
        &self,
        plan: &mut LaunchPlan,
        stream: StreamHandle,
        c: &CollLaunch,
        launch: impl FnOnce(&LaunchPlan) -> Result<()>,
        proxy_ops: impl FnOnce(&LaunchPlan, super::proxy_ops::Profiled),
    ) -> Result<()> {
        let timed = self.mask & KERNEL_CH != 0 && !self.captured;
        if timed {
            plan.args.profile_slot = self.stamps.next_slot();
        }
        self.launch(stream, || launch(plan))?;
        let g = self.prof.group(self.mask);
        let e = self.prof.coll(self.mask, self.api, g, c);
        proxy_ops(plan, Some((self.prof.clone(), self.mask, e)));
        if timed {
            self.stamps.launched(plan.args.profile_slot, plan.grid, e);
        }
        self.prof.stop(e);
        self.prof.stop(g);
        Ok(())
    }

    /// Sends and receives of one communicator were launched together: a `Group` event with
    /// a `P2p` event per operation (`ops`: each one's task and what it moved).
    /// Returns, per operation, what its proxy events hang from (`super::proxy_ops::Profiled`:
    /// its `P2p` event).
    pub(crate) fn launched_p2p(ops: &[(&Task, P2pLaunch)]) -> Vec<super::proxy_ops::Profiled> {
        let Some((first, _)) = ops.first() else {
            return Vec::new();
        };
        let g = first.prof.group(first.mask);
        let mut parents = Vec::with_capacity(ops.len());
        for (t, p) in ops {
            let e = t.prof.p2p(t.mask, t.api, g, p);
            t.prof.stop(e);
            parents.push(Some((t.prof.clone(), t.mask, e)));
        }
        first.prof.stop(g);
        parents
    }

    /// Runs `copies` (`ops` copy-engine copies of `bytes` in all) inside a `CeColl` event
    /// and its `CeBatch`.
    pub(crate) fn copy_engines<R>(
        &self,
        c: &CeLaunch,
        ops: usize,
        bytes: usize,
        copies: impl FnOnce() -> R,
    ) -> R {
        let ce = self.prof.ce_coll(self.mask, self.api, c);
        let batch = self.prof.ce_batch(self.mask, ce, ops, bytes);
        let r = copies();
        self.prof.stop(batch);
        self.prof.stop(ce);
        r
    }
}

impl Comm {
    /// Whether a call now would be profiled (a plugin is loaded and its mask asks for
    /// something): the enqueue layer then wraps a call outside any group in a group of its
    /// own, as NCCL does, so that the call has its `GroupApi` event.
    pub(crate) fn profiling(&self) -> bool {
        self.profiler.as_ref().is_some_and(|p| p.prof.mask() != 0)
    }

    /// Starts a call's API event (a `CollApi`, or with `p2p` a `P2pApi`, of what `call`
    /// describes), and its group's `GroupApi` if it is the group's first profiled call; None
    /// where nothing is profiled, or the caller is in no group (the mask was off when the
    /// call chose not to open one). Costs one test where no plugin is loaded.
    pub(crate) fn profile_call(&self, p2p: bool, call: impl FnOnce() -> ApiCall) -> Option<Task> {
        let Profiling { prof, stamps } = self.profiler.as_ref()?;
        let mask = prof.mask();
        if mask == 0 || group_scope::depth() == 0 {
            return None;
        }
        let call = &call();
        let group_api = group_scope::profiled_group(prof, mask, call.graph_captured);
        let api = prof.api(mask, p2p, group_api, call);
        Some(Task {
            prof: prof.clone(),
            stamps: stamps.clone(),
            mask,
            group_api,
            api,
            captured: call.graph_captured,
        })
    }

    /// What the API event of a call on `stream` says, for [`Comm::profile_call`].
    pub(crate) fn api_call(
        &self,
        func: &'static CStr,
        count: usize,
        dt: DataType,
        root: usize,
        stream: StreamHandle,
    ) -> ApiCall {
        ApiCall {
            func,
            count,
            datatype: datatype_name(dt),
            root: root as i32,
            stream: stream_ptr(stream),
            graph_captured: self.device.stream_capturing(stream).unwrap_or(false),
        }
    }
}

/// What a `Coll` event says of `call` launched as `plan`: the copies (Broadcast, AllGather)
/// in bytes of `ncclInt8`, as NCCL reports them.
pub(crate) fn coll_launch(call: &CollCall, plan: &LaunchPlan) -> CollLaunch {
    let (count, dt) = match call.coll.copies() {
        true => (call.count * call.dt.size(), DataType::Int8),
        false => (call.count, call.dt),
    };
    CollLaunch {
        func: coll_name(call.coll),
        send: call.send as usize as *const c_void,
        recv: call.recv as usize as *mut c_void,
        count,
        root: call.root as i32,
        datatype: datatype_name(dt),
        channels: plan.grid,
        warps: plan.block.div_ceil(32),
        algo: algo_name(plan.args.algo),
        proto: proto_name(plan.args.proto),
    }
}

/// What a `P2p` event says of `op`, a call of `count` elements of `dt` (`conns`: the
/// connections it is spread over).
pub(crate) fn p2p_launch(op: &P2pOp, count: usize, dt: DataType, conns: usize) -> P2pLaunch {
    P2pLaunch {
        func: p2p_name(op.dir),
        buff: op.buff as usize as *mut c_void,
        datatype: datatype_name(dt),
        count,
        peer: op.peer as i32,
        channels: conns as u32,
    }
}

/// NCCL's name of a send or a receive.
pub(crate) fn p2p_name(dir: Dir) -> &'static CStr {
    match dir {
        Dir::Send => c"Send",
        Dir::Recv => c"Recv",
    }
}

/// A stream as the plugin sees it (`cudaStream_t`).
pub(crate) fn stream_ptr(s: StreamHandle) -> *mut c_void {
    s.0 as usize as *mut c_void
}

/// NCCL's name of a collective (`ncclFuncToString`).
pub(crate) fn coll_name(c: Coll) -> &'static CStr {
    match c {
        Coll::Broadcast => c"Broadcast",
        Coll::Reduce => c"Reduce",
        Coll::AllGather => c"AllGather",
        Coll::ReduceScatter => c"ReduceScatter",
        Coll::AllReduce => c"AllReduce",
    }
}

/// NCCL's name of a type (`ncclDatatypeToString`; NCCL says "Unknown" for uint8, a slip
/// not copied here).
pub(crate) fn datatype_name(dt: DataType) -> &'static CStr {
    match dt {
        DataType::Int8 => c"ncclInt8",
        DataType::Uint8 => c"ncclUint8",
        DataType::Int32 => c"ncclInt32",
        DataType::Uint32 => c"ncclUint32",
        DataType::Int64 => c"ncclInt64",
        DataType::Uint64 => c"ncclUint64",
        DataType::Float16 => c"ncclFloat16",
        DataType::Float32 => c"ncclFloat32",
        DataType::Float64 => c"ncclFloat64",
        DataType::Bfloat16 => c"ncclBfloat16",
        DataType::Float8e4m3 => c"ncclFloat8e4m3",
        DataType::Float8e5m2 => c"ncclFloat8e5m2",
    }
}

/// NCCL's name of a launch's algorithm; the symmetric kernels, which NCCL's plugins know by
/// no name of NCCL's seven, are "SYMMETRIC".
pub(crate) fn algo_name(algo: u32) -> &'static CStr {
    match algo {
        ALGO_TREE => c"TREE",
        ALGO_PAT => c"PAT",
        ALGO_RING => c"RING",
        ALGO_NVLS => c"NVLS",
        ALGO_SYMMETRIC => c"SYMMETRIC",
        _ => c"UNKNOWN",
    }
}

/// NCCL's name of a launch's protocol.
pub(crate) fn proto_name(proto: u32) -> &'static CStr {
    match proto {
        PROTO_LL => c"LL",
        PROTO_LL128 => c"LL128",
        _ => c"SIMPLE",
    }
}
