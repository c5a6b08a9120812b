//! The raw layer: NCCL's calls as C programs make them, on device addresses. Each is an
//! `unsafe fn`: the library checks the addresses it is given (null, alignment, the extent of
//! their allocation, their device) but cannot know that they stay valid until the kernels that
//! use them have run. The C ABI (`capi`) is built on these; Rust programs use the typed calls
//! ([`Comm::all_reduce`], …) that take [`crate::DeviceBuffer`]s.

use crate::comm::{CollCall, ReduceOp};
use crate::cuda::{DevPtr, StreamHandle};
use crate::enqueue;
use crate::error::Result;
use crate::Comm;
use nccl_device::abi::Coll;
use nccl_device::types::DataType;

impl Comm {
    /// `ncclAllReduce`: reduces `count` elements of every rank's `send` into every rank's `recv`.
    ///
    /// # Safety
    ///
    /// `send` and `recv` must be device memory of this communicator's device (or null where
    /// the call does not use them) that stays allocated, and that nothing else writes (`recv`:
    /// nothing else reads or writes), until the work is complete on `stream` — past the end of
    /// the enclosing group, when called inside one. The library checks what it can (null,
    /// alignment, the allocation's extent, the device) and returns `ncclInvalidArgument`, but
    /// it cannot know the buffer's owner: memory freed or reused before the kernel runs is
    /// undefined behaviour.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce_raw(
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
        enqueue::collective(self, call)
    }

    /// `ncclBroadcast`: copies `count` elements of `send` on `root` to `recv` on every rank.
    ///
    /// # Safety
    ///
    /// `send` and `recv` must be device memory of this communicator's device (or null where
    /// the call does not use them) that stays allocated, and that nothing else writes (`recv`:
    /// nothing else reads or writes), until the work is complete on `stream` — past the end of
    /// the enclosing group, when called inside one. The library checks what it can (null,
    /// alignment, the allocation's extent, the device) and returns `ncclInvalidArgument`, but
    /// it cannot know the buffer's owner: memory freed or reused before the kernel runs is
    /// undefined behaviour.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn broadcast_raw(
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
            op: ReduceOp::SUM,
            root,
            stream,
        };
        enqueue::collective(self, call)
    }

    /// `ncclReduce`: reduces every rank's `send` into `recv` on `root`.
    ///
    /// # Safety
    ///
    /// `send` and `recv` must be device memory of this communicator's device (or null where
    /// the call does not use them) that stays allocated, and that nothing else writes (`recv`:
    /// nothing else reads or writes), until the work is complete on `stream` — past the end of
    /// the enclosing group, when called inside one. The library checks what it can (null,
    /// alignment, the allocation's extent, the device) and returns `ncclInvalidArgument`, but
    /// it cannot know the buffer's owner: memory freed or reused before the kernel runs is
    /// undefined behaviour.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce_raw(
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
        enqueue::collective(self, call)
    }

    /// `ncclAllGather`: every rank's `count` elements, gathered in rank order into `recv`
    /// (nranks × count elements) on every rank.
    ///
    /// # Safety
    ///
    /// `send` and `recv` must be device memory of this communicator's device (or null where
    /// the call does not use them) that stays allocated, and that nothing else writes (`recv`:
    /// nothing else reads or writes), until the work is complete on `stream` — past the end of
    /// the enclosing group, when called inside one. The library checks what it can (null,
    /// alignment, the allocation's extent, the device) and returns `ncclInvalidArgument`, but
    /// it cannot know the buffer's owner: memory freed or reused before the kernel runs is
    /// undefined behaviour.
    pub unsafe fn all_gather_raw(
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
            op: ReduceOp::SUM,
            root: 0,
            stream,
        };
        enqueue::collective(self, call)
    }

    /// `ncclSend`: sends `count` elements of `send` to rank `peer`, which posts a matching
    /// [`Comm::recv_raw`]. Inside a group, all sends and receives go out together at its end.
    ///
    /// # Safety
    ///
    /// `send` and `recv` must be device memory of this communicator's device (or null where
    /// the call does not use them) that stays allocated, and that nothing else writes (`recv`:
    /// nothing else reads or writes), until the work is complete on `stream` — past the end of
    /// the enclosing group, when called inside one. The library checks what it can (null,
    /// alignment, the allocation's extent, the device) and returns `ncclInvalidArgument`, but
    /// it cannot know the buffer's owner: memory freed or reused before the kernel runs is
    /// undefined behaviour.
    pub unsafe fn send_raw(
        &self,
        send: DevPtr,
        count: usize,
        dtype: DataType,
        peer: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        enqueue::p2p::submit(
            self,
            crate::transport::Dir::Send,
            send,
            count,
            dtype,
            peer,
            stream,
        )
    }

    /// `ncclRecv`: receives `count` elements from rank `peer` into `recv`.
    ///
    /// # Safety
    ///
    /// `send` and `recv` must be device memory of this communicator's device (or null where
    /// the call does not use them) that stays allocated, and that nothing else writes (`recv`:
    /// nothing else reads or writes), until the work is complete on `stream` — past the end of
    /// the enclosing group, when called inside one. The library checks what it can (null,
    /// alignment, the allocation's extent, the device) and returns `ncclInvalidArgument`, but
    /// it cannot know the buffer's owner: memory freed or reused before the kernel runs is
    /// undefined behaviour.
    pub unsafe fn recv_raw(
        &self,
        recv: DevPtr,
        count: usize,
        dtype: DataType,
        peer: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        enqueue::p2p::submit(
            self,
            crate::transport::Dir::Recv,
            recv,
            count,
            dtype,
            peer,
            stream,
        )
    }

    /// `ncclReduceScatter`: reduces every rank's `send` (nranks × count elements) and leaves
    /// block `rank` (count elements) in each rank's `recv`.
    ///
    /// # Safety
    ///
    /// `send` and `recv` must be device memory of this communicator's device (or null where
    /// the call does not use them) that stays allocated, and that nothing else writes (`recv`:
    /// nothing else reads or writes), until the work is complete on `stream` — past the end of
    /// the enclosing group, when called inside one. The library checks what it can (null,
    /// alignment, the allocation's extent, the device) and returns `ncclInvalidArgument`, but
    /// it cannot know the buffer's owner: memory freed or reused before the kernel runs is
    /// undefined behaviour.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce_scatter_raw(
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
        enqueue::collective(self, call)
    }
}
