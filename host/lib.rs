//! nccl-rs: collective communication among GPUs, NCCL's job rebuilt in Rust, kernels included.
//!
//! ```no_run
//! use nccl::{Comm, DataType, ReduceOp};
//! let comms = Comm::init_all(&[0, 1])?;
//! for c in &comms {
//!     let dev = c.device();
//!     let buf = dev.alloc(1024 * 4)?;
//!     c.all_reduce(buf.ptr, buf.ptr, 1024, DataType::Float32, ReduceOp::Sum, Default::default())?;
//!     dev.stream_sync(Default::default())?;
//! }
//! # Ok::<(), nccl::Error>(())
//! ```

// The network plugins' logger is a C variadic function (transport/net/plugin/log.rs).
#![feature(c_variadic)]

pub mod bootstrap;
#[cfg(feature = "capi")]
pub mod capi;
pub mod comm;
pub mod cuda;
pub mod debug;
pub mod enqueue;
pub mod env;
pub mod error;
pub mod graph;
pub(crate) mod proxy;

pub mod topo;
pub mod transport;
pub mod tune;

pub use bootstrap::{get_unique_id, UniqueId};
pub use comm::{Comm, Config, PendingComm, SHRINK_ABORT, SHRINK_DEFAULT, SPLIT_NOCOLOR};
pub use cuda::{Backend, DevBuffer, DevPtr, Device, Graph, StreamHandle};
pub use enqueue::{CollCall, ReduceOp};
pub use error::{Error, NcclResult, Result};
pub use nccl_device::abi::Coll;
pub use nccl_device::types::DataType;

/// The NCCL version this library implements (`ncclGetVersion`: major*10000 + minor*100 + patch).
pub const VERSION: i32 = 22503;
pub const VERSION_STRING: &str = "2.25.3";

/// The device code as PTX, one text per GPU architecture.
pub mod ptx {
    include!(concat!(env!("OUT_DIR"), "/ptx_table.rs"));
}

/// `ncclGroupStart`: operations issued by this thread until the matching [`group_end`] are
/// launched together when it ends.
pub fn group_start() {
    enqueue::group::start()
}

/// `ncclGroupEnd`. When the group's communicators are non-blocking (`Config::blocking(false)`)
/// and it holds operations, they are issued on a background thread and this returns an error
/// of code [`NcclResult::InProgress`] — not a failure: poll each communicator's
/// [`Comm::async_state`] until it is `Success` before using it or its streams again.
pub fn group_end() -> Result<()> {
    enqueue::group::end()
}

/// `ncclGroupSimulateEnd`: ends the group without launching anything (its operations are
/// dropped, as NCCL does) and returns the model's time for it in µs; None when this only ends
/// an inner, nested group.
pub fn group_simulate_end() -> Result<Option<f64>> {
    enqueue::group::simulate_end()
}

/// Every collective: the communicator must be ready and joins the thread's group, then the
/// call is checked and launched (now or at the group's end).
fn submit_collective(comm: &Comm, call: CollCall) -> Result<()> {
    enqueue::group::enter(comm).map_err(|e| {
        enqueue::group::record_error(e.context(format!("nccl{}", call.coll.name())))
    })?;
    enqueue::collective(comm, call)?;
    enqueue::group::note_collective(comm, &call);
    Ok(())
}

impl Comm {
    /// `ncclAllReduce`: reduces `count` elements of every rank's `send` into every rank's `recv`.
    #[allow(clippy::too_many_arguments)]
    pub fn all_reduce(
        &self,
        send: DevPtr,
        recv: DevPtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: StreamHandle,
    ) -> Result<()> {
        let call = CollCall {
            coll: Coll::AllReduce,
            send,
            recv,
            count,
            dt: dtype,
            op,
            root: 0,
            stream,
        };
        submit_collective(self, call)
    }

    /// `ncclBroadcast`: copies `count` elements of `send` on `root` to `recv` on every rank.
    #[allow(clippy::too_many_arguments)]
    pub fn broadcast(
        &self,
        send: DevPtr,
        recv: DevPtr,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        let call = CollCall {
            coll: Coll::Broadcast,
            send,
            recv,
            count,
            dt: dtype,
            op: ReduceOp::Sum,
            root,
            stream,
        };
        submit_collective(self, call)
    }

    /// `ncclReduce`: reduces every rank's `send` into `recv` on `root`.
    #[allow(clippy::too_many_arguments)]
    pub fn reduce(
        &self,
        send: DevPtr,
        recv: DevPtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        let call = CollCall {
            coll: Coll::Reduce,
            send,
            recv,
            count,
            dt: dtype,
            op,
            root,
            stream,
        };
        submit_collective(self, call)
    }

    /// `ncclAllGather`: every rank's `count` elements, gathered in rank order into `recv`
    /// (nranks × count elements) on every rank.
    pub fn all_gather(
        &self,
        send: DevPtr,
        recv: DevPtr,
        count: usize,
        dtype: DataType,
        stream: StreamHandle,
    ) -> Result<()> {
        let call = CollCall {
            coll: Coll::AllGather,
            send,
            recv,
            count,
            dt: dtype,
            op: ReduceOp::Sum,
            root: 0,
            stream,
        };
        submit_collective(self, call)
    }

    /// `ncclSend`: sends `count` elements of `send` to rank `peer`, which posts a matching
    /// [`Comm::recv`]. Inside a group, all sends and receives go out together at its end.
    pub fn send(
        &self,
        send: DevPtr,
        count: usize,
        dtype: DataType,
        peer: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        enqueue::p2p::submit(
            self,
            transport::links::Dir::Send,
            send,
            count,
            dtype,
            peer,
            stream,
        )
    }

    /// `ncclRecv`: receives `count` elements from rank `peer` into `recv`.
    pub fn recv(
        &self,
        recv: DevPtr,
        count: usize,
        dtype: DataType,
        peer: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        enqueue::p2p::submit(
            self,
            transport::links::Dir::Recv,
            recv,
            count,
            dtype,
            peer,
            stream,
        )
    }

    /// `ncclReduceScatter`: reduces every rank's `send` (nranks × count elements) and leaves
    /// block `rank` (count elements) in each rank's `recv`.
    #[allow(clippy::too_many_arguments)]
    pub fn reduce_scatter(
        &self,
        send: DevPtr,
        recv: DevPtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: StreamHandle,
    ) -> Result<()> {
        let call = CollCall {
            coll: Coll::ReduceScatter,
            send,
            recv,
            count,
            dt: dtype,
            op,
            root: 0,
            stream,
        };
        submit_collective(self, call)
    }
}
