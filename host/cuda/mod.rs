//! The only module that talks to a GPU (rule 3 of docs/architecture.md). Two backends behind one API: the CUDA
//! driver (`driver`) and the CPU simulator (`sim`), which runs the same device kernels on host
//! threads. The backend is chosen explicitly — `NCCL_RS_BACKEND=cuda|sim` or [`set_backend`]
//! before first use — and never swapped in silently when a GPU is missing.

#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod driver;
#[cfg(not(feature = "internals"))]
pub(crate) mod driver;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod ptx;
#[cfg(not(feature = "internals"))]
pub(crate) mod ptx;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod sim;
#[cfg(not(feature = "internals"))]
pub(crate) mod sim;

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Most threads a kernel launch may have (kernels are compiled to fit the register file at it).
pub const MAX_THREADS: u32 = 512;

/// A device address (on the simulator, a host address).
pub type DevPtr = u64;

/// A stream as the user holds it: a `CUstream` on the driver backend (0 is the legacy default
/// stream), a simulator stream id on the simulator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StreamHandle(pub u64);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
/// Which implementation runs the device work.
#[non_exhaustive]
pub enum Backend {
    /// The CUDA driver, loaded at run time.
    Cuda,
    /// The CPU simulator: the same kernels on host threads.
    Sim,
}

#[derive(Clone, Debug)]
/// What a device is, as the driver reports it.
pub struct DeviceProps {
    /// The product name.
    pub name: String,
    /// The PCI bus id (`0000:17:00.0`).
    pub bus_id: String,
    /// (major, minor).
    pub compute_capability: (u32, u32),
    /// Streaming multiprocessors.
    pub sm_count: u32,
}

static BACKEND: AtomicU8 = AtomicU8::new(0); // 0: not chosen yet, 1: cuda, 2: sim

/// Chooses the backend for this process. Allowed once, before any device is opened (or again
/// with the same choice).
pub fn set_backend(b: Backend) -> Result<()> {
    let want = if b == Backend::Cuda { 1 } else { 2 };
    match BACKEND.compare_exchange(0, want, Ordering::SeqCst, Ordering::SeqCst) {
        Ok(_) => Ok(()),
        Err(cur) if cur == want => Ok(()),
        Err(_) => Err(Error::invalid_usage(
            "the backend was already chosen; set it before any other nccl call",
        )),
    }
}

/// The backend in use: the one set, else `NCCL_RS_BACKEND` (cuda by default).
pub fn backend() -> Backend {
    if BACKEND.load(Ordering::SeqCst) == 0 {
        let b = match crate::env::RS_BACKEND.raw().as_deref() {
            Some("sim") | Some("SIM") | Some("simulator") => Backend::Sim,
            _ => Backend::Cuda,
        };
        let _ = set_backend(b);
    }
    if BACKEND.load(Ordering::SeqCst) == 2 {
        Backend::Sim
    } else {
        Backend::Cuda
    }
}

/// How many devices the chosen backend shows.
pub fn device_count() -> Result<usize> {
    match backend() {
        Backend::Cuda => driver::device_count(),
        Backend::Sim => Ok(sim::device_count()),
    }
}

enum Imp {
    Cuda(driver::Device),
    Sim(sim::Device),
}

/// Calls the same method on whichever backend holds the device.
macro_rules! dispatch {
    ($self:ident . $m:ident ( $($a:expr),* )) => {
        match &*$self.imp {
            Imp::Cuda(d) => d.$m($($a),*),
            Imp::Sim(d) => d.$m($($a),*),
        }
    };
}

mod graph;
// The build script makes the choice (build.rs includes this file); the library asks it only
// what to tell a device the build holds no kernels for.
#[cfg_attr(not(test), allow(dead_code))]
mod ptx_archs;
mod ptx_cut;
pub use graph::{Graph, GraphRelease};
pub(crate) mod multicast;
pub(crate) use multicast::Multicast;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod fdpass;
#[cfg(not(feature = "internals"))]
pub(crate) mod fdpass;

/// One GPU (or one simulated GPU). Cheap to clone; opened once per ordinal per process.
#[derive(Clone)]
pub struct Device {
    imp: Arc<Imp>,
    /// Its ordinal (`cudaSetDevice`'s number).
    pub ordinal: i32,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({})", self.ordinal)
    }
}

impl Device {
    /// The device `ordinal`, opened once and shared by everyone in the process.
    pub fn open(ordinal: i32) -> Result<Device> {
        static OPEN: OnceLock<Mutex<Vec<Option<Device>>>> = OnceLock::new();
        let table = OPEN.get_or_init(|| Mutex::new(Vec::new()));
        let mut t = table
            .lock()
            .map_err(|_| Error::internal("device table poisoned"))?;
        if ordinal >= 0 {
            if let Some(Some(d)) = t.get(ordinal as usize) {
                return Ok(d.clone());
            }
        }
        let imp = match backend() {
            Backend::Cuda => Imp::Cuda(driver::Device::open(ordinal)?),
            Backend::Sim => Imp::Sim(sim::Device::open(ordinal)?),
        };
        let d = Device {
            imp: Arc::new(imp),
            ordinal,
        };
        let i = ordinal as usize;
        if t.len() <= i {
            t.resize(i + 1, None);
        }
        t[i] = Some(d.clone());
        Ok(d)
    }

    /// The calling thread's current device (`cudaGetDevice`).
    pub fn current() -> Result<Device> {
        let ordinal = match backend() {
            Backend::Cuda => driver::Device::current_ordinal()?,
            Backend::Sim => sim::current_ordinal(),
        };
        Device::open(ordinal)
    }

    /// Whether it is a simulated device.
    pub fn is_sim(&self) -> bool {
        matches!(*self.imp, Imp::Sim(_))
    }

    /// Whether this build holds kernels this device can run (the simulator runs every kernel
    /// built); the error names what the build holds and how to build for it.
    pub fn check_kernels(&self) -> Result<()> {
        match &*self.imp {
            Imp::Cuda(d) => ptx::check_built_for(d.sm()),
            Imp::Sim(_) => Ok(()),
        }
    }

    /// Makes this device current for the calling thread (`cudaSetDevice`).
    pub fn make_current(&self) -> Result<()> {
        crate::debug::set_cuda_dev(self.ordinal); // the `[cudaDev]` of this thread's log lines
        dispatch!(self.make_current())
    }
    /// Name, bus id, compute capability and SM count.
    pub fn props(&self) -> Result<DeviceProps> {
        dispatch!(self.props())
    }
    /// (free, total) bytes of device memory.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        dispatch!(self.mem_info())
    }
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
        let (ptr, _mapped) = dispatch!(self.alloc_vmm(bytes))?;
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
                .map(|(ptr, bytes)| DevBuffer {
                    dev: self.clone(),
                    ptr,
                    bytes,
                })
                .collect())
        }
    }
    pub(crate) fn copy_htod(&self, dst: DevPtr, src: &[u8]) -> Result<()> {
        dispatch!(self.copy_htod(dst, src))
    }
    pub(crate) fn copy_dtoh(&self, dst: &mut [u8], src: DevPtr) -> Result<()> {
        dispatch!(self.copy_dtoh(dst, src))
    }
    /// Copies `src` to the device address `dst` (`cuMemcpyHtoD`), after the work queued on the
    /// legacy stream. [`DevBuffer::write`] and the typed `DeviceBuffer` copies are the safe
    /// forms.
    ///
    /// # Safety
    ///
    /// `dst` must be device memory (on the simulator: memory the simulator allocated) of
    /// `src.len()` bytes that nothing else uses during the copy.
    pub unsafe fn copy_htod_raw(&self, dst: DevPtr, src: &[u8]) -> Result<()> {
        self.copy_htod(dst, src)
    }
    /// Copies `dst.len()` bytes from the device address `src` (`cuMemcpyDtoH`).
    ///
    /// # Safety
    ///
    /// `src` must be device memory (on the simulator: memory the simulator allocated) of
    /// `dst.len()` bytes that nothing writes during the copy.
    pub unsafe fn copy_dtoh_raw(&self, dst: &mut [u8], src: DevPtr) -> Result<()> {
        self.copy_dtoh(dst, src)
    }
    crate::internal! {
        /// The ordinal of the device owning `p`, or None if `p` is not device memory we know.
        fn pointer_device(&self, p: DevPtr) -> Result<Option<i32>> {
            Ok(self.pointer_extent(p, 0)?.map(|(ordinal, _)| ordinal))
        }
    }
    crate::internal! {
        /// The device owning `p` and how many bytes its allocation holds from `p` to its end, or
        /// None if `p` is not device memory we know. The count is exact where the backend can
        /// tell; where an allocation is made of several mappings (CUDA's virtual memory API) the
        /// driver backend follows adjacent mappings until `need` bytes are covered.
        fn pointer_extent(&self, p: DevPtr, need: usize) -> Result<Option<(i32, usize)>> {
            dispatch!(self.pointer_extent(p, need))
        }
    }
    crate::internal! {
        /// An id of the allocation holding `p`, unique for the process's lifetime (a freed
        /// allocation's addresses may come back in another, never its id); None where the
        /// backend cannot tell.
        fn allocation_id(&self, p: DevPtr) -> Result<Option<u64>> {
            dispatch!(self.allocation_id(p))
        }
    }
    crate::internal! {
        /// The allocation holding the `bytes` at `p` (its base and bytes, adjacent mappings of
        /// the virtual memory API followed as far as `p + bytes`), or None where the backend
        /// cannot tell or the bytes leave it.
        fn allocation_range(&self, p: DevPtr, bytes: usize) -> Result<Option<(DevPtr, usize)>> {
            let Some(base) = dispatch!(self.allocation_base(p))? else {
                return Ok(None);
            };
            let need = (p - base) as usize + bytes;
            Ok(match self.pointer_extent(base, need)? {
                Some((d, held)) if d == self.ordinal && held >= need && held != usize::MAX => {
                    Some((base, held))
                }
                _ => None,
            })
        }
    }
    crate::internal! {
        /// Whether this device can map `peer`'s memory (`cuDeviceCanAccessPeer`).
        fn can_access_peer(&self, peer: &Device) -> Result<bool> {
            match (&*self.imp, &*peer.imp) {
                (Imp::Cuda(a), Imp::Cuda(b)) => a.can_access_peer(b),
                // NCCL_RS_SIM_NO_PEER_ACCESS=1: a host whose GPUs cannot map each other.
                (Imp::Sim(_), Imp::Sim(_)) => {
                    Ok(self.ordinal == peer.ordinal || crate::env::RS_SIM_NO_PEER_ACCESS.int() == 0)
                }
                _ => Ok(false),
            }
        }
    }
    crate::internal! {
        /// Maps `peer`'s memory into this device's address space (once per pair).
        fn enable_peer_access(&self, peer: &Device) -> Result<()> {
            match (&*self.imp, &*peer.imp) {
                (Imp::Cuda(a), Imp::Cuda(b)) => a.enable_peer_access(b),
                (Imp::Sim(_), Imp::Sim(_)) => Ok(()),
                _ => Err(Error::internal("peer access between backends")),
            }
        }
    }
    crate::internal! {
        /// A handle another process can open to map `buf`.
        fn ipc_handle(&self, buf: &DevBuffer) -> Result<[u8; 64]> {
            dispatch!(self.ipc_handle(buf.ptr))
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
    crate::internal! {
        /// The kernel `name` (a module of its own), loaded lazily.
        fn kernel(&self, name: &str) -> Result<Kernel> {
            Ok(Kernel(dispatch!(self.function(name))?))
        }
    }
    crate::internal! {
        /// Launches `kernel` on `grid` CTAs of `block` threads with `arg` as its only parameter.
        fn launch<A: Copy + Send + 'static>(
            &self,
            kernel: Kernel,
            grid: u32,
            block: u32,
            stream: StreamHandle,
            arg: &A,
        ) -> Result<()> {
            match &*self.imp {
                Imp::Cuda(d) => d.launch(kernel.0, grid, block, stream, arg as *const A as *const u8),
                Imp::Sim(d) => d.launch(
                    kernel.0,
                    grid,
                    block,
                    stream,
                    arg as *const A as *const u8,
                    std::mem::size_of::<A>(),
                ),
            }
        }
    }
    crate::internal! {
        /// Copies `bytes` from `src` to `dst`, both device memory, in `stream`'s order.
        fn copy_dtod_async(
            &self,
            dst: DevPtr,
            src: DevPtr,
            bytes: usize,
            stream: StreamHandle,
        ) -> Result<()> {
            dispatch!(self.copy_dtod_async(dst, src, bytes, stream))
        }
    }
    crate::internal! {
        /// A non-blocking stream: it never waits for the legacy default stream, nor it for it.
        fn stream_create(&self) -> Result<StreamHandle> {
            dispatch!(self.stream_create(false))
        }
    }
    crate::internal! {
        /// A blocking stream (`cudaStreamCreate`'s default): ordered with the legacy default
        /// stream both ways, as most CUDA programs' streams are.
        fn stream_create_blocking(&self) -> Result<StreamHandle> {
            dispatch!(self.stream_create(true))
        }
    }
    crate::internal! {
        /// Destroys a stream made by [`Device::stream_create`]; queued work still runs.
        fn stream_destroy(&self, s: StreamHandle) -> Result<()> {
            dispatch!(self.stream_destroy(s))
        }
    }
    crate::internal! {
        /// Waits until the work queued on `s` has run.
        fn stream_sync(&self, s: StreamHandle) -> Result<()> {
            dispatch!(self.stream_sync(s))
        }
    }
    /// Waits until every stream of this device is idle (`cuCtxSynchronize`).
    pub fn synchronize(&self) -> Result<()> {
        dispatch!(self.synchronize())
    }
    crate::internal! {
        /// Whether the work queued on `s` has run (without waiting).
        fn stream_query(&self, s: StreamHandle) -> Result<bool> {
            dispatch!(self.stream_query(s))
        }
    }
    crate::internal! {
        /// A new timing event.
        fn event_create(&self) -> Result<u64> {
            dispatch!(self.event_create())
        }
    }
    crate::internal! {
        /// An event that orders work but cannot time it (cheaper to record).
        fn event_create_untimed(&self) -> Result<u64> {
            match &*self.imp {
                Imp::Cuda(d) => d.event_create_untimed(),
                Imp::Sim(d) => d.event_create(),
            }
        }
    }
    crate::internal! {
        /// Records event `e` on stream `s`.
        fn event_record(&self, e: u64, s: StreamHandle) -> Result<()> {
            dispatch!(self.event_record(e, s))
        }
    }
    crate::internal! {
        /// Makes later work on `s` wait for event `e`.
        fn stream_wait_event(&self, s: StreamHandle, e: u64) -> Result<()> {
            dispatch!(self.stream_wait_event(s, e))
        }
    }
    crate::internal! {
        /// Inside a capture only: each launch of the graph records `e` (an event record node).
        fn event_record_external(&self, e: u64, s: StreamHandle) -> Result<()> {
            dispatch!(self.event_record_external(e, s))
        }
    }
    crate::internal! {
        /// Inside a capture only: each launch of the graph waits for `e`'s latest record then.
        fn stream_wait_event_external(&self, s: StreamHandle, e: u64) -> Result<()> {
            dispatch!(self.stream_wait_event_external(s, e))
        }
    }
    crate::internal! {
        /// Whether event `e` has happened (without waiting).
        fn event_query(&self, e: u64) -> Result<bool> {
            dispatch!(self.event_query(e))
        }
    }
    crate::internal! {
        /// Waits until event `e` has happened.
        fn event_sync(&self, e: u64) -> Result<()> {
            dispatch!(self.event_sync(e))
        }
    }
    crate::internal! {
        /// Milliseconds between two recorded events.
        fn event_elapsed_ms(&self, start: u64, end: u64) -> Result<f32> {
            dispatch!(self.event_elapsed_ms(start, end))
        }
    }
    crate::internal! {
        /// Destroys event `e`.
        fn event_destroy(&self, e: u64) -> Result<()> {
            dispatch!(self.event_destroy(e))
        }
    }
}

crate::internal! {
    /// A kernel entry point of a device (an opaque backend handle).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    struct Kernel(usize);
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
