//! A symmetric window's multicast object (NVLS on user buffers, NCCL's "NVLink SHARP buffer
//! registration" for windows): every rank's part of the window bound to one multicast object,
//! whose address the device API gives kernels (`nccl_device::api::DevComm::multimem_ptr`).
//!
//! Made at the window's registration (collective), only where the communicator's NVLS is on
//! (`nvls.rs`: the user set NCCL_NVLS_ENABLE to 1, every rank's GPU has multicast, one node,
//! all p2p) and the window is symmetric and mapped by every rank. Each rank says whether its
//! part can be bound (memory of CUDA's virtual memory API, as `ncclMemAlloc` gives it, its
//! address and size multiples of the multicast granularity); the object exists only where all
//! can, else the window has none and an INFO line says why, as NCCL falls back.
//!
//! Deregistration unbinds this rank's part once this rank's kernels are done. Another rank's
//! kernel still reducing through the object would then miss it (on a GPU: fault), as it
//! would read freed memory through the LSA mapping of any window: ranks deregister a window
//! only after every rank's work on it, as NCCL's collective deregistration assumes. A
//! barrier here would hang a thread that deregisters several ranks' windows in turn.

use super::Comm;
use crate::cuda::{DevPtr, Multicast};
use crate::error::Result;

/// A window's multicast object as this rank holds it: unbound and unmapped when dropped,
/// which must be after the kernels that used its address (the window's deregistration
/// flushes first).
pub(crate) struct WindowMc {
    /// Where the object is mapped here.
    pub addr: DevPtr,
    _mc: Multicast,
}

impl Comm {
    /// The multicast object of a symmetric window of `bytes` at `buff` on every rank (see the
    /// module's comment), or None; every rank calls it at the registration, after the mapping
    /// of every rank's part succeeded on all. A step that fails on some rank (the driver's
    /// refusal) leaves every rank without the object, together: only the bootstrap's own
    /// failures (a dead peer) are errors.
    pub(super) fn window_multicast(&self, buff: DevPtr, bytes: usize) -> Result<Option<WindowMc>> {
        if self.nvls.is_none() {
            return Ok(None);
        }
        let gran = self.device.multicast_granularity(self.nranks, bytes);
        // Memory of the virtual memory API, one allocation holding the whole part at a
        // granularity-aligned offset (the export, a check only, is dropped at once).
        let fits = match (&gran, self.device.vmm_export_at(buff)) {
            (Ok(g), Ok(Some(x))) => {
                let (at, end) = (buff - x.base, x.base + x.bytes as u64);
                at.is_multiple_of(*g as u64)
                    && bytes.is_multiple_of(*g)
                    && buff + bytes as u64 <= end
            }
            _ => false,
        };
        if !self.all_ranks(
            fits,
            "cannot be bound (not ncclMemAlloc memory aligned to the multicast granularity)",
        )? {
            return Ok(None);
        }
        let gran = gran?; // fits: known good
                          // Rank 0 creates the object; the others import it from its handle (none: it failed).
        let (made, handle) = match self.rank {
            0 => match self.device.multicast_create(self.nranks, bytes) {
                Ok((mc, h)) => (Some(mc), h.to_vec()),
                Err(e) => {
                    log::warn!("window multicast object: {e}");
                    (None, Vec::new())
                }
            },
            _ => (None, Vec::new()),
        };
        let handles = self.bootstrap.allgather(&handle)?;
        let Some(root) = handles
            .first()
            .and_then(|h| <[u8; 64]>::try_from(h.as_slice()).ok())
        else {
            log::info!(
                "rank {}: window of {bytes} bytes has no multicast object: rank 0 could not \
                 create one",
                self.rank
            );
            return Ok(None);
        };
        let joined = match made {
            Some(mc) => Ok(mc),
            None => self.device.multicast_import(&root, bytes),
        }
        .and_then(|mc| mc.add_device().map(|_| mc));
        let mut mc = match self.joined(joined, "could not join the object")? {
            Some(mc) => mc,
            None => return Ok(None),
        };
        // Every member was added (the allgather above) before anyone binds.
        let bound = mc.bind_mem(buff, gran);
        let Some(addr) = self.joined(bound, "could not be bound to the object")? else {
            return Ok(None);
        };
        log::info!(
            "rank {}: window of {bytes} bytes bound to a multicast object",
            self.rank
        );
        Ok(Some(WindowMc { addr, _mc: mc }))
    }

    /// Whether `ok` holds on every rank (an allgather); where not, an INFO line names the
    /// first rank whose part `why_not`.
    fn all_ranks(&self, ok: bool, why_not: &str) -> Result<bool> {
        let all = self.bootstrap.allgather(&[ok as u8])?;
        match all.iter().position(|v| v.first() != Some(&1)) {
            None => Ok(true),
            Some(r) => {
                log::info!(
                    "rank {}: a window has no multicast object: rank {r}'s part {why_not}",
                    self.rank
                );
                Ok(false)
            }
        }
    }

    /// `step`'s value where it succeeded on every rank, else None on every rank (this rank's
    /// failure logged).
    fn joined<T>(&self, step: Result<T>, why_not: &str) -> Result<Option<T>> {
        if let Err(e) = &step {
            log::warn!("rank {}: window multicast object: {e}", self.rank);
        }
        let ok = self.all_ranks(step.is_ok(), why_not)?;
        Ok(step.ok().filter(|_| ok))
    }
}
