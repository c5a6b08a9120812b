//! Multicast objects (NVLink SHARP) on either backend: a multicast object names one buffer on
//! each member GPU; through its mapping `multimem` instructions reach all of them at once.
//!
//! Only the communicator's NVLS setup calls this, and only when the user set NCCL_NVLS_ENABLE
//! to exactly "1" and every rank's device reports multicast support (`comm::nvls`). The shared
//! GPU hosts keep NCCL_NVLS_ENABLE at 0: a multicast object there can take every GPU of the
//! host out of service. So creating or importing an object checks the variable here too, at
//! the last step before the driver, whoever the caller is.

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
    /// Device memory [`Multicast::bind_map`] allocated for it: counted in the device's
    /// ledger while bound.
    booked: usize,
}

impl std::fmt::Debug for Multicast {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Multicast(on {:?})", self.dev)
    }
}

/// Whether the user allows multicast objects: NCCL_NVLS_ENABLE (environment or
/// NCCL_CONF_FILE) exactly "1", nothing else. The one reading of the variable in the library.
/// On the simulator NCCL_RS_SIM_NVLS=1 allows them too: the tests turn NVLS on with it, so
/// that no test sets the variable that turns multicast on for real GPUs (the CUDA backend
/// never reads the simulator's switch).
pub(crate) fn allowed_by_env() -> bool {
    user_allows(crate::env::NVLS_ENABLE.raw().as_deref())
        || (crate::cuda::backend() == crate::cuda::Backend::Sim
            && crate::env::RS_SIM_NVLS.int() == 1)
}

/// NCCL's rule for NCCL_NVLS_ENABLE's value `v`: on only when it is exactly "1".
fn user_allows(v: Option<&str>) -> bool {
    v == Some("1")
}

/// An error unless [`allowed_by_env`]: no multicast object is made or joined without it.
fn check_allowed(what: &str) -> Result<()> {
    if allowed_by_env() {
        return Ok(());
    }
    Err(Error::invalid_usage(format!(
        "{what}: multicast objects are made only when NCCL_NVLS_ENABLE is exactly \"1\""
    )))
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
        check_allowed("creating a multicast object")?;
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
                booked: 0,
            },
            h,
        ))
    }

    /// Imports the multicast object another rank created, of `bytes` (this rank's layout:
    /// an object of another size is refused).
    pub(crate) fn multicast_import(&self, h: &[u8; 64], bytes: usize) -> Result<Multicast> {
        check_allowed("importing a multicast object")?;
        let imp = match &*self.imp {
            Imp::Cuda(d) => McImp::Cuda(d.multicast_import(h, bytes)?),
            Imp::Sim(d) => McImp::Sim(d.multicast_import(h, bytes)?),
        };
        Ok(Multicast {
            dev: self.clone(),
            imp,
            booked: 0,
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
        let (mapped, bytes) = match (&*self.dev.imp, &mut self.imp) {
            (Imp::Cuda(d), McImp::Cuda(m)) => (d.multicast_bind_map(m, align)?, m.bytes()),
            (Imp::Sim(d), McImp::Sim(m)) => (d.multicast_bind_map(m, align)?, m.bytes()),
            _ => return Err(Error::internal("multicast object of another backend")),
        };
        self.dev.book(bytes, true);
        self.booked = bytes;
        Ok(mapped)
    }
}

impl Multicast {
    /// Binds the object's size of our device's memory at `ptr` (the caller's: memory of CUDA's
    /// virtual memory API, granularity-aligned, which must outlive this binding) and maps the
    /// object: its multicast address, `align`-aligned.
    pub(crate) fn bind_mem(&mut self, ptr: u64, align: usize) -> Result<u64> {
        match (&*self.dev.imp, &mut self.imp) {
            (Imp::Cuda(d), McImp::Cuda(m)) => d.multicast_bind_mem(m, ptr, align),
            (Imp::Sim(d), McImp::Sim(m)) => d.multicast_bind_mem(m, ptr, align),
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
        self.dev.book(self.booked, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::{set_backend, Backend};
    use crate::error::NcclResult;

    /// Whoever calls, no multicast object is created or imported unless the user set
    /// NCCL_NVLS_ENABLE to exactly 1 (checked on the simulator; the same check stands before
    /// the driver's calls).
    #[test]
    fn no_multicast_object_without_nvls_enable() {
        for v in [
            None,
            Some("0"),
            Some("2"),
            Some("yes"),
            Some(" 1"),
            Some("1 "),
        ] {
            assert!(!user_allows(v), "{v:?}");
        }
        assert!(user_allows(Some("1")));
        let _ = set_backend(Backend::Sim);
        assert!(
            !allowed_by_env(),
            "run the library's tests with NCCL_NVLS_ENABLE and NCCL_RS_SIM_NVLS unset"
        );
        let dev = Device::open(0).expect("device 0");
        assert!(
            dev.is_sim(),
            "the simulator must be the backend of the lib tests"
        );
        let e = dev.multicast_create(2, 2 << 20).expect_err("refused");
        assert_eq!(e.code, NcclResult::InvalidUsage, "{e}");
        assert!(e.message.contains("NCCL_NVLS_ENABLE"), "{e}");
        let e = dev
            .multicast_import(&[0u8; 64], 2 << 20)
            .expect_err("refused");
        assert_eq!(e.code, NcclResult::InvalidUsage, "{e}");
    }
}
