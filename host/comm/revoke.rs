//! `ncclCommRevoke` (NCCL 2.28): a rank stops its communicator's work in flight (kernels
//! waiting on a peer that will never come end, the proxy gives up its transfers) and keeps the
//! communicator for what recovers from it: `ncclCommShrink` (or `Comm::split`) to the ranks
//! that remain, then `ncclCommDestroy` or `ncclCommAbort`. Each rank revokes its own: the call
//! is not collective. Later operations on it are invalid usage, and finalize an invalid
//! argument, as in NCCL.

use super::Comm;
use crate::error::{Error, Result};
use std::sync::atomic::Ordering;

impl Comm {
    /// Revokes the communicator (see the module's text). Returns once this rank's operations
    /// ended. An error when it was finalized, aborted or already revoked.
    pub fn revoke(&self) -> Result<()> {
        if self.is_finalized() {
            return Err(Error::invalid_argument(
                "ncclCommRevoke: the communicator was finalized",
            ));
        }
        if self.is_revoked() {
            return Err(Error::invalid_argument(
                "ncclCommRevoke: the communicator was already revoked",
            ));
        }
        if self.is_aborted() {
            return Err(Error::invalid_argument(
                "ncclCommRevoke: the communicator was aborted",
            ));
        }
        self.revoked.store(true, Ordering::Release);
        self.stop_operations();
        // Kernels see the abort flag and end; what they computed is undefined, as NCCL's.
        if let Err(e) = self.flush() {
            log::info!(
                "rank {}: revoked, its operations ended with: {e}",
                self.rank
            );
        }
        log::info!(
            "rank {}: communicator revoked: only shrink, split, destroy or abort may follow",
            self.rank
        );
        Ok(())
    }

    /// Whether [`Comm::revoke`] was called.
    pub fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }

    /// What a split or shrink asks of its parent: usable, or revoked (what revoking is for).
    pub(crate) fn check_parent(&self) -> Result<()> {
        match self.is_revoked() {
            true => Ok(()),
            false => self.check_usable(),
        }
    }
}
