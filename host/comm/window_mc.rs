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

use super::Comm;
use crate::cuda::{DevPtr, Multicast};
use crate::error::{Error, Result};

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
    /// of every rank's part succeeded on all.
    pub(super) fn window_multicast(&self, buff: DevPtr, bytes: usize) -> Result<Option<WindowMc>> {
        if self.nvls.is_none() {
            return Ok(None);
        }
        let gran = self.device.multicast_granularity(self.nranks, bytes)?;
        // Memory of the virtual memory API, one allocation holding the whole part at a
        // granularity-aligned offset (the export, a check only, is dropped at once).
        let fits = match self.device.vmm_export_at(buff) {
            Ok(Some(x)) => {
                let (at, end) = (buff - x.base, x.base + x.bytes as u64);
                at.is_multiple_of(gran as u64)
                    && bytes.is_multiple_of(gran)
                    && buff + bytes as u64 <= end
            }
            _ => false,
        };
        let all = self.bootstrap.allgather(&[fits as u8])?;
        if let Some(r) = all.iter().position(|v| v.first() != Some(&1)) {
            log::info!(
                "rank {}: window of {bytes} bytes has no multicast object: rank {r}'s part is not \
                 ncclMemAlloc memory aligned to the multicast granularity ({gran} bytes)",
                self.rank
            );
            return Ok(None);
        }
        // Rank 0 creates the object; the others import it from its handle.
        let (made, handle) = match self.rank {
            0 => {
                let (mc, h) = self.device.multicast_create(self.nranks, bytes)?;
                (Some(mc), h.to_vec())
            }
            _ => (None, Vec::new()),
        };
        let handles = self.bootstrap.allgather(&handle)?;
        let mut mc = match made {
            Some(mc) => mc,
            None => {
                let h: [u8; 64] = handles
                    .first()
                    .and_then(|h| h.as_slice().try_into().ok())
                    .ok_or_else(|| Error::remote("rank 0 sent a malformed multicast handle"))?;
                self.device.multicast_import(&h, bytes)?
            }
        };
        mc.add_device()?;
        // Every member is added before anyone binds.
        self.bootstrap.barrier()?;
        let addr = mc.bind_mem(buff, gran)?;
        // Every rank's part is bound before any kernel may use the address.
        self.bootstrap.barrier()?;
        log::info!(
            "rank {}: window of {bytes} bytes bound to a multicast object",
            self.rank
        );
        Ok(Some(WindowMc { addr, _mc: mc }))
    }
}
