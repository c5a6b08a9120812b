//! One-sided operations on windows (NCCL 2.29's `ncclPutSignal`, `ncclSignal`,
//! `ncclWaitSignal`; `comm/onesided.rs`): a rank writes into a peer's window and signals it,
//! and the peer's stream waits for the signals; the peer makes no matching call.

use super::stream::Stream;
use crate::comm::group_scope::record_error;
use crate::comm::onesided::SignalWait;
use crate::comm::window::WinHandle;
use crate::comm::Comm;
use crate::cuda::{DevPtr, StreamHandle};
use crate::error::{Error, Result};
use nccl_device::types::DataType;

impl Comm {
    /// `ncclPutSignal`: copies `count` elements of `dtype` at `local` into rank `peer`'s part
    /// of window `window` (a handle of [`Comm::window_register_raw`] or
    /// [`crate::Window::handle`]), `offset` bytes in, then raises a signal at `peer`
    /// ([`Comm::wait_signal_on`] there waits for it): the data is visible there before the
    /// signal. In `stream`'s order; inside a group, at its end with the group's other
    /// operations, in call order. Inside a node it runs on the copy engine (no kernel).
    ///
    /// # Safety
    ///
    /// `local` must be device memory of this communicator's device that stays allocated and
    /// unwritten until the copy is over on `stream`; the library checks what it can (the
    /// allocation's extent, the device, the window's size at the peer).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn put_signal_raw(
        &self,
        local: DevPtr,
        count: usize,
        dtype: DataType,
        peer: usize,
        window: WinHandle,
        offset: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        let go = || -> Result<()> {
            self.enter_call("PutSignal")?;
            let bytes = count.checked_mul(dtype.size()).ok_or_else(|| {
                Error::invalid_argument(format!("count {count} of {} overflows", dtype.name()))
            })?;
            self.put_signal(local, bytes, peer, window, offset, stream)
        };
        go().map_err(|e| record_error(e.context("ncclPutSignal")))
    }

    /// `ncclSignal` on a raw stream: raises a signal at rank `peer`; see [`Comm::signal_on`].
    pub fn signal_raw(&self, peer: usize, stream: StreamHandle) -> Result<()> {
        let go = || -> Result<()> {
            self.enter_call("Signal")?;
            Comm::signal(self, peer, stream)
        };
        go().map_err(|e| record_error(e.context("ncclSignal")))
    }

    /// `ncclWaitSignal` on a raw stream; see [`Comm::wait_signal_on`].
    pub fn wait_signal_raw(&self, waits: &[SignalWait], stream: StreamHandle) -> Result<()> {
        let go = || -> Result<()> {
            self.enter_call("WaitSignal")?;
            Comm::wait_signal(self, waits, stream)
        };
        go().map_err(|e| record_error(e.context("ncclWaitSignal")))
    }

    /// `ncclSignal`: raises a signal at rank `peer` in `stream`'s order (after the stream's
    /// earlier work, puts included), with no data.
    pub fn signal_on(&self, peer: usize, stream: &Stream) -> Result<()> {
        self.signal_raw(peer, stream.handle())
    }

    /// `ncclWaitSignal`: work queued on `stream` after this starts only once, for each wait,
    /// `ops` more signals from its `peer` arrived than this rank waited for before. No kernel
    /// runs: the stream itself waits. An abort of the communicator releases the wait.
    pub fn wait_signal_on(&self, waits: &[SignalWait], stream: &Stream) -> Result<()> {
        self.wait_signal_raw(waits, stream.handle())
    }
}
