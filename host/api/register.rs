//! User buffer registration (`ncclCommRegister`), typed: a [`Registration`] guard that
//! deregisters when dropped.

use super::buffer::IntoDeviceSlice;
use crate::comm::register::RegHandle;
use crate::comm::Comm;
use crate::cuda::DevPtr;
use crate::error::{Error, Result};

/// A buffer registered with a communicator ([`Comm::register`]); dropping it deregisters.
///
/// It borrows the communicator, which therefore outlives it. Registration is a hint: the
/// library checks and records the memory (NCCL uses it for zero-copy paths); operations on the
/// buffer are correct whether it is registered or not.
#[must_use = "dropping the registration deregisters the buffer"]
pub struct Registration<'c> {
    comm: &'c Comm,
    handle: RegHandle,
}

impl std::fmt::Debug for Registration<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Registration({:#x} with {:?})", self.handle, self.comm)
    }
}

impl Registration<'_> {
    /// The handle `ncclCommRegister` would return.
    pub fn handle(&self) -> RegHandle {
        self.handle
    }

    /// Deregisters now, reporting an error (dropping the guard logs it instead).
    pub fn deregister(self) -> Result<()> {
        let (comm, handle) = (self.comm, self.handle);
        std::mem::forget(self);
        comm.deregister(handle)
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.comm.deregister(self.handle) {
            log::warn!("deregistering a buffer: {e}");
        }
    }
}

impl Comm {
    /// `ncclCommRegister` of a buffer or view of this communicator's device: returns a guard
    /// that deregisters it when dropped (`ncclCommDeregister`).
    ///
    /// ```no_run
    /// # fn f(comm: &nccl::Comm, stream: &nccl::Stream) -> nccl::Result<()> {
    /// use nccl::{DeviceBuffer, Op};
    /// let mut buf = DeviceBuffer::<f32>::zeroed(comm.device(), 1 << 20)?;
    /// let reg = comm.register(&buf)?;
    /// comm.all_reduce_in_place(&mut buf, Op::SUM, stream)?;
    /// drop(reg);
    /// # Ok(()) }
    /// ```
    pub fn register<'b, B: IntoDeviceSlice<'b>>(&self, buf: B) -> Result<Registration<'_>> {
        let view = buf.into_device_slice();
        if view.device_ordinal() != self.device().ordinal {
            return Err(Error::invalid_argument(format!(
                "ncclCommRegister: the buffer is on device {} but the communicator (rank {}) \
                 is on device {}",
                view.device_ordinal(),
                self.rank(),
                self.device().ordinal
            )));
        }
        let bytes = view.len() * std::mem::size_of::<B::Elem>();
        let handle = self.register_ptr(view.as_raw_ptr(), bytes)?;
        Ok(Registration { comm: self, handle })
    }

    /// `ncclCommRegister` of `bytes` at the device address `buff`; the handle is for
    /// [`Comm::deregister`]. The raw layer's (and the C ABI's) form of [`Comm::register`].
    ///
    /// # Safety
    ///
    /// `buff` must stay allocated until it is deregistered: the library checks that the
    /// memory exists on this device now, and may use it in operations while it is registered.
    pub unsafe fn register_raw(&self, buff: DevPtr, bytes: usize) -> Result<RegHandle> {
        self.register_ptr(buff, bytes)
    }
}
