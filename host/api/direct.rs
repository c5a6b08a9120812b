//! The typed calls on [`Comm`] itself: checked, then ordered on the stream before they return,
//! so their borrows end with the call. They refuse to run where the work would outlive the
//! borrows: inside a group opened with [`crate::group_start`] (use [`crate::group`]) and on a
//! stream that captures a graph (use [`crate::capture`]).

use super::buffer::{IntoDeviceSlice, IntoDeviceSliceMut};
use super::coll;
use super::op::Op;
use super::stream::Stream;
use crate::comm::Comm;
use crate::error::{Error, Result};

/// A typed call may be issued outside any scope: no raw group is open, no capture runs.
pub(super) fn direct(what: &str, stream: &Stream) -> Result<()> {
    if crate::enqueue::group::depth() > 0 {
        return Err(Error::invalid_usage(format!(
            "{what}: a group is open on this thread (group_start); typed calls in a group go \
             through nccl::group(|g| ...), which keeps their buffers borrowed until it ends"
        )));
    }
    if stream.is_capturing()? {
        return Err(Error::invalid_usage(format!(
            "{what}: the stream is capturing a graph; typed calls in a graph go through \
             nccl::capture(&stream, |c| ...), whose graph keeps their buffers borrowed"
        )));
    }
    Ok(())
}

impl Comm {
    /// `ncclAllReduce`: reduces every rank's `send` with `op` into every rank's `recv`.
    /// The count is `send.len()`; `recv` must hold at least that many elements.
    ///
    /// ```no_run
    /// # fn f(comm: &nccl::Comm, stream: &nccl::Stream) -> nccl::Result<()> {
    /// use nccl::{DeviceBuffer, Op};
    /// let send = DeviceBuffer::from_slice(comm.device(), &[1.0f32; 1024])?;
    /// let mut recv = DeviceBuffer::<f32>::zeroed(comm.device(), 1024)?;
    /// comm.all_reduce(&send, &mut recv, Op::SUM, stream)?;
    /// # Ok(()) }
    /// ```
    pub fn all_reduce<'a, S, R>(
        &self,
        send: S,
        recv: R,
        op: Op<S::Elem>,
        stream: &Stream,
    ) -> Result<()>
    where
        S: IntoDeviceSlice<'a>,
        R: IntoDeviceSliceMut<'a, Elem = S::Elem>,
    {
        direct("ncclAllReduce", stream)?;
        let (s, r) = (send.into_device_slice(), recv.into_device_slice_mut());
        coll::all_reduce(self, s, r, op, stream)
    }

    /// In-place `ncclAllReduce` of `buf`.
    pub fn all_reduce_in_place<'a, B: IntoDeviceSliceMut<'a>>(
        &self,
        buf: B,
        op: Op<B::Elem>,
        stream: &Stream,
    ) -> Result<()> {
        direct("ncclAllReduce", stream)?;
        coll::all_reduce_in_place(self, buf.into_device_slice_mut(), op, stream)
    }

    /// `ncclBroadcast`: `root`'s `send` (None on the other ranks) lands in every rank's
    /// `recv`. The count is `recv.len()`; the root's `send` must hold at least that many.
    pub fn broadcast<'a, S, R>(
        &self,
        send: Option<S>,
        recv: R,
        root: usize,
        stream: &Stream,
    ) -> Result<()>
    where
        S: IntoDeviceSlice<'a>,
        R: IntoDeviceSliceMut<'a, Elem = S::Elem>,
    {
        direct("ncclBroadcast", stream)?;
        let s = send.map(|s| s.into_device_slice());
        coll::broadcast(self, s, recv.into_device_slice_mut(), root, stream)
    }

    /// In-place `ncclBroadcast` of `buf` from `root`.
    pub fn broadcast_in_place<'a, B: IntoDeviceSliceMut<'a>>(
        &self,
        buf: B,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        direct("ncclBroadcast", stream)?;
        coll::broadcast_in_place(self, buf.into_device_slice_mut(), root, stream)
    }

    /// `ncclReduce`: every rank's `send` reduced with `op` into `root`'s `recv` (None on the
    /// other ranks). The count is `send.len()`.
    pub fn reduce<'a, S, R>(
        &self,
        send: S,
        recv: Option<R>,
        op: Op<S::Elem>,
        root: usize,
        stream: &Stream,
    ) -> Result<()>
    where
        S: IntoDeviceSlice<'a>,
        R: IntoDeviceSliceMut<'a, Elem = S::Elem>,
    {
        direct("ncclReduce", stream)?;
        let r = recv.map(|r| r.into_device_slice_mut());
        coll::reduce(self, send.into_device_slice(), r, op, root, stream)
    }

    /// In-place `ncclReduce` of `buf` to `root`.
    pub fn reduce_in_place<'a, B: IntoDeviceSliceMut<'a>>(
        &self,
        buf: B,
        op: Op<B::Elem>,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        direct("ncclReduce", stream)?;
        coll::reduce_in_place(self, buf.into_device_slice_mut(), op, root, stream)
    }

    /// `ncclAllGather`: every rank's `send`, in rank order, in every rank's `recv`, which
    /// must hold at least nranks × `send.len()` elements.
    pub fn all_gather<'a, S, R>(&self, send: S, recv: R, stream: &Stream) -> Result<()>
    where
        S: IntoDeviceSlice<'a>,
        R: IntoDeviceSliceMut<'a, Elem = S::Elem>,
    {
        direct("ncclAllGather", stream)?;
        let (s, r) = (send.into_device_slice(), recv.into_device_slice_mut());
        coll::all_gather(self, s, r, stream)
    }

    /// In-place `ncclAllGather` over `buf` (nranks blocks; this rank's block is its input).
    pub fn all_gather_in_place<'a, B: IntoDeviceSliceMut<'a>>(
        &self,
        buf: B,
        stream: &Stream,
    ) -> Result<()> {
        direct("ncclAllGather", stream)?;
        coll::all_gather_in_place(self, buf.into_device_slice_mut(), stream)
    }

    /// `ncclReduceScatter`: every rank's `send` (at least nranks × `recv.len()` elements)
    /// reduced with `op`; block `rank` lands in each rank's `recv`.
    pub fn reduce_scatter<'a, S, R>(
        &self,
        send: S,
        recv: R,
        op: Op<S::Elem>,
        stream: &Stream,
    ) -> Result<()>
    where
        S: IntoDeviceSlice<'a>,
        R: IntoDeviceSliceMut<'a, Elem = S::Elem>,
    {
        direct("ncclReduceScatter", stream)?;
        let (s, r) = (send.into_device_slice(), recv.into_device_slice_mut());
        coll::reduce_scatter(self, s, r, op, stream)
    }

    /// In-place `ncclReduceScatter` over `buf` (nranks blocks; this rank's block receives
    /// the result).
    pub fn reduce_scatter_in_place<'a, B: IntoDeviceSliceMut<'a>>(
        &self,
        buf: B,
        op: Op<B::Elem>,
        stream: &Stream,
    ) -> Result<()> {
        direct("ncclReduceScatter", stream)?;
        coll::reduce_scatter_in_place(self, buf.into_device_slice_mut(), op, stream)
    }

    /// `ncclSend` of `buf` to `peer`, which posts a matching receive. A send and a receive
    /// between two ranks that must overlap go in one [`crate::group`].
    pub fn send<'a, S: IntoDeviceSlice<'a>>(
        &self,
        buf: S,
        peer: usize,
        stream: &Stream,
    ) -> Result<()> {
        direct("ncclSend", stream)?;
        coll::send(self, buf.into_device_slice(), peer, stream)
    }

    /// `ncclRecv` of `buf.len()` elements from `peer` into `buf`.
    pub fn recv<'a, R: IntoDeviceSliceMut<'a>>(
        &self,
        buf: R,
        peer: usize,
        stream: &Stream,
    ) -> Result<()> {
        direct("ncclRecv", stream)?;
        coll::recv(self, buf.into_device_slice_mut(), peer, stream)
    }

    /// `ncclAlltoAll`: block `j` of `send` (blocks of `send.len() / nranks` elements) goes to
    /// rank `j`; rank `i`'s block lands in block `i` of `recv`.
    pub fn all_to_all<'a, S, R>(&self, send: S, recv: R, stream: &Stream) -> Result<()>
    where
        S: IntoDeviceSlice<'a>,
        R: IntoDeviceSliceMut<'a, Elem = S::Elem>,
    {
        direct("ncclAlltoAll", stream)?;
        let (s, r) = (send.into_device_slice(), recv.into_device_slice_mut());
        coll::all_to_all(self, s, r, stream)
    }
}
