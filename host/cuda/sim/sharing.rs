//! Memory shared between processes: IPC handles and VMM allocations, all of them named
//! shared-memory regions here.

use super::*;

impl Sharing for Device {
    fn ipc_handle(&self, p: DevPtr) -> Result<[u8; 64]> {
        let regions = lock(regions());
        let r = regions.get(&p).ok_or_else(|| {
            Error::invalid_argument("IPC handle of a pointer that is no allocation base")
        })?;
        if r.vmm_fd.is_some() {
            // As cuIpcGetMemHandle: memory of the virtual memory API has no IPC handle.
            return Err(Error::invalid_argument(
                "IPC handle of memory of the virtual memory API",
            ));
        }
        let name = r
            .name
            .as_ref()
            .ok_or_else(|| Error::invalid_argument("IPC handle of a peer's mapping"))?;
        let mut h = [0u8; 64];
        h[..4].copy_from_slice(&(r.ordinal as u32).to_le_bytes());
        h[4..12].copy_from_slice(&(r.bytes as u64).to_le_bytes());
        let n = name.len().min(51);
        h[12..12 + n].copy_from_slice(&name.as_bytes()[..n]);
        Ok(h)
    }

    fn open_ipc(&self, h: &[u8; 64]) -> Result<DevPtr> {
        let ordinal = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as i32;
        let bytes = u64::from_le_bytes(h[4..12].try_into().unwrap_or_default()) as usize;
        let end = h[12..].iter().position(|&b| b == 0).map_or(64, |i| 12 + i);
        let name = std::str::from_utf8(&h[12..end])
            .map_err(|_| Error::invalid_argument("malformed simulator IPC handle"))?;
        // The name comes from a peer: only a region `alloc` names is mapped, not any shared
        // memory object this process may open.
        if !is_region_name(name) {
            return Err(Error::invalid_argument(format!(
                "simulator IPC handle names {name:?}, not a simulated device allocation"
            )));
        }
        let (p, size) = map_shm(name, bytes, false)?
            .ok_or_else(|| Error::internal("shm_open without O_CREAT reported a taken name"))?;
        // The size comes from a peer: the region must really hold it, or accesses past the
        // mapping would fault.
        if bytes > size {
            // SAFETY: unmaps exactly the mapping made above, which nothing else knows of yet.
            unsafe { libc::munmap(p as *mut libc::c_void, size) };
            return Err(Error::invalid_argument(format!(
                "simulator IPC handle of {name} claims {bytes} bytes, but the region holds {size}"
            )));
        }
        lock(regions()).insert(
            p,
            Region {
                bytes,
                id: REGION_IDS.fetch_add(1, Ordering::Relaxed),
                ordinal,
                name: None,
                vmm_fd: None,
                parked: false,
            },
        );
        Ok(p)
    }

    fn close_ipc(&self, p: DevPtr) -> Result<()> {
        self.unmap(p)
    }

    /// Memory as the driver's virtual memory API gives it (`ncclMemAlloc`): rounded up to
    /// [`SIM_VMM_GRANULARITY`], and shareable only through its descriptor (a memfd, kept with
    /// the region), like `cuMemCreate` with a POSIX descriptor handle: `ipc_handle` refuses it
    /// as `cuIpcGetMemHandle` does. (address, size).
    fn alloc_vmm(&self, bytes: usize, _multicast: bool) -> Result<(DevPtr, usize)> {
        use std::os::fd::AsRawFd;
        let size = bytes.max(1).div_ceil(SIM_VMM_GRANULARITY) * SIM_VMM_GRANULARITY;
        let fd = vmm_memfd(size)?;
        // SAFETY: a live descriptor of `size` bytes.
        let p = unsafe { map_fd(fd.as_raw_fd(), size)? };
        lock(regions()).insert(
            p,
            Region {
                bytes: size,
                id: REGION_IDS.fetch_add(1, Ordering::Relaxed),
                ordinal: self.ordinal,
                name: None,
                vmm_fd: Some(fd),
                parked: false,
            },
        );
        Ok((p, size))
    }

    /// The VMM allocation holding `p` ([`Device::alloc_vmm`]): its base, size and a new
    /// descriptor of its memory, as the driver backend exports one (no allocation handle to
    /// retain here: 0). None for any other memory (as `cuMemRetainAllocationHandle` refuses
    /// it).
    fn vmm_export(&self, p: DevPtr) -> Result<Option<(DevPtr, usize, std::os::fd::OwnedFd, u64)>> {
        let regions = lock(regions());
        let Some((&base, r)) = regions.range(..=p).next_back() else {
            return Ok(None);
        };
        let Some(fd) = r.vmm_fd.as_ref().filter(|_| p < base + r.bytes as u64) else {
            return Ok(None);
        };
        let dup = fd.try_clone().map_err(|e| {
            Error::quiet(
                crate::error::NcclResult::SystemError,
                format!("dup of a VMM descriptor: {e}"),
            )
        })?;
        Ok(Some((base, r.bytes, dup, 0)))
    }

    fn vmm_export_release(&self, _handle: u64) -> Result<()> {
        Ok(())
    }

    /// Maps `bytes` of a peer's VMM allocation from its descriptor (which must hold them).
    fn vmm_import(&self, fd: std::os::fd::BorrowedFd<'_>, bytes: usize) -> Result<(DevPtr, u64)> {
        use std::os::fd::AsRawFd;
        let size = crate::cuda::fdpass::file_size(fd)? as usize;
        if bytes == 0 || bytes > size {
            return Err(Error::quiet(
                crate::error::NcclResult::InvalidArgument,
                format!("a peer's VMM descriptor holds {size} bytes, its record claims {bytes}"),
            ));
        }
        // SAFETY: a live descriptor of at least `bytes` (checked above).
        let p = unsafe { map_fd(fd.as_raw_fd(), bytes)? };
        lock(regions()).insert(
            p,
            Region {
                bytes,
                id: REGION_IDS.fetch_add(1, Ordering::Relaxed),
                ordinal: self.ordinal,
                name: None,
                vmm_fd: None,
                parked: false,
            },
        );
        VMM_IMPORTS.fetch_add(1, Ordering::Relaxed);
        Ok((p, 0))
    }

    fn vmm_unmap(&self, p: DevPtr, _bytes: usize, _handle: u64) -> Result<()> {
        self.unmap(p)
    }
}

impl Device {
    /// VMM allocations side by side in one address range, as `cuMemAddressReserve` and one
    /// `cuMemCreate` + `cuMemMap` per piece make them (PyTorch's expandable segments): each
    /// piece of `sizes` (rounded up to [`SIM_VMM_GRANULARITY`]) its own memfd and region, the
    /// next starting where the previous ends. (address, size) of each; each is freed alone.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn alloc_vmm_adjacent(&self, sizes: &[usize]) -> Result<Vec<(DevPtr, usize)>> {
        use std::os::fd::AsRawFd;
        let rounded: Vec<usize> = sizes
            .iter()
            .map(|b| b.max(&1).div_ceil(SIM_VMM_GRANULARITY) * SIM_VMM_GRANULARITY)
            .collect();
        let total: usize = rounded.iter().sum();
        if total == 0 {
            return Ok(Vec::new());
        }
        let mut fds = Vec::new();
        for &size in &rounded {
            let fd = vmm_memfd(size)?;
            fds.push(fd);
        }
        // SAFETY: reserves address space only (no access, no memory); checked.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if at == libc::MAP_FAILED {
            return Err(Error::system(format!(
                "reserving {total} bytes: {}",
                std::io::Error::last_os_error()
            )));
        }
        let mut out = Vec::new();
        let mut p = at as u64;
        for (fd, &size) in fds.into_iter().zip(&rounded) {
            // SAFETY: replaces `size` bytes of the reservation made above (inside it: the
            // sizes add up to its length) with the memfd's pages.
            let q = unsafe {
                libc::mmap(
                    p as *mut libc::c_void,
                    size,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    fd.as_raw_fd(),
                    0,
                )
            };
            if q == libc::MAP_FAILED {
                let e = std::io::Error::last_os_error();
                // SAFETY: what is left of our reservation (the pieces mapped so far are
                // regions, freed by their owners; the rest goes here).
                unsafe { libc::munmap(p as *mut libc::c_void, total - (p - at as u64) as usize) };
                for (r, _) in out {
                    let _ = self.unmap(r);
                }
                return Err(Error::system(format!("mapping a VMM piece: {e}")));
            }
            lock(regions()).insert(
                p,
                Region {
                    bytes: size,
                    id: REGION_IDS.fetch_add(1, Ordering::Relaxed),
                    ordinal: self.ordinal,
                    name: None,
                    vmm_fd: Some(fd),
                    parked: false,
                },
            );
            out.push((p, size));
            p += size as u64;
        }
        Ok(out)
    }
}

/// A new memfd of `size` bytes: the memory of a simulated VMM allocation (its shareable
/// descriptor).
pub(super) fn vmm_memfd(size: usize) -> Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: plain system calls; the descriptor is owned at once, results checked.
    let fd = unsafe {
        let raw = libc::memfd_create(c"ncclrs-vmm".as_ptr(), libc::MFD_CLOEXEC);
        if raw < 0 {
            return Err(Error::system(format!(
                "memfd_create: {}",
                std::io::Error::last_os_error()
            )));
        }
        OwnedFd::from_raw_fd(raw)
    };
    // SAFETY: a live descriptor of ours.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } != 0 {
        return Err(Error::system(format!(
            "ftruncate(memfd, {size}): {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(fd)
}
