//! Device and pinned host memory, copies, and what a pointer is.

use super::*;

impl Memory for Device {
    fn alloc(&self, bytes: usize) -> Result<DevPtr> {
        self.make_current()?;
        let _relaxed = RelaxedCapture::enter();
        let mut p = 0;
        // SAFETY: out-parameter; our context is current.
        check(
            unsafe { sys::cuMemAlloc_v2(&mut p, bytes.max(1)) },
            &format!("cuMemAlloc of {bytes} bytes"),
        )?;
        // SAFETY: p is a fresh allocation of at least `bytes` bytes.
        if let Err(e) = unsafe { self.zero_new(p, bytes) } {
            // SAFETY: p came from cuMemAlloc just above and is not used.
            unsafe { sys::cuMemFree_v2(p) };
            return Err(e);
        }
        Ok(p)
    }

    fn free(&self, p: DevPtr) -> Result<()> {
        if self.free_vmm(p)? {
            return Ok(());
        }
        self.make_current()?;
        extent_cache::forget(p);
        // SAFETY: p came from alloc on this device and is freed once (the owner's Drop).
        check(unsafe { sys::cuMemFree_v2(p) }, "cuMemFree")
    }

    /// Zeroed pinned host memory the device can address: (host pointer, device address).
    fn alloc_host_mapped(&self, bytes: usize) -> Result<(*mut u8, DevPtr)> {
        // CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP.
        const FLAGS: u32 = 0x01 | 0x02;
        self.make_current()?;
        let mut host: *mut c_void = std::ptr::null_mut();
        // SAFETY: out-parameter; our context is current.
        check(
            unsafe { sys::cuMemHostAlloc(&mut host, bytes.max(1), FLAGS) },
            &format!("cuMemHostAlloc of {bytes} bytes"),
        )?;
        // SAFETY: host is a fresh allocation of at least `bytes` bytes.
        unsafe { std::ptr::write_bytes(host as *mut u8, 0, bytes) };
        let mut dev = 0;
        // SAFETY: host is mapped (DEVICEMAP); out-parameter.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0) };
        if let Err(e) = check(r, "cuMemHostGetDevicePointer") {
            // SAFETY: host came from cuMemHostAlloc just above.
            unsafe { sys::cuMemFreeHost(host) };
            return Err(e);
        }
        Ok((host as *mut u8, dev))
    }

    fn free_host_mapped(&self, host: *mut u8) -> Result<()> {
        self.make_current()?;
        let mut dev = 0;
        // SAFETY: host came from alloc_host_mapped and is still allocated; out-parameter.
        if unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host as *mut c_void, 0) }
            == sys::CUresult::CUDA_SUCCESS
        {
            extent_cache::forget(dev);
        }
        // SAFETY: host came from alloc_host_mapped and is freed once (the owner's Drop).
        check(
            unsafe { sys::cuMemFreeHost(host as *mut c_void) },
            "cuMemFreeHost",
        )
    }

    /// Pins `bytes` of host memory at `host` (a mapping of ours, e.g. a shared memory segment)
    /// and maps it into the device: (device address). PORTABLE, so every context may use it.
    fn host_register(&self, host: *mut u8, bytes: usize) -> Result<DevPtr> {
        // CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP.
        const FLAGS: u32 = 0x01 | 0x02;
        self.make_current()?;
        // SAFETY: the caller passes a live mapping of `bytes` bytes that outlives the
        // registration (host_unregister runs before it is unmapped).
        check(
            unsafe { sys::cuMemHostRegister_v2(host as *mut c_void, bytes, FLAGS) },
            &format!("cuMemHostRegister of {bytes} bytes"),
        )?;
        let mut dev = 0;
        // SAFETY: host is registered with DEVICEMAP just above; out-parameter.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host as *mut c_void, 0) };
        if let Err(e) = check(r, "cuMemHostGetDevicePointer") {
            // SAFETY: host was registered just above.
            unsafe { sys::cuMemHostUnregister(host as *mut c_void) };
            return Err(e);
        }
        Ok(dev)
    }

    /// Undoes [`Device::host_register`].
    fn host_unregister(&self, host: *mut u8) -> Result<()> {
        self.make_current()?;
        // SAFETY: host was registered by host_register and is unregistered once (the owner's
        // Drop), while still mapped.
        check(
            unsafe { sys::cuMemHostUnregister(host as *mut c_void) },
            "cuMemHostUnregister",
        )
    }

    fn copy_htod(&self, dst: DevPtr, src: &[u8]) -> Result<()> {
        self.make_current()?;
        let _relaxed = RelaxedCapture::enter();
        let s = self.copy_stream()?;
        // SAFETY: the caller passes a device range of src.len() bytes; src outlives the copy
        // (waited for below).
        check(
            unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr() as *const c_void, src.len(), s) },
            "cuMemcpyHtoD",
        )?;
        // From pageable memory the copy may return before the DMA lands; kernels on other
        // streams would not wait for it. Copies are synchronous in this API: finish it here.
        stream_wait(s)
    }

    fn copy_dtoh(&self, dst: &mut [u8], src: DevPtr) -> Result<()> {
        self.make_current()?;
        let _relaxed = RelaxedCapture::enter();
        let s = self.copy_stream()?;
        // SAFETY: the caller passes a device range of dst.len() bytes; dst outlives the copy
        // (waited for below).
        check(
            unsafe {
                sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr() as *mut c_void, src, dst.len(), s)
            },
            "cuMemcpyDtoH",
        )?;
        stream_wait(s)
    }

    /// Copies `bytes` from `src` to `dst` (device memory) on `stream`, by the copy engine; a
    /// capture records it as a memcpy node.
    fn copy_dtod_async(
        &self,
        dst: DevPtr,
        src: DevPtr,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        self.make_current()?;
        // SAFETY: the caller checked both ranges against their allocations; the stream orders
        // the copy with the work around it, as a kernel's accesses would be.
        check(
            unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream.0 as sys::CUstream) },
            "cuMemcpyDtoDAsync",
        )
    }

    /// The device owning `p` and the bytes from `p` to the end of its allocation (see
    /// [`extent_cache`]): a cache hit costs a lock and a map lookup; a miss asks the driver
    /// (`cuMemGetAddressRange`), so memory allocated outside this library works too.
    fn pointer_extent(&self, p: DevPtr, need: usize) -> Result<Option<(i32, usize)>> {
        let want = p.saturating_add(need as u64);
        if let Some((ordinal, end)) = extent_cache::lookup(p) {
            // Only a hit that suffices is trusted: anything short is asked again, so that a
            // stale entry never refuses a good buffer.
            if ordinal == self.ordinal && end >= want {
                return Ok(Some((ordinal, (end - p) as usize)));
            }
        }
        self.make_current()?;
        let Some((ordinal, base, mut end)) = query_extent(p) else {
            return Ok(None);
        };
        if end < want && walks_mappings(p) {
            // An allocation of the virtual memory API (PyTorch's expandable segments) is
            // several mappings side by side, and the driver reports one mapping's range:
            // follow adjacent mappings of the same device until the buffer is covered.
            for _ in 0..MAX_MAPPINGS_WALKED {
                match query_extent(end) {
                    Some((o, b, e)) if o == ordinal && b == end && walks_mappings(end) => end = e,
                    _ => break,
                }
                if end >= want {
                    break;
                }
            }
        }
        if end != DevPtr::MAX {
            extent_cache::insert(base, end, ordinal);
        }
        Ok(Some((ordinal, end.saturating_sub(p) as usize)))
    }

    /// The base of the allocation (or mapping) holding `p`, None if `p` is not device memory.
    fn allocation_base(&self, p: DevPtr) -> Result<Option<DevPtr>> {
        self.make_current()?;
        Ok(query_extent(p).map(|(_, base, _)| base))
    }

    /// The driver's id of the allocation holding `p` (CU_POINTER_ATTRIBUTE_BUFFER_ID: unique
    /// for the process's lifetime), None if `p` is no memory the driver knows.
    fn allocation_id(&self, p: DevPtr) -> Result<Option<u64>> {
        self.make_current()?;
        let mut id: u64 = 0;
        // SAFETY: out-parameter of the size the attribute defines (an unsigned long long).
        let r = unsafe {
            sys::cuPointerGetAttribute(
                &mut id as *mut u64 as *mut c_void,
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID,
                p,
            )
        };
        Ok((r == sys::CUresult::CUDA_SUCCESS).then_some(id))
    }
}
