//! `cudarc::nccl::safe`'s API on nccl-rs (feature `cudarc`): a program written against cudarc's
//! NCCL module moves here by changing its `use` lines (`cudarc::nccl::safe::{Comm, Id,
//! ReduceOp}` → `nccl::cudarc_nccl::{Comm, Id, ReduceOp}`); `examples/cudarc_interop.rs`
//! shows it.
//!
//! What differs: errors are [`crate::Error`] (cudarc's are `NcclError`), calls return `()`
//! where cudarc returns `NcclStatus`, ranks and peers are `usize` or `i32` as cudarc has them,
//! and a [`Group`] issues its calls when it ends rather than as they are made (so a leaked
//! group launches nothing), one group at a time per thread. Dropping a [`Comm`] destroys it
//! (cudarc aborts it).

use std::ffi::c_char;
use std::sync::Arc;

use super::element::Element;
use super::op::Op;
use crate::bootstrap::{UniqueId, UNIQUE_ID_BYTES};
use crate::cuda::Device;
use crate::error::{Error, Result};
use crate::RedOpKind;
use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut};

pub use super::cudarc_group::Group;

/// The element types cudarc's NCCL module takes (every [`Element`] here).
pub use super::element::Element as NcclType;

/// A unique id, as cudarc's `Id`.
#[derive(Debug, Clone, Copy)]
pub struct Id {
    internal: [c_char; UNIQUE_ID_BYTES],
}

impl Id {
    /// A new unique id (`ncclGetUniqueId`): made on one rank, sent to the others.
    pub fn new() -> Result<Id> {
        let id = crate::get_unique_id()?;
        Ok(Id {
            internal: id.internal.map(|b| b as c_char),
        })
    }

    /// An id from the bytes another rank sent.
    pub fn uninit(internal: [c_char; UNIQUE_ID_BYTES]) -> Id {
        Id { internal }
    }

    /// The id's bytes, to send to the other ranks.
    pub fn internal(&self) -> &[c_char; UNIQUE_ID_BYTES] {
        &self.internal
    }

    fn unique_id(&self) -> UniqueId {
        UniqueId {
            internal: self.internal.map(|b| b as u8),
        }
    }
}

/// The reductions of cudarc's `ReduceOp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Average.
    Avg,
}

impl ReduceOp {
    /// The kernels' reduction for this op.
    fn kind(&self) -> RedOpKind {
        match self {
            ReduceOp::Sum => RedOpKind::Sum,
            ReduceOp::Prod => RedOpKind::Prod,
            ReduceOp::Max => RedOpKind::Max,
            ReduceOp::Min => RedOpKind::Min,
            ReduceOp::Avg => RedOpKind::Avg,
        }
    }

    pub(super) fn op<T: Element>(&self) -> Op<T> {
        Op::builtin(self.kind()).expect("cudarc's reductions take no scalar")
    }
}

/// A rank of a communicator with the stream its calls run on, as cudarc's `Comm`.
#[derive(Debug)]
pub struct Comm {
    comm: crate::Comm,
    stream: Arc<CudaStream>,
    rank: usize,
    world_size: usize,
}

/// A rank or peer given as cudarc's `i32`.
pub(super) fn index(what: &str, v: i32) -> Result<usize> {
    usize::try_from(v).map_err(|_| Error::invalid_argument(format!("{what} {v} is negative")))
}

impl Comm {
    /// One communicator over the devices of `streams`, rank i on `streams[i]`
    /// (`ncclCommInitAll`).
    pub fn from_devices(streams: Vec<Arc<CudaStream>>) -> Result<Vec<Comm>> {
        let ordinals: Vec<i32> = streams
            .iter()
            .map(|s| s.context().ordinal() as i32)
            .collect();
        let n = streams.len();
        let comms = crate::Comm::init_all(&ordinals)?;
        Ok(comms
            .into_iter()
            .zip(streams)
            .enumerate()
            .map(|(rank, (comm, stream))| Comm {
                comm,
                stream,
                rank,
                world_size: n,
            })
            .collect())
    }

    /// Rank `rank` of `world_size`, on the device of `stream` (`ncclCommInitRank`).
    pub fn from_rank(
        stream: Arc<CudaStream>,
        rank: usize,
        world_size: usize,
        id: Id,
    ) -> Result<Comm> {
        let device = Device::open(stream.context().ordinal() as i32)?;
        let comm = crate::Comm::init_rank_on(device, world_size, &id.unique_id(), rank)?;
        Ok(Comm {
            comm,
            stream,
            rank,
            world_size,
        })
    }

    /// The stream the calls run on.
    pub fn stream(&self) -> Arc<CudaStream> {
        self.stream.clone()
    }

    /// The stream, borrowed.
    pub(super) fn cuda_stream(&self) -> &CudaStream {
        &self.stream
    }

    /// The CUDA context of that stream.
    pub fn context(&self) -> &Arc<CudaContext> {
        self.stream.context()
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.stream.context().ordinal()
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The nccl-rs communicator underneath (its typed API, groups, abort handle, ...).
    pub fn inner(&self) -> &crate::Comm {
        &self.comm
    }

    /// `ncclSend` of `data` to `peer`.
    pub fn send<S: DevicePtr<T>, T: NcclType>(&self, data: &S, peer: i32) -> Result<()> {
        self.comm.send_on(data, index("peer", peer)?, &self.stream)
    }

    /// `ncclRecv` into `buff` from `peer`.
    pub fn recv<R: DevicePtrMut<T>, T: NcclType>(&self, buff: &mut R, peer: i32) -> Result<()> {
        self.comm.recv_on(buff, index("peer", peer)?, &self.stream)
    }

    /// `ncclBroadcast` from `root` (`sendbuff` is read on the root only).
    pub fn broadcast<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        sendbuff: Option<&S>,
        recvbuff: &mut R,
        root: i32,
    ) -> Result<()> {
        self.comm
            .broadcast_on(sendbuff, recvbuff, index("root", root)?, &self.stream)
    }

    /// In-place `ncclBroadcast` from `root`.
    pub fn broadcast_in_place<R: DevicePtrMut<T>, T: NcclType>(
        &self,
        recvbuff: &mut R,
        root: i32,
    ) -> Result<()> {
        self.comm
            .broadcast_in_place_on(recvbuff, index("root", root)?, &self.stream)
    }

    /// `ncclAllGather`.
    pub fn all_gather<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        sendbuff: &S,
        recvbuff: &mut R,
    ) -> Result<()> {
        self.comm.all_gather_on(sendbuff, recvbuff, &self.stream)
    }

    /// `ncclAllReduce`.
    pub fn all_reduce<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        sendbuff: &S,
        recvbuff: &mut R,
        reduce_op: &ReduceOp,
    ) -> Result<()> {
        self.comm
            .all_reduce_on(sendbuff, recvbuff, reduce_op.op(), &self.stream)
    }

    /// In-place `ncclAllReduce`.
    pub fn all_reduce_in_place<R: DevicePtrMut<T>, T: NcclType>(
        &self,
        buff: &mut R,
        reduce_op: &ReduceOp,
    ) -> Result<()> {
        self.comm
            .all_reduce_in_place_on(buff, reduce_op.op(), &self.stream)
    }

    /// `ncclReduce` into `root`'s `recvbuff` (None on the other ranks).
    pub fn reduce<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        sendbuff: &S,
        recvbuff: Option<&mut R>,
        reduce_op: &ReduceOp,
        root: i32,
    ) -> Result<()> {
        self.comm.reduce_on(
            sendbuff,
            recvbuff,
            reduce_op.op(),
            index("root", root)?,
            &self.stream,
        )
    }

    /// In-place `ncclReduce` into `root`'s buffer.
    pub fn reduce_in_place<R: DevicePtrMut<T>, T: NcclType>(
        &self,
        recvbuff: &mut R,
        reduce_op: &ReduceOp,
        root: i32,
    ) -> Result<()> {
        self.comm
            .reduce_in_place_on(recvbuff, reduce_op.op(), index("root", root)?, &self.stream)
    }

    /// `ncclReduceScatter`.
    pub fn reduce_scatter<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        sendbuff: &S,
        recvbuff: &mut R,
        reduce_op: &ReduceOp,
    ) -> Result<()> {
        self.comm
            .reduce_scatter_on(sendbuff, recvbuff, reduce_op.op(), &self.stream)
    }
}
