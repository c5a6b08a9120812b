//! Windows (`ncclCommWindowRegister`, NCCL 2.27), typed: a [`Window`] guard that holds the
//! buffer and deregisters when dropped.

use super::buffer::DeviceBuffer;
use super::element::Element;
use crate::comm::window::{WinHandle, WIN_COLL_SYMMETRIC};
use crate::comm::Comm;
use crate::cuda::DevPtr;
use crate::error::{Error, Result};

/// A buffer registered as a window of a communicator on every rank ([`Comm::window`]);
/// dropping it deregisters the window (on every rank: each drops its own guard).
///
/// It holds the buffer (peers read it through their mappings while the window lives, so it
/// cannot be freed before) and gives it back through `Deref` / `DerefMut`: collectives run
/// on `&mut *window`.
#[must_use = "dropping the window deregisters it"]
pub struct Window<'c, 'b, T: Element> {
    comm: &'c Comm,
    handle: WinHandle,
    buf: &'b mut DeviceBuffer<T>,
}

impl<T: Element> std::fmt::Debug for Window<'_, '_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Window({:#x} of {:?})", self.handle, self.comm)
    }
}

impl<T: Element> Window<'_, '_, T> {
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

impl<T: Element> std::ops::Deref for Window<'_, '_, T> {
    type Target = DeviceBuffer<T>;
    fn deref(&self) -> &DeviceBuffer<T> {
        self.buf
    }
}

impl<T: Element> std::ops::DerefMut for Window<'_, '_, T> {
    fn deref_mut(&mut self) -> &mut DeviceBuffer<T> {
        self.buf
    }
}

impl<T: Element> Drop for Window<'_, '_, T> {
    fn drop(&mut self) {
        if let Err(e) = self.comm.window_deregister(self.handle) {
            log::warn!("deregistering a window: {e}");
        }
    }
}

impl Comm {
    /// `ncclCommWindowRegister` of a buffer of this communicator's device, on every rank at
    /// once (a collective call: every rank calls it, in the same order as its other window
    /// calls; ranks of one thread use a thread each). `symmetric` (`NCCL_WIN_COLL_SYMMETRIC`):
    /// every rank registers the same size, and small AllReduces then take the symmetric path
    /// where every rank maps every other one (ranks of one node, through p2p). Returns a
    /// guard that holds the buffer and deregisters when dropped.
    ///
    /// ```no_run
    /// # fn f(comm: &nccl::Comm, stream: &nccl::Stream) -> nccl::Result<()> {
    /// use nccl::{DeviceBuffer, Op};
    /// let mut buf = DeviceBuffer::<f32>::zeroed(comm.device(), 1 << 14)?;
    /// let mut win = comm.window(&mut buf, true)?;
    /// comm.all_reduce_in_place(&mut *win, Op::SUM, stream)?;
    /// # Ok(()) }
    /// ```
    pub fn window<'b, T: Element>(
        &self,
        buf: &'b mut DeviceBuffer<T>,
        symmetric: bool,
    ) -> Result<Window<'_, 'b, T>> {
        if buf.device().ordinal != self.device().ordinal {
            return Err(Error::invalid_argument(format!(
                "ncclCommWindowRegister: the buffer is on device {} but the communicator (rank \
                 {}) is on device {}",
                buf.device().ordinal,
                self.rank(),
                self.device().ordinal
            )));
        }
        let bytes = buf.len() * std::mem::size_of::<T>();
        let flags = if symmetric { WIN_COLL_SYMMETRIC } else { 0 };
        let handle = self.window_register(buf.as_raw_ptr(), bytes, flags)?;
        Ok(Window {
            comm: self,
            handle,
            buf,
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
