//! Simulated device memory (shared-memory regions every process of the machine can map), pinned
//! host memory, copies, and what a pointer is.

use super::*;

impl Memory for Device {
    fn alloc(&self, bytes: usize) -> Result<DevPtr> {
        // A name left behind by a killed process that had our pid must not fail the
        // allocation: take the next number instead (O_EXCL never reuses a live region).
        let mut tries = 0;
        let (name, p) = loop {
            let name = format!(
                "/ncclrs-{}@{}-{:x}-{}",
                std::process::id(),
                pid_namespace(),
                process_nonce(),
                NEXT_ID.fetch_add(1, Ordering::Relaxed)
            );
            match map_shm(&name, bytes, true)? {
                Some((p, _)) => break (name, p),
                None if tries < 64 => tries += 1,
                None => return Err(Error::system(format!("shm_open({name}): name taken"))),
            }
        };
        lock(regions()).insert(
            p,
            Region {
                bytes,
                id: REGION_IDS.fetch_add(1, Ordering::Relaxed),
                ordinal: self.ordinal,
                name: Some(name),
                vmm_fd: None,
                parked: false,
            },
        );
        Ok(p)
    }

    fn free(&self, p: DevPtr) -> Result<()> {
        self.unmap(p)
    }

    /// Simulated device memory is host memory: the same address serves both sides.
    fn alloc_host_mapped(&self, bytes: usize) -> Result<(*mut u8, DevPtr)> {
        let p = self.alloc(bytes)?;
        Ok((p as *mut u8, p))
    }

    fn free_host_mapped(&self, host: *mut u8) -> Result<()> {
        self.unmap(host as DevPtr)
    }

    /// Host memory is what simulated kernels address: the same address serves both sides.
    fn host_register(&self, host: *mut u8, _bytes: usize) -> Result<DevPtr> {
        Ok(host as DevPtr)
    }

    fn host_unregister(&self, _host: *mut u8) -> Result<()> {
        Ok(())
    }

    fn copy_htod(&self, dst: DevPtr, src: &[u8]) -> Result<()> {
        self.check_range(dst, src.len())?;
        // SAFETY: the range lies inside a live mapping (checked above).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    fn copy_dtoh(&self, dst: &mut [u8], src: DevPtr) -> Result<()> {
        self.check_range(src, dst.len())?;
        // SAFETY: the range lies inside a live mapping (checked above).
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Copies `bytes` from `src` to `dst` in stream order (the copy engine's job on a GPU).
    fn copy_dtod_async(
        &self,
        dst: DevPtr,
        src: DevPtr,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        self.check_range(dst, bytes)?;
        self.check_range(src, bytes)?;
        let s = self.stream(stream)?;
        s.push_replayable(Arc::new(move || {
            Box::new(move || {
                // SAFETY: both ranges lay inside live mappings when the copy was queued, and
                // (as on a GPU) the caller keeps them until the stream passed the copy.
                unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
                Ok(())
            })
        }));
        Ok(())
    }

    /// The device of the region holding `p` and the bytes from `p` to the region's end, or
    /// None when `p` is in no region. As the driver backend: a VMM allocation followed by VMM
    /// allocations that start where it ends (of the same device) counts as far as `need`
    /// bytes require.
    fn pointer_extent(&self, p: DevPtr, need: usize) -> Result<Option<(i32, usize)>> {
        let regions = lock(regions());
        let Some((&base, r)) = regions.range(..=p).next_back() else {
            return Ok(None);
        };
        // A parked range (`suspend.rs`) is mapped to nothing now.
        if p >= base + r.bytes.max(1) as u64 || r.parked {
            return Ok(None);
        }
        let mut end = base + r.bytes as u64;
        let want = p.saturating_add(need as u64);
        if r.vmm_fd.is_some() {
            while end < want {
                match regions.get(&end) {
                    Some(n) if n.vmm_fd.is_some() && n.ordinal == r.ordinal && n.bytes > 0 => {
                        end += n.bytes as u64
                    }
                    _ => break,
                }
            }
        }
        Ok(Some((r.ordinal, (end - p) as usize)))
    }

    /// The base of the region holding `p`, None if `p` is not simulated device memory.
    fn allocation_base(&self, p: DevPtr) -> Result<Option<DevPtr>> {
        let regions = lock(regions());
        Ok(match regions.range(..=p).next_back() {
            Some((&base, r)) if p < base + r.bytes.max(1) as u64 => Some(base),
            _ => None,
        })
    }

    /// The id of the region holding `p` (unique among the process's regions, never reused).
    fn allocation_id(&self, p: DevPtr) -> Result<Option<u64>> {
        let regions = lock(regions());
        Ok(match regions.range(..=p).next_back() {
            Some((&base, r)) if p < base + r.bytes.max(1) as u64 => Some(r.id),
            _ => None,
        })
    }
}
