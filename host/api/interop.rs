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
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};

/// The library's view of cudarc's stream (borrowed: dropping it destroys nothing).
pub(super) fn our_stream(what: &str, stream: &CudaStream) -> Result<Stream> {
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

/// A cudarc buffer a call reads on `stream`: our slice of it, and cudarc's guard, which makes
/// `stream` wait for the buffer's last write now and records this read when dropped. Keep the
/// guard until the call has ordered its work.
fn read<'a, T: Element, B: DevicePtr<T>>(
    b: &'a B,
    stream: &'a CudaStream,
) -> (DeviceSlice<'a, T>, SyncOnDrop<'a>) {
    let (o, n) = (ordinal_of(b), b.len());
    let (p, guard) = b.device_ptr(stream);
    // SAFETY: cudarc's buffer is live device memory of `n` elements on its context's device,
    // borrowed for 'a.
    (unsafe { DeviceSlice::from_raw(o, p, n) }, guard)
}

/// As [`read`], for a buffer the call writes (the guard records the write).
fn write<'a, T: Element, B: DevicePtrMut<T>>(
    b: &'a mut B,
    stream: &'a CudaStream,
) -> (DeviceSliceMut<'a, T>, SyncOnDrop<'a>) {
    let (o, n) = (ordinal_of(b), b.len());
    let (p, guard) = b.device_ptr_mut(stream);
    // SAFETY: as in `read`; the buffer is borrowed exclusively for 'a.
    (unsafe { DeviceSliceMut::from_raw(o, p, n) }, guard)
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
        let (s, _read) = read(send, stream);
        let (r, _write) = write(recv, stream);
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
        let (b, _write) = write(buf, stream);
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
        let (s, _read) = send.map(|s| read(s, stream)).unzip();
        let (r, _write) = write(recv, stream);
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
        let (b, _write) = write(buf, stream);
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
        let (b, _write) = write(buf, stream);
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
        let (s, _read) = read(send, stream);
        let (r, _write) = recv.map(|r| write(r, stream)).unzip();
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
        let (s, _read) = read(send, stream);
        let (r, _write) = write(recv, stream);
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
        let (s, _read) = read(send, stream);
        let (r, _write) = write(recv, stream);
        coll::reduce_scatter(self, s, r, op, &st)
    }

    /// [`Comm::send`] of cudarc's memory on its stream.
    pub fn send_on<T, S>(&self, buf: &S, peer: usize, stream: &CudaStream) -> Result<()>
    where
        T: Element,
        S: DevicePtr<T>,
    {
        let st = our_stream("ncclSend", stream)?;
        let (b, _read) = read(buf, stream);
        coll::send(self, b, peer, &st)
    }

    /// [`Comm::recv`] into cudarc's memory on its stream.
    pub fn recv_on<T, R>(&self, buf: &mut R, peer: usize, stream: &CudaStream) -> Result<()>
    where
        T: Element,
        R: DevicePtrMut<T>,
    {
        let st = our_stream("ncclRecv", stream)?;
        let (b, _write) = write(buf, stream);
        coll::recv(self, b, peer, &st)
    }
}
