//! Simulated VMM memory released and regained in place (`ncclCommSuspend`,
//! `ncclCommResume`): the range is mapped over with inaccessible anonymous memory (its memfd
//! closed, so the pages go once no process maps them), and later with a new memfd, or the
//! peer's new descriptor, at the same address. A kernel or a copy that touched the range in
//! between would fault, as on the device.

use super::*;
use crate::cuda::backend::Suspending;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Maps `bytes` at `p` over whatever is there: `fd`'s memory (shared, read-write), or with
/// None nothing accessible.
///
/// # Safety
/// `[p, p + bytes)` must be a region of ours that nothing reads or writes now.
unsafe fn map_over(p: DevPtr, bytes: usize, fd: Option<i32>) -> Result<()> {
    let (prot, flags, fd) = match fd {
        Some(fd) => (
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
        ),
        None => (
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
            -1,
        ),
    };
    // SAFETY: as the caller promises; MAP_FIXED replaces our own mapping of the range.
    let q = unsafe { libc::mmap(p as *mut libc::c_void, bytes, prot, flags, fd, 0) };
    if q == libc::MAP_FAILED || q as u64 != p {
        return Err(Error::system(format!(
            "mmap over {p:#x} ({bytes} bytes): {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// A region of ours at exactly `p`, in the state `parked` says.
fn region_at(regions: &mut BTreeMap<u64, Region>, p: DevPtr, parked: bool) -> Result<&mut Region> {
    regions
        .get_mut(&p)
        .filter(|r| r.parked == parked)
        .ok_or_else(|| {
            Error::internal(format!(
                "{p:#x} is no {} simulated VMM mapping",
                if parked { "parked" } else { "live" }
            ))
        })
}

impl Suspending for Device {
    fn vmm_evict(&self, p: DevPtr) -> Result<()> {
        let mut regions = lock(regions());
        let r = region_at(&mut regions, p, false)?;
        if r.vmm_fd.is_none() {
            return Err(Error::internal(format!(
                "{p:#x} is no VMM allocation of ours"
            )));
        }
        // SAFETY: our own region, idle (the communicator waited for its work).
        unsafe { map_over(p, r.bytes, None)? };
        r.vmm_fd = None;
        r.parked = true;
        Ok(())
    }

    fn vmm_restore(&self, p: DevPtr) -> Result<()> {
        let mut regions = lock(regions());
        let r = region_at(&mut regions, p, true)?;
        if r.name.is_some() {
            return Err(Error::internal(format!(
                "{p:#x} is no VMM allocation of ours"
            )));
        }
        let fd = super::sharing::vmm_memfd(r.bytes)?;
        // SAFETY: our parked region; the memfd holds its size.
        unsafe { map_over(p, r.bytes, Some(fd.as_raw_fd()))? };
        r.vmm_fd = Some(fd);
        r.parked = false;
        Ok(())
    }

    fn vmm_detach(&self, p: DevPtr, bytes: usize) -> Result<()> {
        let mut regions = lock(regions());
        let r = region_at(&mut regions, p, false)?;
        if r.bytes != bytes || r.vmm_fd.is_some() || r.name.is_some() {
            return Err(Error::internal(format!("{p:#x} is no peer's VMM mapping")));
        }
        // SAFETY: our mapping of a peer's memory, idle.
        unsafe { map_over(p, bytes, None)? };
        r.parked = true;
        Ok(())
    }

    fn vmm_reattach(&self, fd: BorrowedFd<'_>, p: DevPtr, bytes: usize) -> Result<()> {
        let size = crate::cuda::fdpass::file_size(fd)? as usize;
        if size < bytes {
            return Err(Error::remote(format!(
                "a peer's resumed memory holds {size} bytes, {bytes} were mapped before"
            )));
        }
        let mut regions = lock(regions());
        let r = region_at(&mut regions, p, true)?;
        // SAFETY: our parked mapping; the descriptor holds at least `bytes` (checked above).
        unsafe { map_over(p, bytes, Some(fd.as_raw_fd()))? };
        r.parked = false;
        Ok(())
    }
}
