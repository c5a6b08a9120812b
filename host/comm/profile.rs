//! A communicator's side of the profiler plugin (`crate::profiler`): a call's [`Task`] from its
//! API event to its launch's events, and the names NCCL gives plugins for what it launches.

use super::call::{CollCall, P2pOp};
use super::group_scope;
use super::plan::LaunchPlan;
use super::Comm;
use crate::cuda::StreamHandle;
use crate::profiler::{ApiCall, CeLaunch, CollLaunch, CommProfiler, Event, P2pLaunch};
use crate::transport::Dir;
use crate::tune::Coll;
use nccl_device::abi::{ALGO_NVLS, ALGO_RING, ALGO_SYMMETRIC, ALGO_TREE};
use nccl_device::abi::{PROTO_LL, PROTO_LL128};
use nccl_device::types::DataType;
use std::ffi::{c_void, CStr};
use std::sync::Arc;

/// A call's profiling: its group's `GroupApi` event and its own API event, with the mask as it
/// was when the call was made (NCCL keeps that snapshot for the call's later events).
#[derive(Clone)]
pub(crate) struct Task {
    prof: Arc<CommProfiler>,
    mask: u64,
    group_api: Event,
    api: Event,
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

    /// A collective was launched: its `Group` and `Coll` events.
    pub(crate) fn launched_coll(&self, c: &CollLaunch) {
        let g = self.prof.group(self.mask, false);
        let e = self.prof.coll(self.mask, self.api, g, c);
        self.prof.stop(e);
        self.prof.stop(g);
    }

    /// Sends and receives of one communicator were launched together: a `Group` event with
    /// a `P2p` event per operation (`ops`: each one's task and what it moved).
    pub(crate) fn launched_p2p(ops: &[(&Task, P2pLaunch)]) {
        let Some((first, _)) = ops.first() else {
            return;
        };
        let g = first.prof.group(first.mask, true);
        for (t, p) in ops {
            let e = t.prof.p2p(t.mask, t.api, g, p);
            t.prof.stop(e);
        }
        first.prof.stop(g);
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
        self.profiler.as_ref().is_some_and(|p| p.mask() != 0)
    }

    /// Starts a call's API event (a `CollApi`, or with `p2p` a `P2pApi`), and its group's
    /// `GroupApi` if it is the group's first profiled call; None where nothing is profiled.
    /// The caller is inside a group (its own, for a call outside any).
    pub(crate) fn profile_call(&self, p2p: bool, call: &ApiCall) -> Option<Task> {
        let prof = self.profiler.as_ref()?;
        let mask = prof.mask();
        if mask == 0 {
            return None;
        }
        let group_api = group_scope::profiled_group(prof, mask, call.graph_captured);
        let api = prof.api(mask, p2p, group_api, call);
        Some(Task {
            prof: prof.clone(),
            mask,
            group_api,
            api,
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

/// What a `P2p` event says of `op` (`conns`: the connections it is spread over).
pub(crate) fn p2p_launch(op: &P2pOp, conns: usize) -> P2pLaunch {
    P2pLaunch {
        func: match op.dir {
            Dir::Send => c"Send",
            Dir::Recv => c"Recv",
        },
        buff: op.buff as usize as *mut c_void,
        datatype: c"ncclInt8",
        count: op.bytes,
        peer: op.peer as i32,
        channels: conns as u32,
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
