//! [`AbortHandle`]: a communicator's abort and its async error, from any thread.
//!
//! NCCL's documented way out of a hang is a watchdog thread that polls
//! `ncclCommGetAsyncError` and calls `ncclCommAbort` while another thread is blocked in the
//! communicator's work. A [`Comm`] is `Send` but not `Sync` (one thread issues on it), so the
//! watchdog gets this handle instead: it holds only the parts an abort touches, all of which
//! are safe to use from several threads, and it does not keep the communicator alive.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::order::StreamOrder;
use super::Comm;
use crate::bootstrap::{AbortFlag, Bootstrap};
use crate::cuda::HostFlag;
use crate::error::{Error, Result};
use crate::transport::net::NetPath;

/// Aborts a communicator or reads its async error from any thread (`Send + Sync + Clone`);
/// made by [`Comm::abort_handle`].
///
/// Once the communicator is gone, [`AbortHandle::abort`] does nothing and
/// [`AbortHandle::get_async_error`] keeps reporting the last error it had.
#[derive(Clone)]
pub struct AbortHandle {
    rank: usize,
    aborted: Arc<AtomicBool>,
    abort_flag: AbortFlag,
    async_error: Arc<Mutex<Option<Error>>>,
    kernel_abort: Weak<HostFlag>,
    bootstrap: Weak<Bootstrap>,
    net: Option<Weak<NetPath>>,
    order: Weak<StreamOrder>,
}

impl std::fmt::Debug for AbortHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "AbortHandle(rank {}, aborted: {})",
            self.rank,
            self.is_aborted()
        )
    }
}

const _: () = {
    const fn shareable<T: Send + Sync + Clone>() {}
    shareable::<AbortHandle>();
};

impl AbortHandle {
    pub(super) fn of(c: &Comm) -> AbortHandle {
        AbortHandle {
            rank: c.rank,
            aborted: c.aborted.clone(),
            abort_flag: c.abort_flag.clone(),
            async_error: c.async_error.clone(),
            kernel_abort: Arc::downgrade(&c.kernel_abort),
            bootstrap: Arc::downgrade(&c.bootstrap),
            net: c.net.as_ref().map(Arc::downgrade),
            order: Arc::downgrade(&c.order),
        }
    }

    /// The rank of the communicator this handle aborts.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// `ncclCommAbort` from any thread: kernels in flight stop waiting on peers and end, no
    /// later call waits on a peer, and later operations are invalid usage. A thread blocked in
    /// the communicator's work returns (with an error). The communicator's memory is released
    /// when its owner drops it.
    pub fn abort(&self) {
        // After a fault, this abort is a consequence, not news (see `Bootstrap::abort`). Read
        // before stopping: the stop itself may raise errors of its own.
        let failed = self
            .async_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        self.stop_operations();
        // The bootstrap first: the abort flag's hook closes it at once, with no goodbye.
        if let Some(b) = self.bootstrap.upgrade() {
            b.abort(failed);
        }
        self.abort_flag.abort();
        // A non-blocking group issuing our work must stop before our memory may go; the
        // bootstrap abort above ends any handshake it waits on.
        if let Some(o) = self.order.upgrade() {
            let _ = o.background.wait();
        }
    }

    /// What `NCCL_SHRINK_ABORT` asks before a shrink: the kernels in flight stop waiting on
    /// peers and return, and later operations are invalid usage, but the bootstrap stays open.
    pub(super) fn stop_operations(&self) {
        self.aborted.store(true, Ordering::Release);
        if let Some(f) = self.kernel_abort.upgrade() {
            f.raise();
        }
        if let Some(n) = self.net.as_ref().and_then(Weak::upgrade) {
            n.proxy.abandon();
        }
    }

    /// Whether the communicator was aborted (through this handle, another, or the `Comm`).
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    /// `ncclCommGetAsyncError`: Ok, or the error raised in the background (a peer gone, a
    /// network error). As [`Comm::get_async_error`], a non-blocking group still issuing is
    /// `InProgress`.
    pub fn get_async_error(&self) -> Result<()> {
        if let Some(o) = self.order.upgrade() {
            o.background.state()?;
        }
        match &*self.async_error.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}
