//! Multicast objects (NVLS). Reached only through `super::multicast`, which refuses unless the
//! user set NCCL_NVLS_ENABLE to exactly 1 (and the communicator asks only then and where every
//! rank's device reports multicast support): on the shared GPU hosts a multicast object can
//! take the host's GPUs out of service, and those hosts keep the variable at 0.

use super::*;

/// A multicast object as this process holds it, and what it bound and mapped on one device.
pub struct Multicast {
    handle: sys::CUmemGenericAllocationHandle,
    bytes: usize,
    /// The physical memory bound to it on our device, mapped at `uc`.
    mem: Option<sys::CUmemGenericAllocationHandle>,
    uc: sys::CUdeviceptr,
    /// The multicast object mapped at `mc`.
    mc: sys::CUdeviceptr,
    /// The descriptor it was exported as, on offer to the other ranks (the creator only):
    /// withdrawn and closed on drop.
    offer: Option<crate::cuda::fdpass::Offer>,
}

impl Multicast {
    /// The object's size.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Bytes of a multicast handle: the creator's offer ([`crate::cuda::fdpass::Ticket`]), then the
/// object's size; the rest is zero.
const MC_HANDLE_SIZE_AT: usize = crate::cuda::fdpass::TICKET_BYTES;

/// The handle of a multicast object of `bytes` whose descriptor is on offer as `t`.
fn mc_handle(t: &crate::cuda::fdpass::Ticket, bytes: usize) -> [u8; 64] {
    let mut h = [0u8; 64];
    h[..MC_HANDLE_SIZE_AT].copy_from_slice(&t.encode());
    h[MC_HANDLE_SIZE_AT..MC_HANDLE_SIZE_AT + 8].copy_from_slice(&(bytes as u64).to_le_bytes());
    h
}

/// The size a multicast handle claims.
fn mc_handle_size(h: &[u8; 64]) -> usize {
    let mut b = [0u8; 8];
    b.copy_from_slice(&h[MC_HANDLE_SIZE_AT..MC_HANDLE_SIZE_AT + 8]);
    usize::try_from(u64::from_le_bytes(b)).unwrap_or(usize::MAX)
}

/// The descriptor of the multicast object a peer's handle names, and the size the handle
/// claims. Taken from the creator's offer only ([`crate::cuda::fdpass::take_offered`]: its own table,
/// or its descriptor socket, which answers processes of its user for keys it offers): the
/// handle's pid and descriptor number are never used with `pidfd_getfd`, so a member cannot
/// make a peer take a descriptor of another process.
fn mc_descriptor(h: &[u8; 64]) -> Result<(std::os::fd::OwnedFd, usize)> {
    let mut t = [0u8; crate::cuda::fdpass::TICKET_BYTES];
    t.copy_from_slice(&h[..MC_HANDLE_SIZE_AT]);
    let t = crate::cuda::fdpass::Ticket::decode(&t);
    let bytes = mc_handle_size(h);
    let fd = crate::cuda::fdpass::take_offered(&t).map_err(|e| {
        Error::system(format!(
            "NVLS: taking rank 0's multicast object (process {}): {}",
            t.pid, e.message
        ))
    })?;
    Ok((fd, bytes))
}

impl Device {
    pub(super) fn mc_prop(ndev: usize, bytes: usize) -> sys::CUmulticastObjectProp {
        // SAFETY: a plain C struct for which all zeroes is valid.
        let mut p: sys::CUmulticastObjectProp = unsafe { std::mem::zeroed() };
        p.numDevices = ndev as u32;
        p.size = bytes;
        p.handleTypes =
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0 as u64;
        p
    }

    /// Device memory for a multicast binding (pinned, on this device).
    pub(super) fn mc_mem_prop(&self) -> sys::CUmemAllocationProp {
        // SAFETY: a plain C struct for which all zeroes is valid.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = self.ordinal;
        prop
    }

    /// cuMulticastCreate for `ndev` devices, exported as a file descriptor and put on offer
    /// ([`crate::cuda::fdpass::offer`]); the handle other ranks import is that offer's ticket and
    /// the size.
    pub fn multicast_create(&self, ndev: usize, bytes: usize) -> Result<(Multicast, [u8; 64])> {
        self.make_current()?;
        let prop = Self::mc_prop(ndev, bytes);
        let mut handle = 0;
        // SAFETY: out-parameter and a filled property struct.
        check(
            unsafe { sys::cuMulticastCreate(&mut handle, &prop) },
            "cuMulticastCreate",
        )?;
        let mut mc = Multicast {
            handle,
            bytes,
            mem: None,
            uc: 0,
            mc: 0,
            offer: None,
        };
        let mut fd: i32 = -1;
        // SAFETY: a POSIX file descriptor handle is written as an int.
        check(
            unsafe {
                sys::cuMemExportToShareableHandle(
                    &mut fd as *mut i32 as *mut c_void,
                    handle,
                    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                    0,
                )
            },
            "cuMemExportToShareableHandle(multicast)",
        )?;
        if fd < 0 {
            return Err(Error::cuda(format!(
                "cuMemExportToShareableHandle(multicast) gave descriptor {fd}"
            )));
        }
        // SAFETY: the driver just gave us this descriptor; it is ours to own and close.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let offer = crate::cuda::fdpass::offer(fd);
        let h = mc_handle(&offer.ticket(), bytes);
        mc.offer = Some(offer);
        Ok((mc, h))
    }

    /// Imports the multicast object another rank created ([`Device::multicast_create`]'s
    /// handle), of `bytes` (what this rank's layout says; the handle must say the same): its
    /// descriptor taken from that rank's offer ([`mc_descriptor`]).
    pub fn multicast_import(&self, h: &[u8; 64], bytes: usize) -> Result<Multicast> {
        let claimed = mc_handle_size(h);
        if claimed != bytes {
            return Err(Error::remote(format!(
                "NVLS: rank 0's multicast handle says {claimed} bytes, its layout {bytes}"
            )));
        }
        self.make_current()?;
        let (fd, bytes) = mc_descriptor(h)?;
        let mut handle = 0;
        // SAFETY: a POSIX descriptor handle is passed as the int's value in the pointer.
        let r = unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut handle,
                std::os::fd::AsRawFd::as_raw_fd(&fd) as isize as *mut c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        };
        // The driver holds its own reference after the import.
        drop(fd);
        check(r, "cuMemImportFromShareableHandle(multicast)")?;
        Ok(Multicast {
            handle,
            bytes,
            mem: None,
            uc: 0,
            mc: 0,
            offer: None,
        })
    }

    /// cuMulticastAddDevice for this device.
    pub fn multicast_add_device(&self, mc: &Multicast) -> Result<()> {
        self.make_current()?;
        // SAFETY: a live multicast handle and our device.
        check(
            unsafe { sys::cuMulticastAddDevice(mc.handle, self.dev) },
            "cuMulticastAddDevice",
        )
    }

    /// Reserves `bytes` of address space aligned to `align`, maps `handle` there and grants
    /// the `access` given (see [`access_desc`]); on failure nothing stays reserved or mapped.
    pub(super) fn map_handle(
        &self,
        handle: sys::CUmemGenericAllocationHandle,
        bytes: usize,
        align: usize,
        access: &[sys::CUmemAccessDesc],
    ) -> Result<sys::CUdeviceptr> {
        let mut va = 0;
        // SAFETY: out-parameter; the range is freed on any later failure.
        check(
            unsafe { sys::cuMemAddressReserve(&mut va, bytes, align, 0, 0) },
            "cuMemAddressReserve",
        )?;
        // SAFETY: a fresh reservation of `bytes` and a live handle of at least that size;
        // `access` holds access.len() descriptors.
        let r = unsafe {
            check(sys::cuMemMap(va, bytes, 0, handle, 0), "cuMemMap").and_then(|_| {
                check(
                    sys::cuMemSetAccess(va, bytes, access.as_ptr(), access.len()),
                    "cuMemSetAccess",
                )
            })
        };
        if let Err(e) = r {
            // SAFETY: undoing what succeeded above (an unmapped range unmaps as an error we
            // ignore).
            unsafe {
                sys::cuMemUnmap(va, bytes);
                sys::cuMemAddressFree(va, bytes);
            }
            return Err(e);
        }
        Ok(va)
    }

    /// Allocates the object's size of physical memory on this device, binds it to the
    /// multicast object at offset 0, and maps both: (unicast, multicast) addresses. Every
    /// member device must have been added first.
    pub fn multicast_bind_map(&self, mc: &mut Multicast, align: usize) -> Result<(u64, u64)> {
        self.make_current()?;
        let prop = self.mc_mem_prop();
        let mut mem = 0;
        // SAFETY: out-parameter and a filled property struct; `bytes` is a multiple of the
        // multicast granularity, which is a multiple of the allocation granularity.
        check(
            unsafe { sys::cuMemCreate(&mut mem, mc.bytes, &prop, 0) },
            "cuMemCreate(NVLS)",
        )?;
        mc.mem = Some(mem);
        // SAFETY: live handles, offsets 0, the object's whole size.
        check(
            unsafe { sys::cuMulticastBindMem(mc.handle, 0, mem, 0, mc.bytes, 0) },
            "cuMulticastBindMem",
        )?;
        let access = [access_desc(self.ordinal)];
        mc.uc = self.map_handle(mem, mc.bytes, align, &access)?;
        mc.mc = self.map_handle(mc.handle, mc.bytes, align, &access)?;
        Ok((mc.uc, mc.mc))
    }

    /// Binds the object's size of this device's memory at `ptr` (memory of CUDA's virtual
    /// memory API: `ncclMemAlloc`, `cuMemCreate`; `ptr` and the size aligned to the multicast
    /// granularity) to the object at offset 0, and maps the object: its multicast address.
    /// The memory stays the caller's; the binding holds a retained handle of it until released.
    pub fn multicast_bind_mem(&self, mc: &mut Multicast, ptr: u64, align: usize) -> Result<u64> {
        self.make_current()?;
        let Some((_, base, end)) = query_extent(ptr) else {
            return Err(Error::invalid_argument(format!(
                "multicast binding: {ptr:#x} is not device memory"
            )));
        };
        if end < ptr + mc.bytes as u64 {
            return Err(Error::invalid_argument(format!(
                "multicast binding: {} bytes at {ptr:#x} run past its allocation",
                mc.bytes
            )));
        }
        let mut mem = 0;
        // SAFETY: out-parameter; refused (an error) for memory not of the virtual memory API.
        check(
            unsafe { sys::cuMemRetainAllocationHandle(&mut mem, ptr as *mut c_void) },
            "cuMemRetainAllocationHandle (multicast binding of memory not from ncclMemAlloc?)",
        )?;
        mc.mem = Some(mem);
        // SAFETY: live handles; the offset and size lie inside the allocation (checked above)
        // and are aligned to the granularity (the caller's check).
        check(
            unsafe {
                sys::cuMulticastBindMem(mc.handle, 0, mem, (ptr - base) as usize, mc.bytes, 0)
            },
            "cuMulticastBindMem",
        )?;
        let access = [access_desc(self.ordinal)];
        mc.mc = self.map_handle(mc.handle, mc.bytes, align, &access)?;
        Ok(mc.mc)
    }

    /// Unmaps, unbinds and releases what `mc` holds on this device.
    pub fn multicast_release(&self, mc: &mut Multicast) {
        let _ = self.make_current();
        // SAFETY: each handle and mapping is released once, in reverse order of creation;
        // errors at teardown are not actionable.
        unsafe {
            for va in [std::mem::take(&mut mc.mc), std::mem::take(&mut mc.uc)] {
                if va != 0 {
                    sys::cuMemUnmap(va, mc.bytes);
                    sys::cuMemAddressFree(va, mc.bytes);
                }
            }
            if let Some(mem) = mc.mem.take() {
                sys::cuMulticastUnbind(mc.handle, self.dev, 0, mc.bytes);
                sys::cuMemRelease(mem);
            }
            if mc.handle != 0 {
                sys::cuMemRelease(mc.handle);
                mc.handle = 0;
            }
        }
        // Withdrawn from offer, and closed.
        mc.offer = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};

    fn memfd(bytes: usize) -> OwnedFd {
        // SAFETY: a fresh descriptor, owned at once; the file is written through it.
        let fd = unsafe { OwnedFd::from_raw_fd(libc::memfd_create(c"mc-test".as_ptr(), 0)) };
        let mut f = std::fs::File::from(fd);
        f.write_all(&vec![1u8; bytes]).unwrap();
        f.into()
    }

    /// The multicast handle carries the creator's offer and the size; a peer takes the
    /// descriptor from the offer only. A handle naming another process's descriptor by pid
    /// and number (what the handle held before, for `pidfd_getfd`) gives nothing, and a
    /// withdrawn offer gives nothing. No CUDA is called.
    #[test]
    fn a_multicast_handle_is_taken_from_its_offer_only() {
        let _one = crate::cuda::fdpass::one_offering_test_at_a_time();
        let o = crate::cuda::fdpass::offer(memfd(4096));
        let h = mc_handle(&o.ticket(), 4096);
        assert_eq!(mc_handle_size(&h), 4096);
        let (fd, bytes) = mc_descriptor(&h).expect("our own offer");
        assert_eq!(bytes, 4096);
        assert_eq!(crate::cuda::fdpass::file_size(fd.as_fd()).unwrap(), 4096);
        // The old layout: (pid, descriptor number, size), here our parent's standard input.
        // SAFETY: getppid cannot fail.
        let parent = unsafe { libc::getppid() } as u32;
        let mut old = [0u8; 64];
        old[..4].copy_from_slice(&parent.to_le_bytes());
        old[8..16].copy_from_slice(&4096u64.to_le_bytes());
        let e = mc_descriptor(&old).expect_err("no pidfd_getfd on a peer's pid");
        assert!(e.message.contains("NVLS"), "{e}");
        let forged = crate::cuda::fdpass::Ticket {
            pid: parent,
            fd: 0,
            ..o.ticket()
        };
        assert!(mc_descriptor(&mc_handle(&forged, 4096)).is_err());
        drop(o);
        assert!(mc_descriptor(&h).is_err(), "withdrawn");
    }
}
