//! Multicast objects (NVLink SHARP) on either backend: a multicast object names one buffer on
//! each member GPU; through its mapping `multimem` instructions reach all of them at once.
//!
//! Only the communicator's NVLS setup calls this, and only when NCCL_NVLS_ENABLE is exactly 1
//! and every rank's device reports multicast support (`comm::nvls`). The shared GPU hosts set
//! NCCL_NVLS_ENABLE=0: a multicast object there can take every GPU of the host out of service.

use super::{driver, sim, Device, Imp};
use crate::error::{Error, Result};

enum McImp {
    Cuda(driver::Multicast),
    Sim(sim::Multicast),
}

/// One rank's hold on a multicast object: released (unmapped, unbound) when dropped.
pub(crate) struct Multicast {
    dev: Device,
    imp: McImp,
}

impl std::fmt::Debug for Multicast {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Multicast(on {:?})", self.dev)
    }
}

impl Device {
    /// Whether the device can join a multicast object.
    pub(crate) fn multicast_supported(&self) -> Result<bool> {
        dispatch!(self.multicast_supported())
    }

    /// The granularity of a multicast object of `ndev` devices and about `bytes`.
    pub(crate) fn multicast_granularity(&self, ndev: usize, bytes: usize) -> Result<usize> {
        dispatch!(self.multicast_granularity(ndev, bytes))
    }

    /// Creates a multicast object of `ndev` devices and `bytes` (a multiple of the
    /// granularity); the handle is what the other ranks pass to [`Device::multicast_import`].
    pub(crate) fn multicast_create(
        &self,
        ndev: usize,
        bytes: usize,
    ) -> Result<(Multicast, [u8; 64])> {
        let (imp, h) = match &*self.imp {
            Imp::Cuda(d) => {
                let (m, h) = d.multicast_create(ndev, bytes)?;
                (McImp::Cuda(m), h)
            }
            Imp::Sim(d) => {
                let (m, h) = d.multicast_create(ndev, bytes)?;
                (McImp::Sim(m), h)
            }
        };
        Ok((
            Multicast {
                dev: self.clone(),
                imp,
            },
            h,
        ))
    }

    /// Imports the multicast object another rank created.
    pub(crate) fn multicast_import(&self, h: &[u8; 64]) -> Result<Multicast> {
        let imp = match &*self.imp {
            Imp::Cuda(d) => McImp::Cuda(d.multicast_import(h)?),
            Imp::Sim(d) => McImp::Sim(d.multicast_import(h)?),
        };
        Ok(Multicast {
            dev: self.clone(),
            imp,
        })
    }
}

impl Multicast {
    /// Adds our device to the object (every member before anyone binds).
    pub(crate) fn add_device(&self) -> Result<()> {
        match (&*self.dev.imp, &self.imp) {
            (Imp::Cuda(d), McImp::Cuda(m)) => d.multicast_add_device(m),
            (Imp::Sim(d), McImp::Sim(m)) => d.multicast_add_device(m),
            _ => Err(Error::internal("multicast object of another backend")),
        }
    }

    /// Binds memory of our device to the whole object and maps both views: (unicast,
    /// multicast) device addresses, `align`-aligned.
    pub(crate) fn bind_map(&mut self, align: usize) -> Result<(u64, u64)> {
        match (&*self.dev.imp, &mut self.imp) {
            (Imp::Cuda(d), McImp::Cuda(m)) => d.multicast_bind_map(m, align),
            (Imp::Sim(d), McImp::Sim(m)) => d.multicast_bind_map(m, align),
            _ => Err(Error::internal("multicast object of another backend")),
        }
    }
}

impl Drop for Multicast {
    fn drop(&mut self) {
        match (&*self.dev.imp, &mut self.imp) {
            (Imp::Cuda(d), McImp::Cuda(m)) => d.multicast_release(m),
            (Imp::Sim(d), McImp::Sim(m)) => d.multicast_release(m),
            _ => {}
        }
    }
}
