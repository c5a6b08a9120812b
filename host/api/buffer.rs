//! Typed device memory: [`DeviceBuffer`] owns it; [`DeviceSlice`] and [`DeviceSliceMut`]
//! borrow part of it, as `&[T]` and `&mut [T]` borrow a `Vec<T>`.
//!
//! Host copies and the buffer's drop first wait for all work on its device
//! ([`Device::synchronize`]), so the host never reads memory a kernel is still writing and
//! memory is never freed under a running kernel: where that wait fails (another thread
//! captures a graph on the device), a dropped buffer's memory is leaked, not freed.

use super::element::{as_bytes, as_bytes_mut, Element};
use super::Stream;
use crate::cuda::{DevBuffer, DevPtr, Device};
use crate::error::{Error, Result};
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::{Bound, RangeBounds};

/// `len` elements of `T` in device memory, freed when dropped.
pub struct DeviceBuffer<T: Element> {
    /// Freed by our drop only once the device's work is known to be done.
    raw: ManuallyDrop<DevBuffer>,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Element> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer<{}>({} elements on {:?})",
            T::DATA_TYPE.name(),
            self.len,
            self.raw.device()
        )
    }
}

fn byte_len<T: Element>(len: usize) -> Result<usize> {
    len.checked_mul(std::mem::size_of::<T>())
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "{len} elements of {} overflow the byte size",
                T::DATA_TYPE.name()
            ))
        })
}

impl<T: Element> DeviceBuffer<T> {
    /// `len` zeroed elements on `device`.
    pub fn zeroed(device: &Device, len: usize) -> Result<DeviceBuffer<T>> {
        // An empty buffer still owns an allocation, so that its address is device memory.
        let raw = ManuallyDrop::new(device.alloc(byte_len::<T>(len)?.max(1))?);
        Ok(DeviceBuffer {
            raw,
            len,
            _t: PhantomData,
        })
    }

    /// `len` zeroed elements on `device` allocated as `ncclMemAlloc` allocates: through the
    /// CUDA virtual memory API, shareable with other processes (POSIX file descriptor), the
    /// allocation rounded up to the granularity NCCL's user buffer registration and NVLS ask
    /// for. Such buffers are the ones to register with [`crate::Comm::register`].
    pub fn mem_alloc(device: &Device, len: usize) -> Result<DeviceBuffer<T>> {
        let raw = ManuallyDrop::new(device.alloc_vmm(byte_len::<T>(len)?.max(1))?);
        Ok(DeviceBuffer {
            raw,
            len,
            _t: PhantomData,
        })
    }

    /// A copy of `data` on `device`.
    pub fn from_slice(device: &Device, data: &[T]) -> Result<DeviceBuffer<T>> {
        let mut b = DeviceBuffer::zeroed(device, data.len())?;
        b.copy_from_host(data)?;
        Ok(b)
    }

    /// How many elements it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device that holds it.
    pub fn device(&self) -> &Device {
        self.raw.device()
    }

    /// The device address of its first element, for the raw layer (whose calls are `unsafe`).
    pub fn as_raw_ptr(&self) -> DevPtr {
        self.raw.ptr()
    }

    /// Overwrites the buffer with `src`, which must have the same length.
    pub fn copy_from_host(&mut self, src: &[T]) -> Result<()> {
        self.as_slice_mut().copy_from_host(src)
    }

    /// Copies the buffer into `dst`, which must have the same length.
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        self.as_slice().copy_to_host(dst)
    }

    /// The buffer's elements, copied to the host.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        self.as_slice().to_vec()
    }

    /// As [`DeviceBuffer::copy_from_host`], waiting for `stream` only.
    pub fn copy_from_host_after(&mut self, src: &[T], stream: &Stream) -> Result<()> {
        self.as_slice_mut().copy_from_host_after(src, stream)
    }

    /// Copies `src` into the buffer in `stream`'s order, without the host waiting (see
    /// [`DeviceSliceMut::copy_from_device`]).
    pub fn copy_from_device<'s>(
        &mut self,
        src: impl IntoDeviceSlice<'s, Elem = T>,
        stream: &Stream,
    ) -> Result<()> {
        self.as_slice_mut().copy_from_device(src, stream)
    }

    /// As [`DeviceBuffer::to_vec`], waiting for `stream` only.
    pub fn to_vec_after(&self, stream: &Stream) -> Result<Vec<T>> {
        self.as_slice().to_vec_after(stream)
    }

    /// The whole buffer as a read-only view.
    pub fn as_slice(&self) -> DeviceSlice<'_, T> {
        DeviceSlice {
            ordinal: self.device().ordinal,
            ptr: self.raw.ptr(),
            len: self.len,
            _t: PhantomData,
        }
    }

    /// The whole buffer as a writable view.
    pub fn as_slice_mut(&mut self) -> DeviceSliceMut<'_, T> {
        DeviceSliceMut {
            ordinal: self.device().ordinal,
            ptr: self.raw.ptr(),
            len: self.len,
            _t: PhantomData,
        }
    }

    /// Elements `range` as a read-only view; `ncclInvalidArgument` when out of bounds.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceSlice<'_, T>> {
        self.as_slice().slice(range)
    }

    /// Elements `range` as a writable view; `ncclInvalidArgument` when out of bounds.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<DeviceSliceMut<'_, T>> {
        self.as_slice_mut().into_slice_mut(range)
    }

    /// Read-only views of `size` elements each (see [`DeviceSlice::chunks`]).
    pub fn chunks(&self, size: usize) -> Result<impl Iterator<Item = DeviceSlice<'_, T>>> {
        self.as_slice().chunks(size)
    }

    /// Disjoint writable views of `size` elements each, as `<[T]>::chunks_mut`: for
    /// receiving one block from each peer (see [`DeviceSliceMut::into_chunks_mut`]).
    pub fn chunks_mut(
        &mut self,
        size: usize,
    ) -> Result<impl Iterator<Item = DeviceSliceMut<'_, T>>> {
        self.as_slice_mut().into_chunks_mut(size)
    }

    /// Two writable views, of elements `..mid` and `mid..`.
    pub fn split_at_mut(
        &mut self,
        mid: usize,
    ) -> Result<(DeviceSliceMut<'_, T>, DeviceSliceMut<'_, T>)> {
        self.as_slice_mut().split_at_mut(mid)
    }
}

impl<T: Element> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        // Kernels still running may use the memory: wait for them before `raw` frees it.
        match self.raw.device().synchronize() {
            // SAFETY: `raw` is dropped once, here, and not used after.
            Ok(()) => unsafe { ManuallyDrop::drop(&mut self.raw) },
            Err(e) => log::warn!(
                "dropping a DeviceBuffer: waiting for its device failed ({e}); its {} bytes \
                 at {:#x} are leaked rather than freed under kernels that may still use them",
                self.raw.bytes(),
                self.raw.ptr()
            ),
        }
    }
}

/// `start..end` of a range over `len` elements, or an error naming it.
fn bounds(range: &impl RangeBounds<usize>, len: usize) -> Result<(usize, usize)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => Some(s),
        Bound::Excluded(&s) => s.checked_add(1),
        Bound::Unbounded => Some(0),
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1),
        Bound::Excluded(&e) => Some(e),
        Bound::Unbounded => Some(len),
    };
    match (start, end) {
        (Some(s), Some(e)) if s <= e && e <= len => Ok((s, e)),
        _ => Err(Error::invalid_argument(format!(
            "range {} is out of bounds of a slice of {len} elements",
            show_range(range)
        ))),
    }
}

/// A range as Rust writes it (`2..9`, `..=7`, `3..`).
fn show_range(range: &impl RangeBounds<usize>) -> String {
    let start = match range.start_bound() {
        Bound::Included(s) => s.to_string(),
        Bound::Excluded(s) => format!("{s}+1"),
        Bound::Unbounded => String::new(),
    };
    let end = match range.end_bound() {
        Bound::Included(e) => format!("={e}"),
        Bound::Excluded(e) => e.to_string(),
        Bound::Unbounded => String::new(),
    };
    format!("{start}..{end}")
}

fn check_chunk(size: usize) -> Result<()> {
    if size == 0 {
        return Err(Error::invalid_argument("chunks of 0 elements"));
    }
    Ok(())
}

/// A read-only view of device elements (`&[T]` of device memory).
pub struct DeviceSlice<'a, T: Element> {
    ordinal: i32,
    ptr: DevPtr,
    len: usize,
    _t: PhantomData<&'a [T]>,
}

impl<T: Element> Clone for DeviceSlice<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: Element> Copy for DeviceSlice<'_, T> {}

/// A writable view of device elements (`&mut [T]` of device memory).
pub struct DeviceSliceMut<'a, T: Element> {
    ordinal: i32,
    ptr: DevPtr,
    len: usize,
    _t: PhantomData<&'a mut [T]>,
}

impl<T: Element> std::fmt::Debug for DeviceSlice<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceSlice<{}>({:#x}, {})",
            T::DATA_TYPE.name(),
            self.ptr,
            self.len
        )
    }
}

impl<T: Element> std::fmt::Debug for DeviceSliceMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceSliceMut<{}>({:#x}, {})",
            T::DATA_TYPE.name(),
            self.ptr,
            self.len
        )
    }
}

fn device_of(ordinal: i32) -> Result<Device> {
    Device::open(ordinal)
}

impl<'a, T: Element> DeviceSlice<'a, T> {
    /// A view of `len` elements at `ptr` on device `ordinal`.
    ///
    /// # Safety
    ///
    /// The memory must be live device memory of that many elements, not written by anything
    /// else, for `'a`.
    #[cfg_attr(not(feature = "cudarc"), allow(dead_code))]
    pub(crate) unsafe fn from_raw(ordinal: i32, ptr: DevPtr, len: usize) -> DeviceSlice<'a, T> {
        DeviceSlice {
            ordinal,
            ptr,
            len,
            _t: PhantomData,
        }
    }
    /// How many elements it views.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it views no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The ordinal of the device holding it.
    pub fn device_ordinal(&self) -> i32 {
        self.ordinal
    }
    /// The device address of its first element, for the raw layer.
    pub fn as_raw_ptr(&self) -> DevPtr {
        self.ptr
    }
    /// Elements `range` of this view.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceSlice<'a, T>> {
        let (s, e) = bounds(&range, self.len)?;
        Ok(DeviceSlice {
            ordinal: self.ordinal,
            ptr: self.ptr + (s * std::mem::size_of::<T>()) as u64,
            len: e - s,
            _t: PhantomData,
        })
    }
    /// Views of `size` elements each, in order (the last one shorter when `size` does not
    /// divide the length), as `<[T]>::chunks`; `ncclInvalidArgument` when `size` is 0.
    pub fn chunks(&self, size: usize) -> Result<impl Iterator<Item = DeviceSlice<'a, T>>> {
        check_chunk(size)?;
        let this = *self;
        Ok((0..self.len).step_by(size).map(move |s| DeviceSlice {
            ptr: this.ptr + (s * std::mem::size_of::<T>()) as u64,
            len: size.min(this.len - s),
            ..this
        }))
    }
    /// Copies the view into `dst`, which must have the same length, once every stream of the
    /// device is idle: the work queued before on any stream has written it. Where ranks share
    /// a device (threads of one process on one GPU), that includes the other ranks' kernels,
    /// which may be waiting for this rank: use [`DeviceSlice::copy_to_host_after`] there.
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        self.copy_waiting(dst, None)
    }
    /// Copies the view into `dst` once `stream` (the stream whose work writes it) is idle,
    /// not waiting for the device's other streams (but for blocking ones: the copy runs on
    /// the legacy stream, which `Stream::new_blocking` streams are ordered with).
    pub fn copy_to_host_after(&self, dst: &mut [T], stream: &Stream) -> Result<()> {
        self.copy_waiting(dst, Some(stream))
    }
    fn copy_waiting(&self, dst: &mut [T], after: Option<&Stream>) -> Result<()> {
        if dst.len() != self.len {
            return Err(Error::invalid_argument(format!(
                "copy to the host: the host slice has {} elements, the device slice {}",
                dst.len(),
                self.len
            )));
        }
        if self.len == 0 {
            return Ok(());
        }
        let dev = device_of(self.ordinal)?;
        match after {
            Some(stream) => stream.synchronize()?,
            None => dev.synchronize()?,
        }
        dev.copy_dtoh(as_bytes_mut(dst), self.ptr)
    }
    /// The view's elements, copied to the host.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut v = vec![T::default(); self.len];
        self.copy_to_host(&mut v)?;
        Ok(v)
    }
    /// As [`DeviceSlice::to_vec`], waiting for `stream` only.
    pub fn to_vec_after(&self, stream: &Stream) -> Result<Vec<T>> {
        let mut v = vec![T::default(); self.len];
        self.copy_to_host_after(&mut v, stream)?;
        Ok(v)
    }
}

impl<'a, T: Element> DeviceSliceMut<'a, T> {
    /// A writable view of `len` elements at `ptr` on device `ordinal`.
    ///
    /// # Safety
    ///
    /// The memory must be live device memory of that many elements, used by nothing else,
    /// for `'a`.
    #[cfg_attr(not(feature = "cudarc"), allow(dead_code))]
    pub(crate) unsafe fn from_raw(ordinal: i32, ptr: DevPtr, len: usize) -> DeviceSliceMut<'a, T> {
        DeviceSliceMut {
            ordinal,
            ptr,
            len,
            _t: PhantomData,
        }
    }
    /// How many elements it views.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it views no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The ordinal of the device holding it.
    pub fn device_ordinal(&self) -> i32 {
        self.ordinal
    }
    /// The device address of its first element, for the raw layer.
    pub fn as_raw_ptr(&self) -> DevPtr {
        self.ptr
    }
    /// A read-only view of the same elements, borrowing this one.
    pub fn as_slice(&self) -> DeviceSlice<'_, T> {
        DeviceSlice {
            ordinal: self.ordinal,
            ptr: self.ptr,
            len: self.len,
            _t: PhantomData,
        }
    }
    /// A shorter-lived writable view of the same elements.
    pub fn reborrow(&mut self) -> DeviceSliceMut<'_, T> {
        DeviceSliceMut {
            ordinal: self.ordinal,
            ptr: self.ptr,
            len: self.len,
            _t: PhantomData,
        }
    }
    /// Elements `range` of this view, consuming it.
    pub fn into_slice_mut(self, range: impl RangeBounds<usize>) -> Result<DeviceSliceMut<'a, T>> {
        let (s, e) = bounds(&range, self.len)?;
        Ok(DeviceSliceMut {
            ordinal: self.ordinal,
            ptr: self.ptr + (s * std::mem::size_of::<T>()) as u64,
            len: e - s,
            _t: PhantomData,
        })
    }
    /// Two views, of elements `..mid` and `mid..`, consuming this one.
    pub fn split_at_mut(
        self,
        mid: usize,
    ) -> Result<(DeviceSliceMut<'a, T>, DeviceSliceMut<'a, T>)> {
        if mid > self.len {
            return Err(Error::invalid_argument(format!(
                "split at {mid} of a slice of {} elements",
                self.len
            )));
        }
        let tail = DeviceSliceMut {
            ordinal: self.ordinal,
            ptr: self.ptr + (mid * std::mem::size_of::<T>()) as u64,
            len: self.len - mid,
            _t: PhantomData,
        };
        let head = DeviceSliceMut { len: mid, ..self };
        Ok((head, tail))
    }
    /// Disjoint writable views of `size` elements each, in order (the last one shorter when
    /// `size` does not divide the length), as `<[T]>::chunks_mut`, consuming this view;
    /// `ncclInvalidArgument` when `size` is 0.
    pub fn into_chunks_mut(
        self,
        size: usize,
    ) -> Result<impl Iterator<Item = DeviceSliceMut<'a, T>>> {
        check_chunk(size)?;
        let (ordinal, ptr, len) = (self.ordinal, self.ptr, self.len);
        Ok((0..len).step_by(size).map(move |s| DeviceSliceMut {
            ordinal,
            ptr: ptr + (s * std::mem::size_of::<T>()) as u64,
            len: size.min(len - s),
            _t: PhantomData,
        }))
    }
    /// Overwrites the view with `src`, which must have the same length, once every stream of
    /// the device is idle (see [`DeviceSlice::copy_to_host`]; where ranks share a device, use
    /// [`DeviceSliceMut::copy_from_host_after`]).
    pub fn copy_from_host(&mut self, src: &[T]) -> Result<()> {
        self.copy_waiting(src, None)
    }
    /// Overwrites the view with `src` once `stream` (the stream whose work uses it) is idle,
    /// not waiting for the device's other streams (but for blocking ones, as
    /// [`DeviceSlice::copy_to_host_after`]).
    pub fn copy_from_host_after(&mut self, src: &[T], stream: &Stream) -> Result<()> {
        self.copy_waiting(src, Some(stream))
    }
    /// Copies `src` (device memory of the same device and length) into the view, in
    /// `stream`'s order: the copy starts after the stream's earlier work and later work sees
    /// it, without the host waiting (`cuMemcpyDtoDAsync`). The two must not overlap.
    pub fn copy_from_device<'s>(
        &mut self,
        src: impl IntoDeviceSlice<'s, Elem = T>,
        stream: &Stream,
    ) -> Result<()> {
        let src = src.into_device_slice();
        if src.len() != self.len || src.device_ordinal() != self.ordinal {
            return Err(Error::invalid_argument(format!(
                "copy between device buffers: the source has {} elements on device {}, the \
                 destination {} on device {}",
                src.len(),
                src.device_ordinal(),
                self.len,
                self.ordinal
            )));
        }
        let bytes = self.len * std::mem::size_of::<T>();
        let (s, d) = (src.as_raw_ptr(), self.ptr);
        if s < d + bytes as DevPtr && d < s + bytes as DevPtr {
            return Err(Error::invalid_argument(
                "copy between device buffers: the source and the destination overlap",
            ));
        }
        if bytes == 0 {
            return Ok(());
        }
        device_of(self.ordinal)?.copy_dtod_async(d, s, bytes, stream.handle())
    }
    fn copy_waiting(&mut self, src: &[T], after: Option<&Stream>) -> Result<()> {
        if src.len() != self.len {
            return Err(Error::invalid_argument(format!(
                "copy from the host: the host slice has {} elements, the device slice {}",
                src.len(),
                self.len
            )));
        }
        if self.len == 0 {
            return Ok(());
        }
        let dev = device_of(self.ordinal)?;
        match after {
            Some(stream) => stream.synchronize()?,
            None => dev.synchronize()?,
        }
        dev.copy_htod(self.ptr, as_bytes(src))
    }
    /// Copies the view into `dst`, which must have the same length.
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        self.as_slice().copy_to_host(dst)
    }
    /// The view's elements, copied to the host.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        self.as_slice().to_vec()
    }
}

/// What collectives read: a [`DeviceSlice`], or anything that lends one (`&DeviceBuffer<T>`,
/// `&DeviceSliceMut<T>`, …).
pub trait IntoDeviceSlice<'a> {
    /// The element type.
    type Elem: Element;
    /// The view.
    fn into_device_slice(self) -> DeviceSlice<'a, Self::Elem>;
}

/// What collectives write: a [`DeviceSliceMut`], or anything that lends one
/// (`&mut DeviceBuffer<T>`, `&mut DeviceSliceMut<T>`).
pub trait IntoDeviceSliceMut<'a> {
    /// The element type.
    type Elem: Element;
    /// The view.
    fn into_device_slice_mut(self) -> DeviceSliceMut<'a, Self::Elem>;
}

impl<'a, T: Element> IntoDeviceSlice<'a> for DeviceSlice<'a, T> {
    type Elem = T;
    fn into_device_slice(self) -> DeviceSlice<'a, T> {
        self
    }
}
impl<'a, T: Element> IntoDeviceSlice<'a> for &DeviceSlice<'a, T> {
    type Elem = T;
    fn into_device_slice(self) -> DeviceSlice<'a, T> {
        *self
    }
}
impl<'a, T: Element> IntoDeviceSlice<'a> for &'a DeviceBuffer<T> {
    type Elem = T;
    fn into_device_slice(self) -> DeviceSlice<'a, T> {
        self.as_slice()
    }
}
impl<'a, T: Element> IntoDeviceSlice<'a> for &'a DeviceSliceMut<'_, T> {
    type Elem = T;
    fn into_device_slice(self) -> DeviceSlice<'a, T> {
        self.as_slice()
    }
}
impl<'a, T: Element> IntoDeviceSliceMut<'a> for DeviceSliceMut<'a, T> {
    type Elem = T;
    fn into_device_slice_mut(self) -> DeviceSliceMut<'a, T> {
        self
    }
}
impl<'a, T: Element> IntoDeviceSliceMut<'a> for &'a mut DeviceSliceMut<'_, T> {
    type Elem = T;
    fn into_device_slice_mut(self) -> DeviceSliceMut<'a, T> {
        self.reborrow()
    }
}
impl<'a, T: Element> IntoDeviceSliceMut<'a> for &'a mut DeviceBuffer<T> {
    type Elem = T;
    fn into_device_slice_mut(self) -> DeviceSliceMut<'a, T> {
        self.as_slice_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_checked() {
        assert_eq!(bounds(&(..), 4).unwrap(), (0, 4));
        assert_eq!(bounds(&(1..=2), 4).unwrap(), (1, 3));
        assert_eq!(bounds(&(4..), 4).unwrap(), (4, 4));
        let (hi, lo) = (3, 2);
        assert!(bounds(&(hi..lo), 4).is_err());
        assert!(bounds(&(0..5), 4).is_err());
        assert!(bounds(&(..=usize::MAX), 4).is_err());
        let e = bounds(&(2..9), 4).unwrap_err();
        assert_eq!(e.code, crate::NcclResult::InvalidArgument);
        assert!(e.message.contains("4 elements"), "{}", e.message);
        assert!(e.message.contains("range 2..9 "), "{}", e.message);
        assert_eq!(show_range(&(..=3)), "..=3");
        assert_eq!(show_range(&(1..)), "1..");
    }
}
