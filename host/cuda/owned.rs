//! What the runtime holds on a device and releases when dropped: device memory, host memory
//! mapped for the device, registrations of host memory, mappings of peers' memory, the
//! exports that let peers map ours, and fences (events behind a communicator's launches).

use super::*;

/// What makes the held things: each keeps the device it came from, to release itself there.
impl Device {
    crate::internal! {
        /// Zeroed device memory, freed when the buffer drops.
        /// A cleared [`HostFlag`].
        fn alloc_host_flag(&self) -> Result<HostFlag> {
            let (host, ptr) = dispatch!(self.alloc_host_mapped(8))?;
            Ok(HostFlag {
                dev: self.clone(),
                host: host as *mut u64,
                ptr,
            })
        }
    }

    /// `bytes` of device memory (at least 1), freed when the buffer drops.
    pub fn alloc(&self, bytes: usize) -> Result<DevBuffer> {
        let ptr = dispatch!(self.alloc(bytes))?;
        self.book(bytes, true);
        Ok(DevBuffer {
            dev: self.clone(),
            ptr,
            bytes,
        })
    }

    /// `bytes` of device memory (at least 1) as `ncclMemAlloc` gives it: through the CUDA
    /// virtual memory API, shareable with other processes by a POSIX file descriptor, its
    /// extent rounded up to the allocation granularity (the multicast one too where NVLS may
    /// be used); freed when the buffer drops. On the simulator, rounded the same way.
    pub fn alloc_vmm(&self, bytes: usize) -> Result<DevBuffer> {
        self.vmm_buffer(bytes, true)
    }

    fn vmm_buffer(&self, bytes: usize, multicast: bool) -> Result<DevBuffer> {
        let (ptr, _mapped) = dispatch!(self.alloc_vmm(bytes, multicast))?;
        self.book(bytes, true);
        Ok(DevBuffer {
            dev: self.clone(),
            ptr,
            bytes,
        })
    }

    crate::internal! {
        #[cfg_attr(not(feature = "internals"), allow(dead_code))]
        /// Simulator only: VMM allocations side by side, each piece of `sizes` its own
        /// allocation (and descriptor) and the next starting where it ends, as
        /// `cuMemAddressReserve` with one `cuMemCreate` + `cuMemMap` per piece makes them; each
        /// buffer frees its piece. A buffer may be registered across them.
        fn alloc_vmm_adjacent(&self, sizes: &[usize]) -> Result<Vec<DevBuffer>> {
            let Imp::Sim(d) = &*self.imp else {
                return Err(Error::invalid_usage(
                    "adjacent VMM allocations are made on the simulator only",
                ));
            };
            Ok(d.alloc_vmm_adjacent(sizes)?
                .into_iter()
                .map(|(ptr, bytes)| {
                    self.book(bytes, true);
                    DevBuffer {
                        dev: self.clone(),
                        ptr,
                        bytes,
                    }
                })
                .collect())
        }
    }

    crate::internal! {
        /// How another process can map the allocation holding `p`: a legacy allocation
        /// (`cuMemAlloc`) by its IPC handle; one of CUDA's virtual memory API (`ncclMemAlloc`,
        /// `cuMemCreate` with a POSIX descriptor handle), which has no IPC handle, by its
        /// exported descriptor, put on offer to peer processes ([`fdpass`]) until the export
        /// drops. `vmm` false: the IPC handle only (none for VMM memory).
        fn reg_export(&self, p: DevPtr, vmm: bool) -> Result<RegExport> {
            // The virtual memory API's first (cuMemRetainAllocationHandle tells its memory
            // from any other, quietly): no failing cuIpcGetMemHandle is logged for it.
            let vmm_err = match dispatch!(self.vmm_export(p)) {
                Ok(Some((base, bytes, fd, handle))) => {
                    let export = VmmExport {
                        dev: self.clone(),
                        base,
                        bytes,
                        handle,
                        offer: vmm.then(|| fdpass::offer(fd)),
                    };
                    return if vmm {
                        Ok(RegExport::Vmm(export))
                    } else {
                        Err(Error::quiet(
                            crate::error::NcclResult::InvalidUsage,
                            "a VMM allocation, and NCCL_RS_VMM_IPC=0",
                        ))
                    };
                }
                Ok(None) => None,
                // VMM memory without a descriptor handle: the IPC handle is tried all the same.
                Err(e) => Some(e),
            };
            let base = dispatch!(self.allocation_base(p))?.ok_or_else(|| {
                Error::invalid_argument(format!("{p:#x} is not device memory of this process"))
            })?;
            match dispatch!(self.ipc_handle(base)) {
                Ok(handle) => Ok(RegExport::Ipc { base, handle }),
                Err(e) => Err(match vmm_err {
                    Some(v) => Error::quiet(
                        e.code,
                        format!("neither a VMM descriptor ({v}) nor an IPC handle ({e})"),
                    ),
                    None => e,
                }),
            }
        }
    }

    crate::internal! {
        /// The VMM allocation holding `p` exported as [`Device::reg_export`] exports one (its
        /// descriptor on offer until the export drops); None, quietly, where `p` is no memory
        /// of the virtual memory API with a descriptor handle. For the allocations after the
        /// first of a buffer that spans several.
        fn vmm_export_at(&self, p: DevPtr) -> Result<Option<VmmExport>> {
            Ok(dispatch!(self.vmm_export(p))?.map(|(base, bytes, fd, handle)| VmmExport {
                dev: self.clone(),
                base,
                bytes,
                handle,
                offer: Some(fdpass::offer(fd)),
            }))
        }
    }

    crate::internal! {
        /// Maps `bytes` of a peer process's VMM allocation, whose shareable descriptor `fd`
        /// is (taken with [`fdpass::take`]); unmapped when the mapping drops.
        fn vmm_import(&self, fd: std::os::fd::BorrowedFd<'_>, bytes: usize) -> Result<VmmMapping> {
            let (ptr, handle) = dispatch!(self.vmm_import(fd, bytes))?;
            Ok(VmmMapping {
                dev: self.clone(),
                ptr,
                bytes,
                handle,
            })
        }
    }

    /// `bytes` of device memory through the virtual memory API as [`Device::alloc_vmm`] gives
    /// it, but rounded up to the allocation granularity only (never bound to a multicast
    /// object): connection blocks.
    pub(crate) fn alloc_vmm_unicast(&self, bytes: usize) -> Result<DevBuffer> {
        self.vmm_buffer(bytes, false)
    }

    /// Releases the memory of the [`Device::alloc_vmm`] allocation at `p`, its address range
    /// kept (see [`super::backend::Suspending`]); the allocation's exports must be gone.
    pub(crate) fn vmm_evict(&self, p: DevPtr) -> Result<()> {
        dispatch!(self.vmm_evict(p))
    }

    /// New memory (contents undefined) where the allocation evicted at `p` was.
    pub(crate) fn vmm_restore(&self, p: DevPtr) -> Result<()> {
        dispatch!(self.vmm_restore(p))
    }

    /// Unmaps the peer's allocation a [`VmmMapping`] holds at `p` (`bytes`), its range kept.
    pub(crate) fn vmm_detach(&self, p: DevPtr, bytes: usize) -> Result<()> {
        dispatch!(self.vmm_detach(p, bytes))
    }

    /// Maps the peer's allocation behind `fd` where a detached mapping of `bytes` is at `p`.
    pub(crate) fn vmm_reattach(
        &self,
        fd: std::os::fd::BorrowedFd<'_>,
        p: DevPtr,
        bytes: usize,
    ) -> Result<()> {
        dispatch!(self.vmm_reattach(fd, p, bytes))
    }

    crate::internal! {
        /// Maps a peer process's buffer; unmapped when the mapping drops.
        fn open_ipc(&self, handle: &[u8; 64]) -> Result<IpcMapping> {
            let ptr = dispatch!(self.open_ipc(handle))?;
            Ok(IpcMapping {
                dev: self.clone(),
                ptr,
            })
        }
    }
}

/// Untyped device memory owned by the runtime, freed when dropped. Its address and size are
/// fixed at allocation (private fields: nothing can make `Drop` free another address). Rust
/// programs use the typed [`crate::DeviceBuffer`]; this is the raw layer's.
pub struct DevBuffer {
    dev: Device,
    pub(crate) ptr: DevPtr,
    pub(crate) bytes: usize,
}

impl std::fmt::Debug for DevBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DevBuffer({:#x}, {} bytes on {:?})",
            self.ptr, self.bytes, self.dev
        )
    }
}

impl DevBuffer {
    /// The device that holds the memory.
    pub fn device(&self) -> &Device {
        &self.dev
    }
    /// The device address of the first byte.
    pub fn ptr(&self) -> DevPtr {
        self.ptr
    }
    /// The size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
    /// Copies `data` to byte `offset` of the buffer; an error past its end.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        if offset + data.len() > self.bytes {
            return Err(Error::internal("DevBuffer write out of range"));
        }
        self.dev.copy_htod(self.ptr + offset as u64, data)
    }
    /// Copies bytes from `offset` of the buffer into `data`; an error past its end.
    pub fn read(&self, offset: usize, data: &mut [u8]) -> Result<()> {
        if offset + data.len() > self.bytes {
            return Err(Error::internal("DevBuffer read out of range"));
        }
        self.dev.copy_dtoh(data, self.ptr + offset as u64)
    }
}

impl Drop for DevBuffer {
    fn drop(&mut self) {
        let d = &self.dev;
        if let Err(e) = dispatch!(d.free(self.ptr)) {
            log::warn!("freeing device memory: {e}");
        }
        d.book(self.bytes, false);
    }
}

crate::internal! {
    /// A flag in host memory that kernels can read: set by the host while kernels run (abort).
    struct HostFlag {
        dev: Device,
        host: *mut u64,
        /// The device address kernels read.
        pub ptr: DevPtr,
    }
}

// SAFETY: the flag is a plain u64 written with volatile stores and read by kernels; the pointer
// stays valid until Drop.
unsafe impl Send for HostFlag {}
// SAFETY: as above; concurrent raises write the same value.
unsafe impl Sync for HostFlag {}

impl HostFlag {
    /// Sets the flag; kernels polling it see it within a few microseconds.
    pub fn raise(&self) {
        // SAFETY: host points at our live 8-byte allocation.
        unsafe { std::ptr::write_volatile(self.host, 1) };
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the flag was raised.
    pub fn is_raised(&self) -> bool {
        // SAFETY: host points at our live 8-byte allocation.
        unsafe { std::ptr::read_volatile(self.host) != 0 }
    }
}

impl Drop for HostFlag {
    fn drop(&mut self) {
        let d = &self.dev;
        if let Err(e) = dispatch!(d.free_host_mapped(self.host as *mut u8)) {
            log::warn!("freeing a host flag: {e}");
        }
    }
}

crate::internal! {
    /// Pinned host memory mapped into the device: the FIFOs and counters of connections a proxy
    /// thread carries (the host reads and writes it through `host`, kernels through `ptr`).
    /// Zeroed at allocation.
    struct HostMem {
        dev: Device,
        host: *mut u8,
        /// The device address kernels use.
        pub ptr: DevPtr,
        /// Its size in bytes.
        pub bytes: usize,
    }
}

// SAFETY: the memory is shared with kernels and proxy threads by design; every access goes
// through volatile or atomic operations on the users' side, and the pointer stays valid until
// Drop.
unsafe impl Send for HostMem {}
// SAFETY: as above.
unsafe impl Sync for HostMem {}

impl HostMem {
    /// The host address of byte `offset`, or None past the end.
    pub fn host_ptr(&self, offset: usize) -> Option<*mut u8> {
        // SAFETY: offset is inside our allocation.
        (offset < self.bytes).then(|| unsafe { self.host.add(offset) })
    }

    /// The u64 at byte `offset` as the device last wrote it (None past the end or unaligned).
    pub fn load_u64(&self, offset: usize) -> Option<u64> {
        let p = self
            .host_ptr(offset)
            .filter(|_| offset + 8 <= self.bytes && offset.is_multiple_of(8))?;
        // SAFETY: p is an aligned u64 inside our live allocation; a volatile load, since the
        // device writes it.
        Some(unsafe { std::ptr::read_volatile(p as *const u64) })
    }
}

impl Drop for HostMem {
    fn drop(&mut self) {
        let d = &self.dev;
        if let Err(e) = dispatch!(d.free_host_mapped(self.host)) {
            log::warn!("freeing mapped host memory: {e}");
        }
    }
}

impl Device {
    crate::internal! {
        /// `bytes` of zeroed pinned host memory mapped into this device.
        fn alloc_host_mem(&self, bytes: usize) -> Result<HostMem> {
            let (host, ptr) = dispatch!(self.alloc_host_mapped(bytes))?;
            Ok(HostMem {
                dev: self.clone(),
                host,
                ptr,
                bytes,
            })
        }
    }
}

/// While it lives, the calling thread's potentially unsafe driver calls (querying an event,
/// closing or unmapping a peer's memory) are allowed although a stream capture in CUDA's
/// global mode is open in the process, which those calls would otherwise invalidate; the
/// thread's previous mode comes back on drop ([`Device::relaxed_capture`]).
#[allow(dead_code)] // held for its drop
pub(crate) enum CaptureRelaxed {
    Cuda(driver::RelaxedCapture),
    Sim(sim::RelaxedCapture),
}

impl Device {
    /// Relaxes the calling thread's stream-capture mode for what the returned guard spans
    /// (CUDA's `cuThreadExchangeStreamCaptureMode`, as NCCL does for its own work during a
    /// capture).
    pub(crate) fn relaxed_capture(&self) -> CaptureRelaxed {
        match &*self.imp {
            Imp::Cuda(_) => CaptureRelaxed::Cuda(driver::RelaxedCapture::enter()),
            Imp::Sim(_) => CaptureRelaxed::Sim(sim::RelaxedCapture::enter()),
        }
    }
}

crate::internal! {
    /// An event that completes once every kernel the communicator had launched when it was made
    /// has finished (a communicator's launch order makes it: `comm::order::StreamOrder::fence`);
    /// destroyed on drop.
    struct Fence {
        pub(crate) device: Device,
        pub(crate) event: u64,
    }
}

impl Fence {
    /// Whether those kernels have all finished (an error counts as not yet).
    pub fn passed(&self) -> bool {
        // Asked at drains, perhaps while a capture in CUDA's global mode is open, which a
        // query from a thread in that mode would invalidate.
        let _relaxed = self.device.relaxed_capture();
        self.device.event_query(self.event).unwrap_or(false)
    }
}

impl Drop for Fence {
    fn drop(&mut self) {
        let _ = self.device.event_destroy(self.event);
    }
}

crate::internal! {
    /// Host memory of the caller's (a shared memory segment) pinned and mapped into a device:
    /// kernels address it through `ptr`. Unregistered on drop, which must come before the memory
    /// is unmapped.
    struct HostRegistration {
        dev: Device,
        host: *mut u8,
        /// The device address kernels use.
        pub ptr: DevPtr,
    }
}

// SAFETY: the registration only holds the address to unregister it; the memory itself is
// owned (and synchronised) by whoever registered it.
unsafe impl Send for HostRegistration {}
// SAFETY: as above; nothing is read or written through `host` here.
unsafe impl Sync for HostRegistration {}

impl Device {
    crate::internal! {
        /// Pins `bytes` of host memory at `host` and maps it into this device (CUDA:
        /// `cuMemHostRegister` with PORTABLE | DEVICEMAP; the simulator: the same address).
        ///
        /// # Safety
        /// `host..host + bytes` is a live mapping of the caller's, page-aligned, that stays mapped
        /// until the returned registration drops.
        unsafe fn host_register(&self, host: *mut u8, bytes: usize) -> Result<HostRegistration> {
            let ptr = dispatch!(self.host_register(host, bytes))?;
            Ok(HostRegistration {
                dev: self.clone(),
                host,
                ptr,
            })
        }
    }
}

impl Device {
    crate::internal! {
        /// Whether GPU memory of this device can be handed to a network as a dmabuf
        /// (`CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`; never on the simulator, whose device memory
        /// is host memory a network reads as it is).
        fn dmabuf_supported(&self) -> bool {
            match &*self.imp {
                Imp::Cuda(d) => d.dmabuf_supported(),
                Imp::Sim(_) => false,
            }
        }
    }
    crate::internal! {
        /// A dmabuf file descriptor for `bytes` of this device's memory at `p`
        /// (`cuMemGetHandleForAddressRange`), for a network's `regMrDmaBuf`; `None` on the
        /// simulator. `p` and `bytes` must be page-aligned and inside one allocation.
        fn dmabuf_fd(&self, p: DevPtr, bytes: usize) -> Result<Option<std::os::fd::OwnedFd>> {
            match &*self.imp {
                Imp::Cuda(d) => d.dmabuf_fd(p, bytes).map(Some),
                Imp::Sim(_) => Ok(None),
            }
        }
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        let d = &self.dev;
        if let Err(e) = dispatch!(d.host_unregister(self.host)) {
            log::warn!("unregistering host memory: {e}");
        }
    }
}

crate::internal! {
    /// A peer process's buffer mapped into ours.
    struct IpcMapping {
        dev: Device,
        /// The mapped address in this process.
        pub ptr: DevPtr,
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        let d = &self.dev;
        if let Err(e) = dispatch!(d.close_ipc(self.ptr)) {
            log::warn!("closing a peer mapping: {e}");
        }
    }
}

crate::internal! {
    /// What [`Device::reg_export`] made of an allocation.
    enum RegExport {
        /// A legacy allocation: its base and IPC handle.
        Ipc { base: DevPtr, handle: [u8; 64] },
        /// An allocation of the virtual memory API, its descriptor on offer.
        Vmm(VmmExport),
    }
}

crate::internal! {
    /// A VMM allocation exported for peer processes: the allocation handle retained
    /// (`cuMemRetainAllocationHandle`) and its POSIX descriptor on offer; both let go on drop.
    struct VmmExport {
        dev: Device,
        /// The mapping's base and size, in this process.
        pub base: DevPtr,
        pub bytes: usize,
        /// The retained allocation handle (0 on the simulator).
        handle: u64,
        offer: Option<fdpass::Offer>,
    }
}

impl VmmExport {
    /// What a peer needs to take the descriptor.
    pub fn ticket(&self) -> Option<fdpass::Ticket> {
        self.offer.as_ref().map(|o| o.ticket())
    }
}

impl std::fmt::Debug for VmmExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "VmmExport({:#x}, {} bytes, {:?})",
            self.base, self.bytes, self.offer
        )
    }
}

impl Drop for VmmExport {
    fn drop(&mut self) {
        // The descriptor off the table (and closed) first: no peer takes it after this.
        self.offer.take();
        let d = &self.dev;
        if let Err(e) = dispatch!(d.vmm_export_release(self.handle)) {
            log::warn!("releasing an exported VMM allocation: {e}");
        }
    }
}

crate::internal! {
    /// A peer process's VMM allocation mapped into ours (reserved, mapped, readable and
    /// writable by this device); unmapped and released on drop.
    struct VmmMapping {
        dev: Device,
        /// The mapped address in this process.
        pub ptr: DevPtr,
        bytes: usize,
        handle: u64,
    }
}

impl Drop for VmmMapping {
    fn drop(&mut self) {
        let d = &self.dev;
        if let Err(e) = dispatch!(d.vmm_unmap(self.ptr, self.bytes, self.handle)) {
            log::warn!("unmapping a peer's VMM allocation: {e}");
        }
    }
}
