//! Windows (`ncclCommWindowRegister`, NCCL 2.27), typed: a [`Window`] guard that borrows the
//! buffer and deregisters when dropped.

use super::buffer::IntoDeviceSlice;
use crate::comm::window::{WinHandle, WIN_COLL_SYMMETRIC};
use crate::comm::Comm;
use crate::cuda::DevPtr;
use crate::error::{Error, Result};
use std::marker::PhantomData;

/// A buffer registered as a window of a communicator on every rank ([`Comm::window`]);
/// dropping it deregisters the window (on every rank: each drops its own guard).
///
/// It borrows the communicator and the buffer: peers read the buffer through their mappings
/// while the window lives, so it cannot be freed before.
#[must_use = "dropping the window deregisters it"]
pub struct Window<'c, 'b> {
    comm: &'c Comm,
    handle: WinHandle,
    _buffer: PhantomData<&'b ()>,
}

impl std::fmt::Debug for Window<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Window({:#x} of {:?})", self.handle, self.comm)
    }
}

impl Window<'_, '_> {
    /// The handle `ncclCommWindowRegister` would return.
    pub fn handle(&self) -> WinHandle {
        self.handle
    }

    /// Deregisters now, reporting an error (dropping the guard logs it instead).
    pub fn deregister(self) -> Result<()> {
        let (comm, handle) = (self.comm, self.handle);
        std::mem::forget(self);
        comm.window_deregister(handle)
    }
}

impl Drop for Window<'_, '_> {
    fn drop(&mut self) {
        if let Err(e) = self.comm.window_deregister(self.handle) {
            log::warn!("deregistering a window: {e}");
        }
    }
}

impl Comm {
    /// `ncclCommWindowRegister` of a buffer or view of this communicator's device, on every
    /// rank at once (a collective call: every rank calls it, in the same order as its other
    /// window calls). `symmetric` (`NCCL_WIN_COLL_SYMMETRIC`): every rank registers the same
    /// size, and small AllReduces then take the symmetric path where every rank maps every
    /// other one (ranks of one process). Returns a guard that deregisters when dropped.
    ///
    /// ```no_run
    /// # fn f(comm: &nccl::Comm, stream: &nccl::Stream) -> nccl::Result<()> {
    /// use nccl::{DeviceBuffer, Op};
    /// let mut buf = DeviceBuffer::<f32>::zeroed(comm.device(), 1 << 16)?;
    /// let win = comm.window(&buf, true)?;
    /// comm.all_reduce_in_place(&mut buf, Op::SUM, stream)?;
    /// # drop(win);
    /// # Ok(()) }
    /// ```
    pub fn window<'b, B: IntoDeviceSlice<'b>>(
        &self,
        buf: B,
        symmetric: bool,
    ) -> Result<Window<'_, 'b>> {
        let view = buf.into_device_slice();
        if view.device_ordinal() != self.device().ordinal {
            return Err(Error::invalid_argument(format!(
                "ncclCommWindowRegister: the buffer is on device {} but the communicator (rank \
                 {}) is on device {}",
                view.device_ordinal(),
                self.rank(),
                self.device().ordinal
            )));
        }
        let bytes = view.len() * std::mem::size_of::<B::Elem>();
        let flags = if symmetric { WIN_COLL_SYMMETRIC } else { 0 };
        let handle = self.window_register(view.as_raw_ptr(), bytes, flags)?;
        Ok(Window {
            comm: self,
            handle,
            _buffer: PhantomData,
        })
    }

    /// `ncclCommWindowRegister` of `bytes` at the device address `buff` (`flags`: 0, or
    /// `NCCL_WIN_COLL_SYMMETRIC` = 1); the handle is for [`Comm::window_deregister_raw`]. The
    /// raw layer's (and the C ABI's) form of [`Comm::window`].
    ///
    /// # Safety
    ///
    /// `buff` must stay allocated until the window is deregistered: peers read it through
    /// their mappings.
    pub unsafe fn window_register_raw(
        &self,
        buff: DevPtr,
        bytes: usize,
        flags: u32,
    ) -> Result<WinHandle> {
        self.window_register(buff, bytes, flags)
    }

    /// `ncclCommWindowDeregister` (collective, as registration).
    pub fn window_deregister_raw(&self, handle: WinHandle) -> Result<()> {
        self.window_deregister(handle)
    }
}
