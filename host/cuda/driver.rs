//! The real backend: the CUDA driver API through cudarc's dynamically loaded bindings. Nothing
//! links against libcuda; a machine without a driver gets an error value, never a panic.

use super::{DevPtr, DeviceProps, GraphRelease, StreamHandle};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

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

mod vmm;

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

    pub fn make_current(&self) -> Result<()> {
        let mut cur = std::ptr::null_mut();
        // SAFETY: out-parameter. Reading the current context is cheaper than setting it, and
        // every call of ours makes its context current first.
        if unsafe { sys::cuCtxGetCurrent(&mut cur) } == sys::CUresult::CUDA_SUCCESS
            && cur == self.ctx.0
        {
            return Ok(());
        }
        // SAFETY: the context is retained while self lives.
        check(
            unsafe { sys::cuCtxSetCurrent(self.ctx.0) },
            "cuCtxSetCurrent",
        )
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

    pub fn props(&self) -> Result<DeviceProps> {
        use sys::CUdevice_attribute::*;
        let mut name = [0 as std::ffi::c_char; 128];
        let mut bus = [0 as std::ffi::c_char; 32];
        // SAFETY: the buffers are as long as the lengths passed.
        unsafe {
            check(
                sys::cuDeviceGetName(name.as_mut_ptr(), 128, self.dev),
                "cuDeviceGetName",
            )?;
            check(
                sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), 32, self.dev),
                "cuDeviceGetPCIBusId",
            )?;
        }
        // SAFETY: the driver wrote NUL-terminated strings.
        let cstr = |b: &[std::ffi::c_char]| {
            unsafe { CStr::from_ptr(b.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        };
        let (major, minor) = self.compute_capability()?;
        Ok(DeviceProps {
            name: cstr(&name),
            bus_id: cstr(&bus),
            compute_capability: (major, minor),
            sm_count: self.attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
        })
    }

    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.make_current()?;
        let (mut free, mut total) = (0, 0);
        // SAFETY: out-parameters; our context is current.
        check(
            unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) },
            "cuMemGetInfo",
        )?;
        Ok((free, total))
    }

    pub fn alloc(&self, bytes: usize) -> Result<DevPtr> {
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

    /// Zeroed pinned host memory the device can address: (host pointer, device address).
    pub fn alloc_host_mapped(&self, bytes: usize) -> Result<(*mut u8, DevPtr)> {
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

    pub fn free_host_mapped(&self, host: *mut u8) -> Result<()> {
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
    pub fn host_register(&self, host: *mut u8, bytes: usize) -> Result<DevPtr> {
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
    pub fn host_unregister(&self, host: *mut u8) -> Result<()> {
        self.make_current()?;
        // SAFETY: host was registered by host_register and is unregistered once (the owner's
        // Drop), while still mapped.
        check(
            unsafe { sys::cuMemHostUnregister(host as *mut c_void) },
            "cuMemHostUnregister",
        )
    }

    pub fn free(&self, p: DevPtr) -> Result<()> {
        if self.free_vmm(p)? {
            return Ok(());
        }
        self.make_current()?;
        extent_cache::forget(p);
        // SAFETY: p came from alloc on this device and is freed once (the owner's Drop).
        check(unsafe { sys::cuMemFree_v2(p) }, "cuMemFree")
    }

    pub fn copy_htod(&self, dst: DevPtr, src: &[u8]) -> Result<()> {
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

    /// Copies `bytes` from `src` to `dst` (device memory) on `stream`, by the copy engine; a
    /// capture records it as a memcpy node.
    pub fn copy_dtod_async(
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

    pub fn copy_dtoh(&self, dst: &mut [u8], src: DevPtr) -> Result<()> {
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

    /// The device owning `p` and the bytes from `p` to the end of its allocation (see
    /// [`extent_cache`]): a cache hit costs a lock and a map lookup; a miss asks the driver
    /// (`cuMemGetAddressRange`), so memory allocated outside this library works too.
    pub fn pointer_extent(&self, p: DevPtr, need: usize) -> Result<Option<(i32, usize)>> {
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

    /// The base of the allocation (or mapping) holding `p`, None if `p` is not device memory.
    pub fn allocation_base(&self, p: DevPtr) -> Result<Option<DevPtr>> {
        self.make_current()?;
        Ok(query_extent(p).map(|(_, base, _)| base))
    }

    /// The driver's id of the allocation holding `p` (CU_POINTER_ATTRIBUTE_BUFFER_ID: unique
    /// for the process's lifetime), None if `p` is no memory the driver knows.
    pub fn allocation_id(&self, p: DevPtr) -> Result<Option<u64>> {
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

    pub fn ipc_handle(&self, p: DevPtr) -> Result<[u8; 64]> {
        self.make_current()?;
        let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: p is the base of an allocation of ours.
        check(
            unsafe { sys::cuIpcGetMemHandle(&mut h, p) },
            "cuIpcGetMemHandle",
        )?;
        Ok(h.reserved.map(|c| c as u8))
    }

    pub fn open_ipc(&self, handle: &[u8; 64]) -> Result<DevPtr> {
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

    pub fn close_ipc(&self, p: DevPtr) -> Result<()> {
        self.make_current()?;
        extent_cache::forget(p);
        // SAFETY: p came from open_ipc and is closed once.
        check(
            unsafe { sys::cuIpcCloseMemHandle(p) },
            "cuIpcCloseMemHandle",
        )
    }

    /// The kernel `name`; its module (every kernel has its own) is loaded on first use and
    /// kept: the build's SASS for this device where it has some, else the PTX, JIT-compiled
    /// by the driver.
    pub fn function(&self, name: &str) -> Result<usize> {
        if let Some(f) = self
            .functions
            .lock()
            .map_err(|_| Error::internal("kernel cache poisoned"))?
            .get(name)
        {
            return Ok(f.0 as usize);
        }
        self.make_current()?;
        let module = {
            let mut modules = self
                .modules
                .lock()
                .map_err(|_| Error::internal("module cache poisoned"))?;
            match modules.get(name) {
                Some(m) => m.0,
                None => {
                    let t0 = Instant::now();
                    // A kernel's first use may come inside a capture.
                    let _relaxed = RelaxedCapture::enter();
                    let (m, code) = match super::ptx::sass(self.sm, name) {
                        Some(cubin) => match self.load_module(&cubin, check_quiet) {
                            Ok(m) => (m, "SASS"),
                            Err(e) => {
                                log::info!("cuda: the SASS of {name} did not load ({e}); JIT-compiling its PTX");
                                (self.load_ptx(name)?, "PTX, JIT-compiled")
                            }
                        },
                        None => (self.load_ptx(name)?, "PTX, JIT-compiled"),
                    };
                    log::info!(
                        "cuda: loaded kernel module {name} ({code}) on device {} in {:.1} ms",
                        self.ordinal,
                        t0.elapsed().as_secs_f64() * 1e3
                    );
                    modules.insert(name.to_string(), Raw(m));
                    m
                }
            }
        };
        let cname = std::ffi::CString::new(name)
            .map_err(|_| Error::internal("kernel name holds a NUL byte"))?;
        let mut f = std::ptr::null_mut();
        // SAFETY: out-parameter; module is loaded.
        check(
            unsafe { sys::cuModuleGetFunction(&mut f, module, cname.as_ptr()) },
            &format!("cuModuleGetFunction({name})"),
        )?;
        self.functions
            .lock()
            .map_err(|_| Error::internal("kernel cache poisoned"))?
            .insert(name.to_string(), Raw(f));
        Ok(f as usize)
    }

    /// The module of kernel `name` cut from this device's PTX, JIT-compiled.
    fn load_ptx(&self, name: &str) -> Result<sys::CUmodule> {
        let Some(ptx) = super::ptx::for_arch(self.sm) else {
            super::ptx::check_built_for(self.sm)?;
            // SASS is compiled from the PTX the build embeds, so this cannot be.
            return Err(Error::internal(format!(
                "kernel {name}: SASS for sm_{} but no PTX",
                self.sm
            )));
        };
        let text = super::ptx::family(ptx, name);
        let c =
            std::ffi::CString::new(text).map_err(|_| Error::internal("PTX holds a NUL byte"))?;
        self.load_module(c.as_bytes_with_nul(), check)
    }

    /// Loads a module image: a cubin, or NUL-terminated PTX (JIT-compiled); `check` judges
    /// the result (quiet where a failure only declines the SASS, for the PTX to follow).
    fn load_module(
        &self,
        image: &[u8],
        check: fn(sys::CUresult, &str) -> Result<()>,
    ) -> Result<sys::CUmodule> {
        let mut m = std::ptr::null_mut();
        // Every launch of up to MAX_THREADS threads must fit the register file: the JIT's
        // limit is the one the build gave ptxas for the SASS (a test checks it is
        // 65536 / MAX_THREADS).
        let mut opts = [sys::CUjit_option::CU_JIT_MAX_REGISTERS];
        let mut vals = [crate::ptx::SASS_MAX_REGISTERS as usize as *mut c_void];
        // SAFETY: image is a whole cubin or NUL-terminated PTX text, alive for the call; one
        // option with its value.
        check(
            unsafe {
                sys::cuModuleLoadDataEx(
                    &mut m,
                    image.as_ptr() as *const c_void,
                    1,
                    opts.as_mut_ptr(),
                    vals.as_mut_ptr(),
                )
            },
            "cuModuleLoadDataEx",
        )?;
        Ok(m)
    }

    /// Launches `func` with one by-value parameter `arg` of `arg_bytes` bytes.
    pub fn launch(
        &self,
        func: usize,
        grid: u32,
        block: u32,
        stream: StreamHandle,
        arg: *const u8,
    ) -> Result<()> {
        self.make_current()?;
        let mut params = [arg as *mut c_void];
        // SAFETY: func is a kernel of this context taking one parameter, which `arg` points at.
        check(
            unsafe {
                sys::cuLaunchKernel(
                    func as sys::CUfunction,
                    grid,
                    1,
                    1,
                    block,
                    1,
                    1,
                    0,
                    stream.0 as sys::CUstream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            "cuLaunchKernel",
        )
    }

    pub fn stream_create(&self, blocking: bool) -> Result<StreamHandle> {
        self.make_current()?;
        let mut s = std::ptr::null_mut();
        // CU_STREAM_DEFAULT = 0 (ordered with the legacy stream), CU_STREAM_NON_BLOCKING = 1.
        let flags = if blocking { 0 } else { 1 };
        // SAFETY: out-parameter.
        check(
            unsafe { sys::cuStreamCreate(&mut s, flags) },
            "cuStreamCreate",
        )?;
        Ok(StreamHandle(s as u64))
    }

    pub fn stream_destroy(&self, s: StreamHandle) -> Result<()> {
        self.make_current()?;
        // SAFETY: s came from stream_create.
        check(
            unsafe { sys::cuStreamDestroy_v2(s.0 as sys::CUstream) },
            "cuStreamDestroy",
        )
    }

    pub fn stream_sync(&self, s: StreamHandle) -> Result<()> {
        self.make_current()?;
        // SAFETY: s is a stream of this context (or 0).
        check(
            unsafe { sys::cuStreamSynchronize(s.0 as sys::CUstream) },
            "cuStreamSynchronize",
        )
    }

    /// Waits for all work of this device's context.
    pub fn synchronize(&self) -> Result<()> {
        self.make_current()?;
        // SAFETY: our context is current; the call only waits.
        check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
    }

    /// Whether all work on `s` is done (without waiting).
    pub fn stream_query(&self, s: StreamHandle) -> Result<bool> {
        self.make_current()?;
        // SAFETY: s is a stream of this context (or 0).
        let r = unsafe { sys::cuStreamQuery(s.0 as sys::CUstream) };
        if r == sys::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check(r, "cuStreamQuery").map(|_| true)
    }

    pub fn event_create(&self) -> Result<u64> {
        self.event_create_flags(0)
    }

    /// An event for ordering only: recording it costs about 0.3 µs against 1.3 µs for a
    /// timing event (results/h200-driver-call-costs.txt), on every collective call.
    pub fn event_create_untimed(&self) -> Result<u64> {
        self.event_create_flags(2) // CU_EVENT_DISABLE_TIMING
    }

    fn event_create_flags(&self, flags: u32) -> Result<u64> {
        self.make_current()?;
        let mut e = std::ptr::null_mut();
        // SAFETY: out-parameter; flags are CUevent_flags bits.
        check(
            unsafe { sys::cuEventCreate(&mut e, flags) },
            "cuEventCreate",
        )?;
        Ok(e as u64)
    }

    pub fn event_record(&self, e: u64, s: StreamHandle) -> Result<()> {
        self.make_current()?;
        // SAFETY: e and s belong to this context.
        check(
            unsafe { sys::cuEventRecord(e as sys::CUevent, s.0 as sys::CUstream) },
            "cuEventRecord",
        )
    }

    /// Inside a capture: a record node (CU_EVENT_RECORD_EXTERNAL); each launch of the graph
    /// records `e` for waits outside it.
    pub fn event_record_external(&self, e: u64, s: StreamHandle) -> Result<()> {
        self.make_current()?;
        // SAFETY: e and s belong to this context; 1 = CU_EVENT_RECORD_EXTERNAL.
        check(
            unsafe { sys::cuEventRecordWithFlags(e as sys::CUevent, s.0 as sys::CUstream, 1) },
            "cuEventRecordWithFlags(EXTERNAL)",
        )
    }

    /// Inside a capture: a wait node (CU_EVENT_WAIT_EXTERNAL); each launch of the graph waits
    /// for `e`'s latest record, made outside the graph or by an earlier launch.
    pub fn stream_wait_event_external(&self, s: StreamHandle, e: u64) -> Result<()> {
        self.make_current()?;
        // SAFETY: s and e belong to this context; 1 = CU_EVENT_WAIT_EXTERNAL.
        check(
            unsafe { sys::cuStreamWaitEvent(s.0 as sys::CUstream, e as sys::CUevent, 1) },
            "cuStreamWaitEvent(EXTERNAL)",
        )
    }

    /// Work queued on `s` after this waits until `e` (recorded on any stream) has passed.
    pub fn stream_wait_event(&self, s: StreamHandle, e: u64) -> Result<()> {
        self.make_current()?;
        // SAFETY: s and e belong to this context.
        check(
            unsafe { sys::cuStreamWaitEvent(s.0 as sys::CUstream, e as sys::CUevent, 0) },
            "cuStreamWaitEvent",
        )
    }

    /// Whether event `e`'s latest record has happened (without waiting).
    pub fn event_query(&self, e: u64) -> Result<bool> {
        self.make_current()?;
        // SAFETY: e belongs to this context; the call only looks.
        let r = unsafe { sys::cuEventQuery(e as sys::CUevent) };
        if r == sys::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check(r, "cuEventQuery").map(|_| true)
    }

    pub fn event_sync(&self, e: u64) -> Result<()> {
        self.make_current()?;
        // SAFETY: e belongs to this context.
        check(
            unsafe { sys::cuEventSynchronize(e as sys::CUevent) },
            "cuEventSynchronize",
        )
    }

    pub fn event_elapsed_ms(&self, start: u64, end: u64) -> Result<f32> {
        self.make_current()?;
        let mut ms = 0f32;
        // SAFETY: both events belong to this context and have completed.
        check(
            unsafe { sys::cuEventElapsedTime(&mut ms, start as sys::CUevent, end as sys::CUevent) },
            "cuEventElapsedTime",
        )?;
        Ok(ms)
    }

    pub fn event_destroy(&self, e: u64) -> Result<()> {
        self.make_current()?;
        // SAFETY: e came from event_create.
        check(
            unsafe { sys::cuEventDestroy_v2(e as sys::CUevent) },
            "cuEventDestroy",
        )
    }

    /// Whether `s` is capturing into a CUDA graph (an invalidated capture counts: it still
    /// refuses what a live one refuses).
    pub fn stream_capturing(&self, s: StreamHandle) -> Result<bool> {
        self.make_current()?;
        let mut st = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: s is a stream of this context (or 0); out-parameter.
        check(
            unsafe { sys::cuStreamIsCapturing(s.0 as sys::CUstream, &mut st) },
            "cuStreamIsCapturing",
        )?;
        Ok(st != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// The id of the capture open on `s` and the graph it builds (an invalidated capture has
    /// none).
    fn capture_info(&self, s: StreamHandle) -> Result<Option<(u64, sys::CUgraph)>> {
        self.make_current()?;
        let mut st = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let (mut id, mut graph) = (0, std::ptr::null_mut());
        // SAFETY: s is a stream of this context (or 0); out-parameters, the optional
        // dependency outputs left out.
        check(
            unsafe {
                sys::cuStreamGetCaptureInfo_v2(
                    s.0 as sys::CUstream,
                    &mut st,
                    &mut id,
                    &mut graph,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            },
            "cuStreamGetCaptureInfo",
        )?;
        let active = st == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE;
        Ok((active && !graph.is_null()).then_some((id, graph)))
    }

    pub fn capture_id(&self, s: StreamHandle) -> Result<Option<u64>> {
        Ok(self.capture_info(s)?.map(|(id, _)| id))
    }

    /// Ties `release` to the graph the capture open on `s` builds, through a user object the
    /// graph owns: CUDA runs it once that graph and every executable graph made from it are
    /// destroyed. Not capturing: `release` comes back.
    pub fn on_graph_release(
        &self,
        s: StreamHandle,
        release: GraphRelease,
    ) -> Result<std::result::Result<(), GraphRelease>> {
        let Some((_, graph)) = self.capture_info(s)? else {
            return Ok(Err(release));
        };
        unsafe extern "C" fn run_release(p: *mut c_void) {
            // SAFETY: `p` is the box made below, given to this destructor alone, once.
            let f = unsafe { Box::from_raw(p as *mut GraphRelease) };
            f();
        }
        let p = Box::into_raw(Box::new(release)) as *mut c_void;
        let mut obj = std::ptr::null_mut();
        // SAFETY: `p` lives until the destructor takes it; CUDA requires the no-sync flag.
        let made = check(
            unsafe {
                sys::cuUserObjectCreate(
                    &mut obj,
                    p,
                    Some(run_release),
                    1,
                    sys::CUuserObject_flags::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC as u32,
                )
            },
            "cuUserObjectCreate",
        );
        if let Err(e) = made {
            // SAFETY: not given to CUDA: still ours alone.
            let f = unsafe { Box::from_raw(p as *mut GraphRelease) };
            drop(f);
            return Err(e);
        }
        // SAFETY: graph is the open capture's; our one reference moves to it.
        let moved = check(
            unsafe {
                sys::cuGraphRetainUserObject(
                    graph,
                    obj,
                    1,
                    sys::CUuserObjectRetain_flags::CU_GRAPH_USER_OBJECT_MOVE as u32,
                )
            },
            "cuGraphRetainUserObject",
        );
        if let Err(e) = moved {
            // Our reference is still ours: releasing it runs `release` now.
            // SAFETY: obj was created above with one reference.
            unsafe { sys::cuUserObjectRelease(obj, 1) };
            return Err(e);
        }
        Ok(Ok(()))
    }

    /// Starts capturing `s` into a graph (CUDA's default, global capture mode).
    pub fn capture_begin(&self, s: StreamHandle) -> Result<()> {
        self.make_current()?;
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
        // SAFETY: s is a stream of this context.
        check(
            unsafe { sys::cuStreamBeginCapture_v2(s.0 as sys::CUstream, mode) },
            "cuStreamBeginCapture",
        )
    }

    /// Ends the capture on `s` and instantiates it: (graph, executable graph).
    pub fn capture_end(&self, s: StreamHandle) -> Result<(u64, u64)> {
        self.make_current()?;
        let mut graph = std::ptr::null_mut();
        // SAFETY: s is capturing (else CUDA reports it); out-parameter.
        check(
            unsafe { sys::cuStreamEndCapture(s.0 as sys::CUstream, &mut graph) },
            "cuStreamEndCapture",
        )?;
        let mut exec = std::ptr::null_mut();
        // Another stream's capture may still be open (one per rank, ended one by one).
        let relaxed = RelaxedCapture::enter();
        // SAFETY: graph came from the capture just ended; out-parameter.
        let r = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
        drop(relaxed);
        if let Err(e) = check(r, "cuGraphInstantiate") {
            // SAFETY: graph is ours and instantiated nowhere.
            unsafe { sys::cuGraphDestroy(graph) };
            return Err(e);
        }
        Ok((graph as u64, exec as u64))
    }

    pub fn graph_launch(&self, exec: u64, s: StreamHandle) -> Result<()> {
        self.make_current()?;
        // SAFETY: exec came from capture_end and lives until graph_destroy.
        check(
            unsafe { sys::cuGraphLaunch(exec as sys::CUgraphExec, s.0 as sys::CUstream) },
            "cuGraphLaunch",
        )
    }

    pub fn graph_destroy(&self, graph: u64, exec: u64) -> Result<()> {
        self.make_current()?;
        // SAFETY: both came from capture_end and are destroyed once.
        check(
            unsafe { sys::cuGraphExecDestroy(exec as sys::CUgraphExec) },
            "cuGraphExecDestroy",
        )?;
        // SAFETY: as above.
        check(
            unsafe { sys::cuGraphDestroy(graph as sys::CUgraph) },
            "cuGraphDestroy",
        )
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

// ---- Multicast objects (NVLS). Reached only through `super::multicast`, which refuses
// unless the user set NCCL_NVLS_ENABLE to exactly 1 (and the communicator asks only then and
// where every rank's device reports multicast support): on the shared GPU hosts a multicast
// object can take the host's GPUs out of service, and those hosts keep the variable at 0.

/// Read-write access to a mapping for device `ordinal`.
fn access_desc(ordinal: i32) -> sys::CUmemAccessDesc {
    // SAFETY: plain C structs for which all zeroes is valid.
    let mut d: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
    d.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = ordinal;
    d.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    d
}

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
    offer: Option<super::fdpass::Offer>,
}

/// Bytes of a multicast handle: the creator's offer ([`super::fdpass::Ticket`]), then the
/// object's size; the rest is zero.
const MC_HANDLE_SIZE_AT: usize = super::fdpass::TICKET_BYTES;

/// The handle of a multicast object of `bytes` whose descriptor is on offer as `t`.
fn mc_handle(t: &super::fdpass::Ticket, bytes: usize) -> [u8; 64] {
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
/// claims. Taken from the creator's offer only ([`super::fdpass::take_offered`]: its own table,
/// or its descriptor socket, which answers processes of its user for keys it offers): the
/// handle's pid and descriptor number are never used with `pidfd_getfd`, so a member cannot
/// make a peer take a descriptor of another process.
fn mc_descriptor(h: &[u8; 64]) -> Result<(std::os::fd::OwnedFd, usize)> {
    let mut t = [0u8; super::fdpass::TICKET_BYTES];
    t.copy_from_slice(&h[..MC_HANDLE_SIZE_AT]);
    let t = super::fdpass::Ticket::decode(&t);
    let bytes = mc_handle_size(h);
    let fd = super::fdpass::take_offered(&t).map_err(|e| {
        Error::system(format!(
            "NVLS: taking rank 0's multicast object (process {}): {}",
            t.pid, e.message
        ))
    })?;
    Ok((fd, bytes))
}

impl Device {
    /// CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED.
    pub fn multicast_supported(&self) -> Result<bool> {
        Ok(self.attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED)? != 0)
    }

    fn mc_prop(ndev: usize, bytes: usize) -> sys::CUmulticastObjectProp {
        // SAFETY: a plain C struct for which all zeroes is valid.
        let mut p: sys::CUmulticastObjectProp = unsafe { std::mem::zeroed() };
        p.numDevices = ndev as u32;
        p.size = bytes;
        p.handleTypes =
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0 as u64;
        p
    }

    /// Device memory for a multicast binding (pinned, on this device).
    fn mc_mem_prop(&self) -> sys::CUmemAllocationProp {
        // SAFETY: a plain C struct for which all zeroes is valid.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = self.ordinal;
        prop
    }

    /// The granularity of a multicast object of `ndev` devices and `bytes` and of the memory
    /// bound to it: the larger of the multicast and the allocation minimum (both powers of
    /// two). The minimum, not the recommended one, which can be hundreds of MiB.
    pub fn multicast_granularity(&self, ndev: usize, bytes: usize) -> Result<usize> {
        self.make_current()?;
        let prop = Self::mc_prop(ndev, bytes);
        let mem = self.mc_mem_prop();
        let (mut g, mut a) = (0usize, 0usize);
        // SAFETY: out-parameters and filled property structs.
        unsafe {
            check(
                sys::cuMulticastGetGranularity(
                    &mut g,
                    &prop,
                    sys::CUmulticastGranularity_flags::CU_MULTICAST_GRANULARITY_MINIMUM,
                ),
                "cuMulticastGetGranularity",
            )?;
            check(
                sys::cuMemGetAllocationGranularity(
                    &mut a,
                    &mem,
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
                ),
                "cuMemGetAllocationGranularity",
            )?;
        }
        Ok(g.max(a).max(1))
    }

    /// cuMulticastCreate for `ndev` devices, exported as a file descriptor and put on offer
    /// ([`super::fdpass::offer`]); the handle other ranks import is that offer's ticket and
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
        let offer = super::fdpass::offer(fd);
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
    fn map_handle(
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
        let _one = super::super::fdpass::one_offering_test_at_a_time();
        let o = super::super::fdpass::offer(memfd(4096));
        let h = mc_handle(&o.ticket(), 4096);
        assert_eq!(mc_handle_size(&h), 4096);
        let (fd, bytes) = mc_descriptor(&h).expect("our own offer");
        assert_eq!(bytes, 4096);
        assert_eq!(super::super::fdpass::file_size(fd.as_fd()).unwrap(), 4096);
        // The old layout: (pid, descriptor number, size), here our parent's standard input.
        // SAFETY: getppid cannot fail.
        let parent = unsafe { libc::getppid() } as u32;
        let mut old = [0u8; 64];
        old[..4].copy_from_slice(&parent.to_le_bytes());
        old[8..16].copy_from_slice(&4096u64.to_le_bytes());
        let e = mc_descriptor(&old).expect_err("no pidfd_getfd on a peer's pid");
        assert!(e.message.contains("NVLS"), "{e}");
        let forged = super::super::fdpass::Ticket {
            pid: parent,
            fd: 0,
            ..o.ticket()
        };
        assert!(mc_descriptor(&mc_handle(&forged, 4096)).is_err());
        drop(o);
        assert!(mc_descriptor(&h).is_err(), "withdrawn");
    }
}
