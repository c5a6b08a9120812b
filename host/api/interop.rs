//! cudarc interop (feature `cudarc`): the collectives and send/recv on cudarc's device memory
//! (`CudaSlice<T>`, `CudaView`, `CudaViewMut`: anything `DevicePtr` / `DevicePtrMut`) and
//! stream (`CudaStream`), with cudarc's own event bookkeeping: each buffer's stream waits for
//! the writes (and, for outputs, the reads) cudarc recorded on it before the call, and the
//! call records its read or write after its work is ordered, as cudarc's `nccl` module does.
//!
//! The calls are ordered on the stream when they return, so they refuse to run inside a group
//! opened with [`crate::group_start`] or on a capturing stream (the events would be recorded
//! before the work exists). cudarc memory is CUDA memory: the CUDA backend must be in use.

use super::buffer::{DeviceSlice, DeviceSliceMut};
use super::coll;
use super::direct::direct;
use super::element::Element;
use super::op::Op;
use super::stream::Stream;
use crate::comm::Comm;
use crate::cuda::{Backend, Device, StreamHandle};
use crate::error::{Error, Result};
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};

/// The library's view of cudarc's stream (borrowed: dropping it destroys nothing).
fn our_stream(what: &str, stream: &CudaStream) -> Result<Stream> {
    if crate::cuda::backend() != Backend::Cuda {
        return Err(Error::invalid_usage(format!(
            "{what}: cudarc's buffers are CUDA memory, but the simulator backend is in use"
        )));
    }
    let device = Device::open(stream.context().ordinal() as i32)?;
    let st = Stream::borrowed(&device, StreamHandle(stream.cu_stream() as u64));
    direct(what, &st)?;
    Ok(st)
}

/// The ordinal of the device a cudarc buffer lives on.
fn ordinal_of<T, B: cudarc::driver::DeviceSlice<T>>(b: &B) -> i32 {
    b.stream().context().ordinal() as i32
}

impl Comm {
    /// [`Comm::all_reduce`] on cudarc's memory and stream.
    pub fn all_reduce_on<T, S, R>(
        &self,
        send: &S,
        recv: &mut R,
        op: Op<T>,
        stream: &CudaStream,
    ) -> Result<()>
    where
        T: Element,
        S: DevicePtr<T>,
        R: DevicePtrMut<T>,
    {
        let st = our_stream("ncclAllReduce", stream)?;
        let (so, sn, ro, rn) = (ordinal_of(send), send.len(), ordinal_of(recv), recv.len());
        let (s, _read) = send.device_ptr(stream);
        let (r, _write) = recv.device_ptr_mut(stream);
        // SAFETY: cudarc's buffers are live device memory of `len` elements on their
        // context's device, borrowed (`recv` exclusively) until the call has ordered its work
        // on `stream`; `_read` / `_write` record cudarc's events after that.
        let (s, r) = unsafe {
            (
                DeviceSlice::<T>::from_raw(so, s, sn),
                DeviceSliceMut::<T>::from_raw(ro, r, rn),
            )
        };
        coll::all_reduce(self, s, r, op, &st)
    }

    /// In-place [`Comm::all_reduce`] on cudarc's memory and stream.
    pub fn all_reduce_in_place_on<T, B>(
        &self,
        buf: &mut B,
        op: Op<T>,
        stream: &CudaStream,
    ) -> Result<()>
    where
        T: Element,
        B: DevicePtrMut<T>,
    {
        let st = our_stream("ncclAllReduce", stream)?;
        let (o, n) = (ordinal_of(buf), buf.len());
        let (p, _write) = buf.device_ptr_mut(stream);
        // SAFETY: as in `all_reduce_on`.
        let b = unsafe { DeviceSliceMut::<T>::from_raw(o, p, n) };
        coll::all_reduce_in_place(self, b, op, &st)
    }

    /// [`Comm::broadcast`] on cudarc's memory and stream (`send` is read on `root` only).
    pub fn broadcast_on<T, S, R>(
        &self,
        send: Option<&S>,
        recv: &mut R,
        root: usize,
        stream: &CudaStream,
    ) -> Result<()>
    where
        T: Element,
        S: DevicePtr<T>,
        R: DevicePtrMut<T>,
    {
        let st = our_stream("ncclBroadcast", stream)?;
        let (ro, rn) = (ordinal_of(recv), recv.len());
        let sent = send.map(|s| (ordinal_of(s), s.len(), s.device_ptr(stream)));
        let (r, _write) = recv.device_ptr_mut(stream);
        // SAFETY: as in `all_reduce_on`.
        let (s, r) = unsafe {
            (
                sent.as_ref()
                    .map(|(o, n, (p, _))| DeviceSlice::<T>::from_raw(*o, *p, *n)),
                DeviceSliceMut::<T>::from_raw(ro, r, rn),
            )
        };
        coll::broadcast(self, s, r, root, &st)
    }

    /// In-place [`Comm::broadcast`] on cudarc's memory and stream.
    pub fn broadcast_in_place_on<T, B>(
        &self,
        buf: &mut B,
        root: usize,
        stream: &CudaStream,
    ) -> Result<()>
    where
        T: Element,
        B: DevicePtrMut<T>,
    {
        let st = our_stream("ncclBroadcast", stream)?;
        let (o, n) = (ordinal_of(buf), buf.len());
        let (p, _write) = buf.device_ptr_mut(stream);
        // SAFETY: as in `all_reduce_on`.
        let b = unsafe { DeviceSliceMut::<T>::from_raw(o, p, n) };
        coll::broadcast_in_place(self, b, root, &st)
    }

    /// In-place [`Comm::reduce`] on cudarc's memory and stream (the result on `root`).
    pub fn reduce_in_place_on<T, B>(
        &self,
        buf: &mut B,
        op: Op<T>,
        root: usize,
        stream: &CudaStream,
    ) -> Result<()>
    where
        T: Element,
        B: DevicePtrMut<T>,
    {
        let st = our_stream("ncclReduce", stream)?;
        let (o, n) = (ordinal_of(buf), buf.len());
        let (p, _write) = buf.device_ptr_mut(stream);
        // SAFETY: as in `all_reduce_on`.
        let b = unsafe { DeviceSliceMut::<T>::from_raw(o, p, n) };
        coll::reduce_in_place(self, b, op, root, &st)
    }

    /// [`Comm::reduce`] on cudarc's memory and stream (`recv` is written on `root` only).
    pub fn reduce_on<T, S, R>(
        &self,
        send: &S,
        recv: Option<&mut R>,
        op: Op<T>,
        root: usize,
        stream: &CudaStream,
    ) -> Result<()>
    where
        T: Element,
        S: DevicePtr<T>,
        R: DevicePtrMut<T>,
    {
        let st = our_stream("ncclReduce", stream)?;
        let (so, sn) = (ordinal_of(send), send.len());
        let (s, _read) = send.device_ptr(stream);
        let got = recv.map(|r| (ordinal_of(r), r.len(), r.device_ptr_mut(stream)));
        // SAFETY: as in `all_reduce_on`.
        let (s, r) = unsafe {
            (
                DeviceSlice::<T>::from_raw(so, s, sn),
                got.as_ref()
                    .map(|(o, n, (p, _))| DeviceSliceMut::<T>::from_raw(*o, *p, *n)),
            )
        };
        coll::reduce(self, s, r, op, root, &st)
    }

    /// [`Comm::all_gather`] on cudarc's memory and stream.
    pub fn all_gather_on<T, S, R>(&self, send: &S, recv: &mut R, stream: &CudaStream) -> Result<()>
    where
        T: Element,
        S: DevicePtr<T>,
        R: DevicePtrMut<T>,
    {
        let st = our_stream("ncclAllGather", stream)?;
        let (so, sn, ro, rn) = (ordinal_of(send), send.len(), ordinal_of(recv), recv.len());
        let (s, _read) = send.device_ptr(stream);
        let (r, _write) = recv.device_ptr_mut(stream);
        // SAFETY: as in `all_reduce_on`.
        let (s, r) = unsafe {
            (
                DeviceSlice::<T>::from_raw(so, s, sn),
                DeviceSliceMut::<T>::from_raw(ro, r, rn),
            )
        };
        coll::all_gather(self, s, r, &st)
    }

    /// [`Comm::reduce_scatter`] on cudarc's memory and stream.
    pub fn reduce_scatter_on<T, S, R>(
        &self,
        send: &S,
        recv: &mut R,
        op: Op<T>,
        stream: &CudaStream,
    ) -> Result<()>
    where
        T: Element,
        S: DevicePtr<T>,
        R: DevicePtrMut<T>,
    {
        let st = our_stream("ncclReduceScatter", stream)?;
        let (so, sn, ro, rn) = (ordinal_of(send), send.len(), ordinal_of(recv), recv.len());
        let (s, _read) = send.device_ptr(stream);
        let (r, _write) = recv.device_ptr_mut(stream);
        // SAFETY: as in `all_reduce_on`.
        let (s, r) = unsafe {
            (
                DeviceSlice::<T>::from_raw(so, s, sn),
                DeviceSliceMut::<T>::from_raw(ro, r, rn),
            )
        };
        coll::reduce_scatter(self, s, r, op, &st)
    }

    /// [`Comm::send`] of cudarc's memory on its stream.
    pub fn send_on<T, S>(&self, buf: &S, peer: usize, stream: &CudaStream) -> Result<()>
    where
        T: Element,
        S: DevicePtr<T>,
    {
        let st = our_stream("ncclSend", stream)?;
        let (o, n) = (ordinal_of(buf), buf.len());
        let (p, _read) = buf.device_ptr(stream);
        // SAFETY: as in `all_reduce_on`.
        let b = unsafe { DeviceSlice::<T>::from_raw(o, p, n) };
        coll::send(self, b, peer, &st)
    }

    /// [`Comm::recv`] into cudarc's memory on its stream.
    pub fn recv_on<T, R>(&self, buf: &mut R, peer: usize, stream: &CudaStream) -> Result<()>
    where
        T: Element,
        R: DevicePtrMut<T>,
    {
        let st = our_stream("ncclRecv", stream)?;
        let (o, n) = (ordinal_of(buf), buf.len());
        let (p, _write) = buf.device_ptr_mut(stream);
        // SAFETY: as in `all_reduce_on`.
        let b = unsafe { DeviceSliceMut::<T>::from_raw(o, p, n) };
        coll::recv(self, b, peer, &st)
    }
}
