//! `ncclCommSuspend` / `ncclCommResume` (NCCL 2.29): an idle communicator gives back the
//! device memory of its connections and takes it again later, every address unchanged (see
//! `transport/suspend.rs` for which memory and how). Both are collective over the
//! communicator: suspend waits for this rank's operations, meets every rank, then releases;
//! resume restores this rank's blocks, hands the peers in other processes the new exports of
//! those they map, and meets every rank before any may launch again. In between, every
//! operation is `ncclInvalidUsage`; destroy and abort still work.

use super::*;
use crate::transport::suspend;

/// `NCCL_SUSPEND_MEM`: release the connections' device memory.
pub const SUSPEND_MEM: u32 = 0x01;

impl Comm {
    /// `ncclCommSuspend(comm, flags)`: with [`SUSPEND_MEM`] in `flags`, releases the device
    /// memory of this communicator's connections (a copy of it waits in host memory) until
    /// [`Comm::resume`]; without it, does nothing (other bits are ignored, as NCCL does).
    /// Every rank must call it. Refused where `NCCL_CUMEM_ENABLE=0` kept the memory plain, on
    /// a communicator suspended already, revoked or aborted.
    pub fn suspend(&self, flags: u32) -> Result<()> {
        self.check_usable()?;
        if flags & SUSPEND_MEM == 0 {
            return Ok(());
        }
        if !self.ledger.enabled() {
            return Err(Error::invalid_usage(
                "ncclCommSuspend: NCCL_CUMEM_ENABLE=0 (or NCCL_RS_VMM_IPC=0) keeps the \
                 connections' memory plain, which cannot be released at a kept address",
            ));
        }
        let at = |e: Error| e.context(format!("rank {}: ncclCommSuspend", self.rank));
        self.flush().map_err(at)?;
        self.raised_error().map_err(at)?;
        // No rank releases what a peer's kernel may still be writing into.
        self.bootstrap.barrier().map_err(at)?;
        let before = self.ledger.suspendable_bytes();
        self.ledger.suspend(&self.device).map_err(at)?;
        log::info!(
            target: crate::debug::INIT,
            "ncclCommSuspend: rank {} released {} KiB of connection memory",
            self.rank,
            before / 1024
        );
        Ok(())
    }

    /// `ncclCommResume`: takes the memory [`Comm::suspend`] released again, with its contents,
    /// at the same addresses (graphs captured before replay as they did). Every rank must call
    /// it; refused where the communicator is not suspended.
    pub fn resume(&self) -> Result<()> {
        if !self.ledger.is_suspended() {
            return Err(Error::invalid_usage(
                "ncclCommResume: the communicator is not suspended",
            ));
        }
        if self.is_revoked() || self.aborted.load(Ordering::Acquire) {
            return Err(Error::invalid_usage(
                "ncclCommResume: the communicator was revoked or aborted",
            ));
        }
        let at = |e: Error| e.context(format!("rank {}: ncclCommResume", self.rank));
        let reissued = self.ledger.restore_own(&self.device).map_err(at)?;
        let all = self
            .bootstrap
            .allgather(&suspend::encode(&reissued))
            .map_err(at)?;
        let by_rank = all
            .iter()
            .map(|b| suspend::decode(b))
            .collect::<Result<Vec<_>>>()
            .map_err(at)?;
        self.ledger
            .remap_peers(&self.device, &by_rank)
            .map_err(at)?;
        // Every rank maps its peers' memory again before any launches into it.
        self.bootstrap.barrier().map_err(at)?;
        Ok(())
    }

    /// Whether [`Comm::suspend`] released this communicator's memory (not resumed since).
    pub fn is_suspended(&self) -> bool {
        self.ledger.is_suspended()
    }

    /// Bytes of device memory [`Comm::suspend`] releases (`ncclStatGpuMemSuspend`); the rest
    /// of [`Comm::device_memory`] stays while suspended.
    pub fn suspendable_memory(&self) -> usize {
        self.ledger.suspendable_bytes()
    }
}
