//! Releasing and regaining the physical memory of VMM mappings in place (`ncclCommSuspend`,
//! `ncclCommResume`): `cuMemUnmap` + `cuMemRelease` leave the range reserved; a new
//! `cuMemCreate` (or a peer's new descriptor) is mapped at the same address again.

use super::sharing::{import_fd, imports, mappings};
use super::*;
use crate::cuda::backend::Suspending;
use std::os::fd::BorrowedFd;

impl Device {
    /// Maps `handle` over the `bytes` reserved at `p` with `access`; on failure nothing stays
    /// mapped (the handle stays the caller's).
    fn map_at(
        &self,
        p: DevPtr,
        bytes: usize,
        handle: sys::CUmemGenericAllocationHandle,
        access: &[sys::CUmemAccessDesc],
    ) -> Result<()> {
        // SAFETY: `p` is a reserved range of `bytes` mapped to nothing (evicted or detached);
        // the handle holds at least `bytes`; `access` holds access.len() descriptors.
        unsafe {
            check(sys::cuMemMap(p, bytes, 0, handle, 0), "cuMemMap")?;
            let r = check(
                sys::cuMemSetAccess(p, bytes, access.as_ptr(), access.len()),
                "cuMemSetAccess",
            );
            if r.is_err() {
                sys::cuMemUnmap(p, bytes);
            }
            r
        }
    }
}

impl Suspending for Device {
    fn vmm_evict(&self, p: DevPtr) -> Result<()> {
        self.make_current()?;
        let mut table = mappings();
        let m = table
            .get_mut(&p)
            .filter(|m| m.handle != 0)
            .ok_or_else(|| Error::internal(format!("{p:#x} is no mapped VMM allocation")))?;
        extent_cache::forget(p);
        // SAFETY: a live mapping of m.size bytes of m.handle made by alloc_vmm; the range
        // stays reserved (freed by free_vmm, which skips the unmap while evicted). Once
        // unmapped, the entry says so whatever the release answers.
        unsafe { check(sys::cuMemUnmap(p, m.size), "cuMemUnmap")? };
        let handle = std::mem::take(&mut m.handle);
        // SAFETY: the handle alloc_vmm created (or a restore), mapped nowhere now.
        check(unsafe { sys::cuMemRelease(handle) }, "cuMemRelease")
    }

    fn vmm_restore(&self, p: DevPtr) -> Result<()> {
        self.make_current()?;
        let mut table = mappings();
        let m = table
            .get_mut(&p)
            .filter(|m| m.handle == 0)
            .ok_or_else(|| Error::internal(format!("{p:#x} is no evicted VMM allocation")))?;
        let prop = self.vmm_prop(m.handles)?;
        let mut handle = 0;
        // SAFETY: out-parameter; prop is valid; m.size is what alloc_vmm created (a multiple
        // of the granularity).
        check(
            unsafe { sys::cuMemCreate(&mut handle, m.size, &prop, 0) },
            &format!("cuMemCreate of {} bytes", m.size),
        )?;
        if let Err(e) = self.map_at(p, m.size, handle, &self.vmm_access()?) {
            // SAFETY: the handle created above, mapped nowhere.
            unsafe { sys::cuMemRelease(handle) };
            return Err(e);
        }
        m.handle = handle;
        Ok(())
    }

    fn vmm_detach(&self, p: DevPtr, bytes: usize) -> Result<()> {
        self.make_current()?;
        let mut table = imports();
        let handle = table
            .get_mut(&p)
            .filter(|h| **h != 0)
            .ok_or_else(|| Error::internal(format!("{p:#x} is no mapped peer allocation")))?;
        extent_cache::forget(p);
        // SAFETY: a live mapping of `bytes` of `handle` made by vmm_import; the range stays
        // reserved (freed by vmm_unmap, which skips the unmap while detached). Once unmapped,
        // the entry says so whatever the release answers.
        unsafe { check(sys::cuMemUnmap(p, bytes), "cuMemUnmap")? };
        let old = std::mem::take(handle);
        // SAFETY: the imported handle, mapped nowhere now.
        check(unsafe { sys::cuMemRelease(old) }, "cuMemRelease")
    }

    fn vmm_reattach(&self, fd: BorrowedFd<'_>, p: DevPtr, bytes: usize) -> Result<()> {
        self.make_current()?;
        let mut table = imports();
        let slot = table
            .get_mut(&p)
            .filter(|h| **h == 0)
            .ok_or_else(|| Error::internal(format!("{p:#x} is no detached peer allocation")))?;
        let handle = import_fd(fd)?;
        if let Err(e) = self.map_at(p, bytes, handle, &[access_desc(self.ordinal)]) {
            // SAFETY: the handle imported above, mapped nowhere.
            unsafe { sys::cuMemRelease(handle) };
            return Err(e);
        }
        *slot = handle;
        Ok(())
    }
}
