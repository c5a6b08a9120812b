//! Device memory through the CUDA virtual memory API, as `ncclMemAlloc` hands it out:
//! physical memory created with a POSIX file-descriptor handle (so that another process can
//! map it) and GPU Direct RDMA capable where the device says so, mapped at an address range of
//! its own, with read-write access for this device and every device that can reach it, and
//! zeroed like every allocation of ours.

use super::*;
use crate::cuda::DevPtr;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::ffi::c_void;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// One mapping made by [`Device::alloc_vmm`].
pub(super) struct Mapping {
    pub(super) size: usize,
    /// 0 while evicted (`suspend.rs`): the range is reserved and mapped to nothing.
    pub(super) handle: sys::CUmemGenericAllocationHandle,
    /// The shareable handle type it was created with (a restore creates its memory alike).
    pub(super) handles: sys::CUmemAllocationHandleType,
}

pub(super) fn mappings() -> MutexGuard<'static, HashMap<DevPtr, Mapping>> {
    static M: OnceLock<Mutex<HashMap<DevPtr, Mapping>>> = OnceLock::new();
    M.get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The handle behind each peer allocation [`Device::vmm_import`] mapped, by address: a
/// reattached mapping (`suspend.rs`) holds another handle than the one its owner was given,
/// and a detached one holds none (0).
pub(super) fn imports() -> MutexGuard<'static, HashMap<DevPtr, sys::CUmemGenericAllocationHandle>> {
    static M: OnceLock<Mutex<HashMap<DevPtr, sys::CUmemGenericAllocationHandle>>> = OnceLock::new();
    M.get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

impl Device {
    /// The allocation properties of [`Device::alloc_vmm`] on this device, with `handles`.
    pub(super) fn vmm_prop(
        &self,
        handles: sys::CUmemAllocationHandleType,
    ) -> Result<sys::CUmemAllocationProp> {
        use sys::CUdevice_attribute::*;
        // SAFETY: a plain C structure; zero is the value of every field not set below.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.requestedHandleTypes = handles;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = self.ordinal;
        prop.allocFlags.gpuDirectRDMACapable =
            u8::from(self.attr(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED)? != 0);
        Ok(prop)
    }

    /// The granularity sizes are rounded to: the driver's recommended one, and the multicast
    /// one where NVLS may be used (the user set NCCL_NVLS_ENABLE to 1 and the device supports multicast;
    /// the query creates no multicast object, and is skipped otherwise all the same).
    fn vmm_granularity(&self, prop: &sys::CUmemAllocationProp, multicast: bool) -> Result<usize> {
        use sys::CUdevice_attribute::*;
        let mut gran = 0usize;
        // SAFETY: out-parameter; prop is a valid property structure.
        check(
            unsafe {
                sys::cuMemGetAllocationGranularity(
                    &mut gran,
                    prop,
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
                )
            },
            "cuMemGetAllocationGranularity",
        )?;
        if multicast
            && crate::cuda::multicast::allowed_by_env()
            && self.attr(CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED)? != 0
        {
            // SAFETY: a plain C structure, zero where not set.
            let mut mc: sys::CUmulticastObjectProp = unsafe { std::mem::zeroed() };
            mc.numDevices = super::device_count()? as u32;
            mc.size = gran;
            mc.handleTypes =
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0 as u64;
            let mut mc_gran = 0usize;
            // SAFETY: out-parameter; mc is a valid property structure.
            let r = unsafe {
                sys::cuMulticastGetGranularity(
                    &mut mc_gran,
                    &mc,
                    sys::CUmulticastGranularity_flags::CU_MULTICAST_GRANULARITY_RECOMMENDED,
                )
            };
            if r == sys::CUresult::CUDA_SUCCESS && mc_gran > 0 {
                gran = gran.max(mc_gran);
            }
        }
        Ok(gran.max(1))
    }

    /// Read-write access for this device and every device that can access it.
    pub(super) fn vmm_access(&self) -> Result<Vec<sys::CUmemAccessDesc>> {
        let mut access = vec![access_desc(self.ordinal)];
        for o in 0..super::device_count()? as i32 {
            if o == self.ordinal {
                continue;
            }
            let (mut peer, mut can) = (0, 0);
            // SAFETY: out-parameters; o is a visible ordinal.
            let ok = unsafe {
                sys::cuDeviceGet(&mut peer, o) == sys::CUresult::CUDA_SUCCESS
                    && sys::cuDeviceCanAccessPeer(&mut can, peer, self.dev)
                        == sys::CUresult::CUDA_SUCCESS
            };
            if ok && can != 0 {
                access.push(access_desc(o));
            }
        }
        Ok(access)
    }

    /// Frees `p` if [`Device::alloc_vmm`] made it: whether it did.
    pub(super) fn free_vmm(&self, p: DevPtr) -> Result<bool> {
        let Some(m) = mappings().remove(&p) else {
            return Ok(false);
        };
        self.make_current()?;
        extent_cache::forget(p);
        // SAFETY: p is a range of m.size bytes reserved by alloc_vmm, mapped to m.handle
        // unless evicted (0), and freed once (it was just removed from the table).
        unsafe {
            if m.handle != 0 {
                check(sys::cuMemUnmap(p, m.size), "cuMemUnmap")?;
            }
            check(sys::cuMemAddressFree(p, m.size), "cuMemAddressFree")?;
            if m.handle != 0 {
                check(sys::cuMemRelease(m.handle), "cuMemRelease")?;
            }
        }
        Ok(true)
    }
}

// ---- Registered VMM buffers across processes (`regmap`): the owner exports the allocation
// behind a registered buffer as a POSIX descriptor, a peer process imports it and maps it.

const FD_HANDLE: sys::CUmemAllocationHandleType =
    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

impl Device {}

impl Sharing for Device {
    fn ipc_handle(&self, p: DevPtr) -> Result<[u8; 64]> {
        self.make_current()?;
        let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: p is the base of an allocation of ours.
        check(
            unsafe { sys::cuIpcGetMemHandle(&mut h, p) },
            "cuIpcGetMemHandle",
        )?;
        Ok(h.reserved.map(|c| c as u8))
    }

    fn open_ipc(&self, handle: &[u8; 64]) -> Result<DevPtr> {
        self.make_current()?;
        let h = sys::CUipcMemHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        let mut p = 0;
        // SAFETY: out-parameter; the handle came from a peer's cuIpcGetMemHandle.
        check(
            unsafe {
                sys::cuIpcOpenMemHandle_v2(
                    &mut p,
                    h,
                    sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
                )
            },
            "cuIpcOpenMemHandle",
        )?;
        Ok(p)
    }

    fn close_ipc(&self, p: DevPtr) -> Result<()> {
        self.make_current()?;
        extent_cache::forget(p);
        // SAFETY: p came from open_ipc and is closed once.
        check(
            unsafe { sys::cuIpcCloseMemHandle(p) },
            "cuIpcCloseMemHandle",
        )
    }

    /// `bytes` of device memory (at least 1) through the virtual memory API, rounded up to
    /// the granularity: (address, mapped size). Freed by [`Device::free`].
    fn alloc_vmm(&self, bytes: usize, multicast: bool) -> Result<(DevPtr, usize)> {
        use sys::CUdevice_attribute::*;
        self.make_current()?;
        if self.attr(CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED)? == 0 {
            return Err(Error::invalid_usage(format!(
                "device {} does not support the CUDA virtual memory API (ncclMemAlloc needs it)",
                self.ordinal
            )));
        }
        let fd = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        let mut prop = self.vmm_prop(fd)?;
        let gran = self.vmm_granularity(&prop, multicast)?;
        let size = round_up(bytes.max(1), gran);
        let mut handle = 0;
        // SAFETY: out-parameter; prop is valid; size is a multiple of the granularity.
        let mut r = unsafe { sys::cuMemCreate(&mut handle, size, &prop, 0) };
        if r != sys::CUresult::CUDA_SUCCESS {
            // Some containers refuse shareable handles: memory only this process maps.
            log::info!(
                "ncclMemAlloc: cuMemCreate with a POSIX fd handle failed ({r:?}); retrying without"
            );
            prop = self.vmm_prop(sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE)?;
            // SAFETY: as above.
            r = unsafe { sys::cuMemCreate(&mut handle, size, &prop, 0) };
        }
        check(r, &format!("cuMemCreate of {size} bytes"))?;
        let mapped = self.vmm_access().and_then(|access| {
            let ptr = self.map_handle(handle, size, gran, &access)?;
            // SAFETY: the mapping is fresh, `size` bytes, readable and writable here now.
            match unsafe { self.zero_new(ptr, size) } {
                Ok(()) => Ok(ptr),
                Err(e) => {
                    // SAFETY: the mapping made just above, used by nobody.
                    unsafe {
                        sys::cuMemUnmap(ptr, size);
                        sys::cuMemAddressFree(ptr, size);
                    }
                    Err(e)
                }
            }
        });
        let ptr = match mapped {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: the handle created above, mapped nowhere now.
                unsafe { sys::cuMemRelease(handle) };
                return Err(e);
            }
        };
        let handles = prop.requestedHandleTypes;
        mappings().insert(
            ptr,
            Mapping {
                size,
                handle,
                handles,
            },
        );
        Ok((ptr, size))
    }

    /// The mapping of CUDA's virtual memory API holding `p` (`cuMemGetAddressRange`: its base
    /// and size), its allocation handle retained (`cuMemRetainAllocationHandle`, released by
    /// [`Device::vmm_export_release`]) and exported as a POSIX descriptor. None (quietly) for
    /// other memory, which `cuMemRetainAllocationHandle` refuses; a quiet error for an
    /// allocation created without a descriptor handle (a registration only loses zero-copy).
    fn vmm_export(&self, p: DevPtr) -> Result<Option<(DevPtr, usize, OwnedFd, u64)>> {
        self.make_current()?;
        // cuMemAlloc's memory says so itself: it takes the IPC handle.
        let mut legacy: i32 = 0;
        // SAFETY: out-parameter of the attribute's size (an int).
        let r = unsafe {
            sys::cuPointerGetAttribute(
                &mut legacy as *mut i32 as *mut c_void,
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                p,
            )
        };
        if r == sys::CUresult::CUDA_SUCCESS && legacy != 0 {
            return Ok(None);
        }
        let (mut base, mut size) = (0, 0);
        // SAFETY: out-parameters.
        if unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, p) }
            != sys::CUresult::CUDA_SUCCESS
        {
            return Ok(None);
        }
        let mut handle = 0;
        // SAFETY: out-parameter; `base` is an address the driver just reported mapped.
        if unsafe { sys::cuMemRetainAllocationHandle(&mut handle, base as *mut c_void) }
            != sys::CUresult::CUDA_SUCCESS
        {
            return Ok(None);
        }
        let mut fd: i32 = -1;
        // SAFETY: a POSIX descriptor handle is written as an int.
        let r = unsafe {
            sys::cuMemExportToShareableHandle(
                &mut fd as *mut i32 as *mut c_void,
                handle,
                FD_HANDLE,
                0,
            )
        };
        if let Err(e) = check_quiet(r, "cuMemExportToShareableHandle") {
            // SAFETY: balances the retain above.
            unsafe { sys::cuMemRelease(handle) };
            return Err(e);
        }
        // SAFETY: a fresh descriptor the driver made for us.
        Ok(Some((
            base,
            size,
            unsafe { OwnedFd::from_raw_fd(fd) },
            handle,
        )))
    }

    /// Lets go of an allocation handle [`Device::vmm_export`] retained.
    fn vmm_export_release(&self, handle: u64) -> Result<()> {
        self.make_current()?;
        // SAFETY: a handle retained once by vmm_export and released once (its export's drop).
        check(unsafe { sys::cuMemRelease(handle) }, "cuMemRelease")
    }

    /// Imports a peer's allocation from its descriptor and maps `bytes` of it (from offset
    /// 0) at an address range of our own, readable and writable by this device: (address,
    /// imported handle). Undone by [`Device::vmm_unmap`].
    fn vmm_import(&self, fd: BorrowedFd<'_>, bytes: usize) -> Result<(DevPtr, u64)> {
        self.make_current()?;
        let handle = import_fd(fd)?;
        let mapped = (|| {
            // SAFETY: a plain C structure filled by the driver from a live handle.
            let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
            check_quiet(
                // SAFETY: out-parameter and the handle imported above.
                unsafe { sys::cuMemGetAllocationPropertiesFromHandle(&mut prop, handle) },
                "cuMemGetAllocationPropertiesFromHandle",
            )?;
            let mut gran = 0usize;
            // SAFETY: out-parameter; prop is the allocation's own.
            check_quiet(
                unsafe {
                    sys::cuMemGetAllocationGranularity(
                        &mut gran,
                        &prop,
                        sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
                    )
                },
                "cuMemGetAllocationGranularity",
            )?;
            if gran == 0 || bytes == 0 || !bytes.is_multiple_of(gran) {
                return Err(Error::quiet(
                    crate::error::NcclResult::InvalidArgument,
                    format!("a peer's VMM mapping of {bytes} bytes is no multiple of {gran}"),
                ));
            }
            self.map_handle(handle, bytes, gran, &[access_desc(self.ordinal)])
        })();
        match mapped {
            Ok(ptr) => {
                imports().insert(ptr, handle);
                Ok((ptr, handle))
            }
            Err(e) => {
                // SAFETY: the handle imported above, mapped nowhere.
                unsafe { sys::cuMemRelease(handle) };
                Err(e)
            }
        }
    }

    /// Unmaps and releases what [`Device::vmm_import`] made (its handle now: see [`imports`]).
    fn vmm_unmap(&self, ptr: DevPtr, bytes: usize, handle: u64) -> Result<()> {
        self.make_current()?;
        extent_cache::forget(ptr);
        let handle = imports().remove(&ptr).unwrap_or(handle);
        // SAFETY: a range of `bytes` reserved by vmm_import, mapped to `handle` unless
        // detached (0), and undone once (its drop); the kernels that used it were ordered
        // before (the registration or connection was withdrawn).
        unsafe {
            if handle != 0 {
                check(sys::cuMemUnmap(ptr, bytes), "cuMemUnmap")?;
            }
            check(sys::cuMemAddressFree(ptr, bytes), "cuMemAddressFree")?;
            if handle != 0 {
                check(sys::cuMemRelease(handle), "cuMemRelease")?;
            }
            Ok(())
        }
    }
}

/// The allocation handle behind a peer's POSIX descriptor (`cuMemImportFromShareableHandle`;
/// the descriptor stays the caller's), to be released by the caller.
pub(super) fn import_fd(fd: BorrowedFd<'_>) -> Result<sys::CUmemGenericAllocationHandle> {
    let mut handle = 0;
    // SAFETY: a POSIX descriptor handle is passed as the int's value in the pointer; the
    // driver takes its own reference.
    check_quiet(
        unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut handle,
                fd.as_raw_fd() as isize as *mut c_void,
                FD_HANDLE,
            )
        },
        "cuMemImportFromShareableHandle",
    )?;
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use super::round_up;

    #[test]
    fn sizes_round_up_to_the_granularity() {
        assert_eq!(round_up(1, 2 << 20), 2 << 20);
        assert_eq!(round_up(2 << 20, 2 << 20), 2 << 20);
        assert_eq!(round_up((2 << 20) + 1, 2 << 20), 4 << 20);
    }
}
