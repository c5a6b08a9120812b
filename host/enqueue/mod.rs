//! Turns collective calls into kernel launches: checks the arguments and buffers, asks the
//! communicator for the launch plan (`Comm::plan`), and launches it on the user's stream in
//! the communicator's order (at once, or when the thread's group ends).

mod deterministic;
pub mod group;
pub mod p2p;
mod patterns;

/// The communicator's launch order, which moved down to the communicator layer that owns it
/// (this path stays for code that named it here).
// For the tests, through the `internals` feature.
#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use crate::comm::order;

use crate::comm::copy_engine::CopyColl;
use crate::comm::profile::{coll_launch, coll_name, Task};
use crate::comm::{call_bytes, Comm, LaunchPlan, Sizes};
use crate::comm::{CollCall, Scalar};
use crate::cuda::DevPtr;
use crate::error::{Error, Result};
use nccl_device::abi::Coll;
use nccl_device::ops::RedOpKind;
use nccl_device::types::DataType;

/// The model's time for `call` in µs (0 for an empty call), for ncclGroupSimulateEnd.
pub fn estimate_us(comm: &Comm, call: &CollCall) -> f64 {
    if call.count == 0 {
        return 0.0;
    }
    comm.choose(call).map(|c| c.est_time_us).unwrap_or(0.0)
}

/// Checks one user buffer of `bytes` bytes for a call on `comm`: not null, aligned to its
/// elements, on the communicator's device, and all `bytes` inside its allocation.
pub(crate) fn check_buffer(
    comm: &Comm,
    what: &str,
    p: DevPtr,
    bytes: usize,
    dt: DataType,
) -> Result<()> {
    if p == 0 {
        return Err(Error::invalid_argument(format!("{what} is a null pointer")));
    }
    if !p.is_multiple_of(dt.size() as u64) {
        return Err(Error::invalid_argument(format!(
            "{what} {p:#x} is not aligned to its {}-byte elements ({})",
            dt.size(),
            dt.name()
        )));
    }
    let ordinal = comm.cu_device();
    match comm.device().pointer_extent(p, bytes)? {
        Some((d, avail)) if d == ordinal && avail >= bytes => Ok(()),
        Some((d, avail)) if d == ordinal => Err(Error::invalid_argument(format!(
            "{what} {p:#x} is too short: the call needs {bytes} bytes, its allocation holds \
             {avail} from there"
        ))),
        Some((d, _)) => Err(Error::invalid_argument(format!(
            "{what} {p:#x} is on device {d} but the communicator (rank {}) is on device {}",
            comm.rank(),
            ordinal
        ))),
        None => Err(Error::invalid_argument(format!(
            "{what} {p:#x} ({bytes} bytes) is not device memory"
        ))),
    }
}

/// A one-rank call that scales nothing: its result is its input (Avg divides by one), so
/// nothing runs in place and the copy engine moves it out of place, as NCCL does; no kernel, no
/// FIFO, no tuner (`bytes`: the rank's block, which is the whole buffer for one rank).
fn one_rank(comm: &Comm, c: &CollCall, bytes: usize) -> Result<()> {
    comm.leaves_some(c.coll)?;
    if c.send == c.recv {
        return Ok(()); // on one H200, ~1.0 µs of host time a call against the kernel's 5.5
    }
    // The copy shares nothing with the communicator's other work, so it takes no place in the
    // communicator's launch order: the user's stream orders it with the user's own work. That
    // order's event wait and record would cost a call about 1.5 µs of host time (two capture
    // checks and an event record, by results/h200-driver-call-costs.txt), and in a capture
    // three graph nodes instead of one (twice the replay time of NCCL's one memcpy node on an
    // H100).
    let (device, stream) = (comm.device().clone(), c.stream);
    let (dst, src) = (c.recv, c.send);
    group::ordered(move || device.copy_dtod_async(dst, src, bytes, stream))
}

/// The error of a call whose kernel `name` this build left out (`NCCL_RS_KERNELS` at build
/// time: the kernel researcher's filter).
pub(crate) fn left_out(name: &str) -> Error {
    Error::invalid_usage(format!(
        "kernel {name} is not in this build: it was built with NCCL_RS_KERNELS={:?}, which leaves \
         it out (add it to the list, or build without the variable)",
        nccl_device::kernel_set::FILTER.unwrap_or("")
    ))
}

/// A collective call: it enters the communicator and the thread's group, is checked, and its
/// plan (the communicator's) launches now or when the group ends. Where a profiler plugin
/// listens, a call outside any group is a group of its own (its events as NCCL's).
pub fn collective(comm: &Comm, call: CollCall) -> Result<()> {
    group::own_if_profiled(comm, || in_group(comm, call))
}

fn in_group(comm: &Comm, call: CollCall) -> Result<()> {
    let queued = || -> Result<()> {
        comm.enter_call(call.coll.name())?;
        let Some(sizes) = check_call(comm, &call)? else {
            return Ok(());
        };
        let task = comm.profile_call(false, || {
            let c = &call;
            comm.api_call(coll_name(c.coll), c.count, c.dt, c.root, c.stream)
        });
        let r = queue(comm, &call, &sizes, task.clone());
        if let Some(t) = &task {
            t.queued();
        }
        r
    };
    queued().map_err(|e| group::record_error(e.context(format!("nccl{}", call.coll.name()))))?;
    if group::depth() > 0 {
        comm.note_in_group(estimate_us(comm, &call));
    }
    Ok(())
}

/// Queues checked call `call` on the path it takes (`task`: its profiling).
fn queue(comm: &Comm, call: &CollCall, sizes: &Sizes, task: Option<Task>) -> Result<()> {
    if comm.count() == 1 && call.op.kind() != RedOpKind::PreMulSum {
        return one_rank(comm, call, sizes.bytes);
    }
    if deterministic::applies(comm, call) {
        return deterministic::enqueue(comm, call);
    }
    if call.coll == Coll::AllGather {
        let (s, r, b, st) = (call.send, call.recv, sizes.bytes, call.stream);
        if let Some(job) =
            comm.copy_engine_job(CopyColl::AllGather, s, r, b, st, || task.clone())?
        {
            return group::ordered(job);
        }
    }
    let plan = comm.plan(call, sizes)?;
    let launcher = comm.launcher();
    let stream = call.stream;
    let Some(task) = task else {
        return group::ordered(Box::new(move || {
            if let Err(e) = launcher.launch(&plan, stream) {
                launcher.proxy_ops_lost(&plan);
                return Err(e);
            }
            launcher.proxy_ops(&plan, None);
            Ok(())
        }));
    };
    let launched = coll_launch(call, &plan);
    group::ordered(Box::new(move || {
        let mut plan = plan;
        let launch = |p: &LaunchPlan| launcher.launch(p, stream);
        let ops = |p: &LaunchPlan, parent| launcher.proxy_ops(p, parent);
        let r = task.launch_coll(&mut plan, stream, &launched, launch, ops);
        if r.is_err() {
            launcher.proxy_ops_lost(&plan);
        }
        r
    }))
}

/// Checks a collective's arguments and buffers; None when it moves nothing (count 0).
fn check_call(comm: &Comm, c: &CollCall) -> Result<Option<Sizes>> {
    let n = comm.count();
    if call_bytes(n, c).is_none() {
        return Err(Error::invalid_argument(format!(
            "count {} of {} overflows the byte size",
            c.count,
            c.dt.name()
        )));
    }
    let bytes = c.count * c.dt.size(); // one rank's block
    let rooted = matches!(c.coll, Coll::Broadcast | Coll::Reduce);
    if rooted && c.root >= n {
        return Err(Error::invalid_argument(format!(
            "root {} is out of range (nranks {n})",
            c.root
        )));
    }
    if !nccl_device::kernel_set::built_coll(c.coll, c.dt, c.op.kind()) {
        return Err(left_out(&crate::comm::kernel_name(
            c.coll,
            c.dt,
            c.op.kind(),
        )));
    }
    if c.count == 0 {
        return Ok(None);
    }
    let me_root = c.root == comm.rank();
    let (send_bytes, recv_bytes) = match c.coll {
        Coll::AllGather => (bytes, bytes * n),
        Coll::ReduceScatter => (bytes * n, bytes),
        _ => (bytes, bytes),
    };
    let send_checked = c.coll != Coll::Broadcast || me_root;
    if send_checked {
        check_buffer(comm, "sendbuff", c.send, send_bytes, c.dt)?;
    }
    // In place with equal extents a second check would repeat the first (where it ran: a
    // Broadcast's non-root ranks check only their receive buffer).
    let checked_as_send = send_checked && c.recv == c.send && recv_bytes == send_bytes;
    if (c.coll != Coll::Reduce || me_root) && !checked_as_send {
        check_buffer(comm, "recvbuff", c.recv, recv_bytes, c.dt)?;
    }
    // A reduction's scalar in device memory, read by the kernel (copies take no reduction).
    if let Some(Scalar::Device(scalar)) = c.op.scalar().filter(|_| !c.coll.copies()) {
        check_buffer(comm, "the premulsum scalar", scalar, c.dt.size(), c.dt)?;
    }
    Ok(Some(Sizes {
        bytes,
        send_bytes,
        recv_bytes,
    }))
}
