//! The real backend: the CUDA driver API through cudarc's dynamically loaded bindings. Nothing
//! links against libcuda; a machine without a driver gets an error value, never a panic.

use super::backend::{Capture, Context, Kernels, Memory, Sharing, Streams};
use super::{DevPtr, DeviceProps, GraphRelease, StreamHandle};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

// One file per seam of `super::backend` (each holds that trait's implementation).
mod capture;
mod context;
mod kernels;
pub use kernels::UserModule;
mod memory;
mod multicast;
mod sharing;
mod streams;
mod suspend;
pub use multicast::Multicast;

/// Turns a driver status into our error, with the driver's own name and message.
pub fn check(r: sys::CUresult, what: &str) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut name: *const std::ffi::c_char = std::ptr::null();
    let mut text: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: both calls only write a pointer to a static string (or leave it null).
    unsafe {
        sys::cuGetErrorName(r, &mut name);
        sys::cuGetErrorString(r, &mut text);
    }
    let s = |p: *const std::ffi::c_char| {
        if p.is_null() {
            format!("{r:?}")
        } else {
            // SAFETY: the driver returned a NUL-terminated static string.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    Err(Error::cuda(format!(
        "{what} failed: {} ({})",
        s(name),
        s(text)
    )))
}

/// As [`check`], for a failure that only declines an optional path (a peer's VMM buffer
/// that cannot be mapped): neither logged at WARN nor kept as the last error; the caller says
/// why at INFO.
pub fn check_quiet(r: sys::CUresult, what: &str) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(Error::quiet(
        crate::error::NcclResult::UnhandledCudaError,
        format!("{what} failed: {r:?}"),
    ))
}

/// Waits for everything issued on `s` (a raw stream of the current context).
fn stream_wait(s: sys::CUstream) -> Result<()> {
    // SAFETY: s is a live stream of the current context, or the legacy stream.
    check(
        unsafe { sys::cuStreamSynchronize(s) },
        "cuStreamSynchronize",
    )
}

/// Loads libcuda and calls cuInit once; later calls return the same outcome.
pub fn init() -> Result<()> {
    static INIT: OnceLock<std::result::Result<(), Error>> = OnceLock::new();
    INIT.get_or_init(|| {
        // SAFETY: probing for the library has no side effects beyond loading it.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::system(
                "no CUDA driver found (libcuda.so could not be loaded); set NCCL_RS_BACKEND=sim to use the CPU simulator",
            ));
        }
        // SAFETY: cuInit takes flags 0.
        check(unsafe { sys::cuInit(0) }, "cuInit")
    })
    .clone()
}

pub fn device_count() -> Result<usize> {
    init()?;
    let mut n = 0;
    // SAFETY: writes one int.
    check(unsafe { sys::cuDeviceGetCount(&mut n) }, "cuDeviceGetCount")?;
    Ok(n.max(0) as usize)
}

/// A raw driver handle that may cross threads (the driver's handles are process-wide).
#[derive(Clone, Copy, Debug)]
struct Raw<T>(T);
// SAFETY: CUDA driver handles (contexts, modules, functions) may be used from any thread.
unsafe impl<T> Send for Raw<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Raw<T> {}

/// One GPU: its primary context (shared with the CUDA runtime and other libraries in the
/// process) and its lazily loaded kernel modules.
pub struct Device {
    pub ordinal: i32,
    dev: sys::CUdevice,
    ctx: Raw<sys::CUcontext>,
    sm: u32,
    modules: Mutex<HashMap<String, Raw<sys::CUmodule>>>,
    functions: Mutex<HashMap<String, Raw<sys::CUfunction>>>,
    /// The most local memory per thread any loaded kernel needs (`kernels.rs`).
    local_bytes: std::sync::atomic::AtomicUsize,
    /// Whether `Kernels::preload` ran (held while it runs: the device's other communicators
    /// wait for it).
    preloaded: Mutex<bool>,
    /// A non-blocking stream of our own for the zeroing of new memory, and for copies while
    /// the legacy stream cannot be used (see [`Device::copy_stream`]).
    private: OnceLock<Raw<sys::CUstream>>,
}

impl Device {
    pub fn open(ordinal: i32) -> Result<Device> {
        let n = device_count()?;
        if ordinal < 0 || ordinal as usize >= n {
            return Err(Error::invalid_argument(format!(
                "CUDA device {ordinal} does not exist ({n} visible)"
            )));
        }
        let mut dev = 0;
        let mut ctx = std::ptr::null_mut();
        // SAFETY: plain out-parameters; the primary context is retained for the Device's life.
        unsafe {
            check(sys::cuDeviceGet(&mut dev, ordinal), "cuDeviceGet")?;
            check(
                sys::cuDevicePrimaryCtxRetain(&mut ctx, dev),
                "cuDevicePrimaryCtxRetain",
            )?;
        }
        let mut d = Device {
            ordinal,
            dev,
            ctx: Raw(ctx),
            sm: 0,
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            local_bytes: Default::default(),
            preloaded: Mutex::new(false),
            private: OnceLock::new(),
        };
        let (major, minor) = d.compute_capability()?;
        d.sm = major * 10 + minor;
        Ok(d)
    }

    /// The compute capability as one number (90 for 9.0).
    pub fn sm(&self) -> u32 {
        self.sm
    }

    /// The device of the calling thread's current context, as `cudaGetDevice` would say.
    pub fn current_ordinal() -> Result<i32> {
        init()?;
        let mut ctx = std::ptr::null_mut();
        // SAFETY: out-parameter.
        check(unsafe { sys::cuCtxGetCurrent(&mut ctx) }, "cuCtxGetCurrent")?;
        if ctx.is_null() {
            return Ok(0);
        }
        let mut dev = 0;
        // SAFETY: out-parameter; a context is current.
        check(unsafe { sys::cuCtxGetDevice(&mut dev) }, "cuCtxGetDevice")?;
        Ok(dev)
    }

    fn attr(&self, a: sys::CUdevice_attribute) -> Result<i32> {
        let mut v = 0;
        // SAFETY: out-parameter.
        check(
            unsafe { sys::cuDeviceGetAttribute(&mut v, a, self.dev) },
            "cuDeviceGetAttribute",
        )?;
        Ok(v)
    }

    /// Whether the driver exports this device's memory as dmabufs.
    pub fn dmabuf_supported(&self) -> bool {
        self.attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)
            .is_ok_and(|v| v != 0)
    }

    /// A new dmabuf file descriptor for `bytes` at `p` (page-aligned, inside one allocation).
    pub fn dmabuf_fd(&self, p: DevPtr, bytes: usize) -> Result<std::os::fd::OwnedFd> {
        use std::os::fd::FromRawFd;
        self.make_current()?;
        let mut fd: std::ffi::c_int = -1;
        // SAFETY: `fd` is an int the driver writes the new descriptor into; our context is
        // current; the range is the caller's allocation.
        check(
            unsafe {
                sys::cuMemGetHandleForAddressRange(
                    &mut fd as *mut std::ffi::c_int as *mut c_void,
                    p,
                    bytes,
                    sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                    0,
                )
            },
            "cuMemGetHandleForAddressRange",
        )?;
        if fd < 0 {
            return Err(Error::cuda(
                "cuMemGetHandleForAddressRange returned no file descriptor",
            ));
        }
        // SAFETY: the driver made `fd` for us; nothing else owns it.
        Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
    }

    fn compute_capability(&self) -> Result<(u32, u32)> {
        use sys::CUdevice_attribute::*;
        Ok((
            self.attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? as u32,
            self.attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)? as u32,
        ))
    }

    /// Zeroes `bytes` at `p`, on our own stream, never the legacy one: a first use of a
    /// communicator may allocate while a blocking stream of this context captures a graph.
    ///
    /// # Safety
    /// `p` is a fresh allocation of at least `bytes` bytes that nothing else uses yet.
    unsafe fn zero_new(&self, p: DevPtr, bytes: usize) -> Result<()> {
        let s = self.private_stream()?;
        // SAFETY: the caller's promise; s is our stream.
        check(
            unsafe { sys::cuMemsetD8Async(p, 0, bytes, s) },
            "cuMemsetD8Async",
        )?;
        stream_wait(s)
    }

    /// Our private non-blocking stream, created on first use.
    fn private_stream(&self) -> Result<sys::CUstream> {
        if let Some(s) = self.private.get() {
            return Ok(s.0);
        }
        let mut s = std::ptr::null_mut();
        // SAFETY: out-parameter; our context is current (every caller made it so).
        check(unsafe { sys::cuStreamCreate(&mut s, 1) }, "cuStreamCreate")?;
        if let Err(Raw(lost)) = self.private.set(Raw(s)) {
            // Another thread created one first: keep theirs.
            // SAFETY: `lost` is the stream created just above, used by nobody.
            unsafe { sys::cuStreamDestroy_v2(lost) };
        }
        Ok(self.private.get().map_or(s, |r| r.0))
    }

    /// The stream of a synchronous copy: the legacy stream, so that it follows the caller's
    /// work there as `cuMemcpy` does, except while a blocking stream of this context captures
    /// a graph. Then any legacy-stream work would join that capture implicitly and invalidate
    /// it (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT), so the copy takes our private stream.
    fn copy_stream(&self) -> Result<sys::CUstream> {
        let mut st = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: the legacy stream of the current context; out-parameter. Asking does not
        // invalidate a capture.
        match unsafe { sys::cuStreamIsCapturing(std::ptr::null_mut(), &mut st) } {
            sys::CUresult::CUDA_SUCCESS => Ok(std::ptr::null_mut()),
            sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => self.private_stream(),
            r => check(r, "cuStreamIsCapturing").map(|_| std::ptr::null_mut()),
        }
    }

    pub fn can_access_peer(&self, peer: &Device) -> Result<bool> {
        let mut v = 0;
        // SAFETY: out-parameter.
        check(
            unsafe { sys::cuDeviceCanAccessPeer(&mut v, self.dev, peer.dev) },
            "cuDeviceCanAccessPeer",
        )?;
        Ok(v != 0)
    }

    pub fn enable_peer_access(&self, peer: &Device) -> Result<()> {
        self.make_current()?;
        // SAFETY: enabling access to a retained peer context.
        let r = unsafe { sys::cuCtxEnablePeerAccess(peer.ctx.0, 0) };
        if r == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        check(r, "cuCtxEnablePeerAccess")
    }
}

/// While it lives, this thread's potentially unsafe calls (module loads, allocations, graph
/// instantiation) are allowed although a stream capture in CUDA's global mode is open, as NCCL
/// does for its own lazy setup; the thread's previous mode comes back on drop.
pub(crate) struct RelaxedCapture(sys::CUstreamCaptureMode);

impl RelaxedCapture {
    pub(crate) fn enter() -> RelaxedCapture {
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: exchanges this thread's capture mode; in-out parameter.
        unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        RelaxedCapture(mode)
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        // SAFETY: as in enter; puts the previous mode back.
        unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut self.0) };
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: our private stream is idle (every use waited for it); the retain in open()
        // is balanced; modules die with the context.
        unsafe {
            if let Some(s) = self.private.get() {
                sys::cuStreamDestroy_v2(s.0);
            }
            sys::cuDevicePrimaryCtxRelease_v2(self.dev);
        }
    }
}

/// How many adjacent mappings one extent query follows at most.
const MAX_MAPPINGS_WALKED: usize = 1 << 16;

/// The device ordinal of `p` and the range `[base, end)` of the allocation (or mapping) the
/// driver says holds it; None when `p` is not memory the driver knows.
fn query_extent(p: DevPtr) -> Option<(i32, DevPtr, DevPtr)> {
    let mut ordinal: i32 = -1;
    // SAFETY: out-parameter of the size the attribute defines (an int).
    let r = unsafe {
        sys::cuPointerGetAttribute(
            &mut ordinal as *mut i32 as *mut c_void,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            p,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return None;
    }
    let (mut base, mut size) = (0, 0);
    // SAFETY: out-parameters.
    let r = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, p) };
    if r != sys::CUresult::CUDA_SUCCESS || base > p {
        // Known to the driver but of no range it reports: its extent is unknown, so nothing
        // is refused for it (as before extents were checked).
        return Some((ordinal, p, DevPtr::MAX));
    }
    Some((ordinal, base, base.saturating_add(size as u64)))
}

/// Whether the allocation holding `p` may continue in an adjacent mapping: device memory of
/// the virtual memory API (not cuMemAlloc's, which is legacy-IPC capable; not a memory
/// pool's; not managed). Adjacent cuMemAlloc allocations are separate buffers, and an
/// overrun into one is what the check exists to refuse.
fn walks_mappings(p: DevPtr) -> bool {
    use sys::CUpointer_attribute::*;
    let get = |a: sys::CUpointer_attribute| -> Option<u64> {
        let mut v: u64 = 0;
        // SAFETY: every attribute asked here is at most 8 bytes (an int, a bool or a
        // handle); the rest of the zeroed u64 reads as 0 on a little-endian host.
        let r = unsafe { sys::cuPointerGetAttribute(&mut v as *mut u64 as *mut c_void, a, p) };
        (r == sys::CUresult::CUDA_SUCCESS).then_some(v)
    };
    get(CU_POINTER_ATTRIBUTE_MEMORY_TYPE) == Some(sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u64)
        && get(CU_POINTER_ATTRIBUTE_IS_MANAGED) == Some(0)
        && get(CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE) == Some(0)
        && get(CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE).unwrap_or(0) == 0
}

/// Extents of device memory that calls used, by allocation base: what makes the extent check
/// of every buffer of every call cheap. Entries of our own allocations are dropped when we
/// free them. Memory that others free (a caching allocator returning a segment) is not seen;
/// a stale entry is only trusted to accept a buffer it covers on the same device, and
/// anything it would refuse is asked of the driver again. The cache is small: at
/// [`extent_cache::MAX`] entries it starts over.
mod extent_cache {
    use super::DevPtr;
    use std::cell::Cell;
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Mutex, OnceLock};

    pub const MAX: usize = 4096;

    /// Bumped whenever the map changes: a thread's last hit is good while it holds.
    static GENERATION: AtomicU64 = AtomicU64::new(0);

    std::thread_local! {
        /// The calling thread's last hit: (generation, base, end, ordinal). A call checks the
        /// same buffers again and again; this spares it the map's lock.
        static LAST: Cell<(u64, DevPtr, DevPtr, i32)> = const { Cell::new((u64::MAX, 0, 0, 0)) };
    }

    fn map() -> std::sync::MutexGuard<'static, BTreeMap<DevPtr, (DevPtr, i32)>> {
        static M: OnceLock<Mutex<BTreeMap<DevPtr, (DevPtr, i32)>>> = OnceLock::new();
        M.get_or_init(|| Mutex::new(BTreeMap::new()))
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The (ordinal, end) of the cached extent holding `p`.
    pub fn lookup(p: DevPtr) -> Option<(i32, DevPtr)> {
        let (gen, base, end, ordinal) = LAST.get();
        if gen == GENERATION.load(Ordering::Acquire) && base <= p && p < end {
            return Some((ordinal, end));
        }
        // Read before the map: an entry dropped after this read bumps it past what LAST keeps.
        let gen = GENERATION.load(Ordering::Acquire);
        match map().range(..=p).next_back() {
            Some((&base, &(end, ordinal))) if p < end => {
                LAST.set((gen, base, end, ordinal));
                Some((ordinal, end))
            }
            _ => None,
        }
    }

    pub fn insert(base: DevPtr, end: DevPtr, ordinal: i32) {
        let mut m = map();
        if m.len() >= MAX {
            m.clear();
            GENERATION.fetch_add(1, Ordering::AcqRel);
        }
        m.insert(base, (end, ordinal));
        // A thread may hold the old extent of this base, or an outer stale one that the new
        // entry, narrower, would now answer for.
        GENERATION.fetch_add(1, Ordering::AcqRel);
    }

    /// Drops every entry holding `p` (an allocation about to be freed).
    pub fn forget(p: DevPtr) {
        let mut m = map();
        let stale: Vec<DevPtr> = m
            .range(..=p)
            .filter(|(_, &(end, _))| p < end)
            .map(|(&b, _)| b)
            .collect();
        if !stale.is_empty() {
            GENERATION.fetch_add(1, Ordering::AcqRel);
        }
        for b in stale {
            m.remove(&b);
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_threads_last_hit_goes_with_the_entry() {
            // Addresses no test allocates (the map is the process's).
            let (base, end) = (0x7700_0000_0000, 0x7700_0010_0000);
            insert(base, end, 3);
            assert_eq!(lookup(base + 8), Some((3, end)));
            assert_eq!(
                lookup(base + 16),
                Some((3, end)),
                "from the thread's last hit"
            );
            // Another thread frees it: this thread's hit must not survive.
            std::thread::spawn(move || forget(base + 4)).join().unwrap();
            assert_eq!(lookup(base + 8), None);
            insert(base, base + 0x1000, 1);
            assert_eq!(lookup(base + 8), Some((1, base + 0x1000)));
            std::thread::spawn(move || insert(base, end, 2))
                .join()
                .unwrap();
            assert_eq!(
                lookup(base + 8),
                Some((2, end)),
                "replaced in another thread"
            );
            forget(base);
        }
    }
}

/// Read-write access to a mapping for device `ordinal`.
fn access_desc(ordinal: i32) -> sys::CUmemAccessDesc {
    // SAFETY: plain C structs for which all zeroes is valid.
    let mut d: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
    d.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = ordinal;
    d.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    d
}
