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

impl Imp {
    /// The backend holding the device, as the operations both offer (`backend.rs`).
    fn backend(&self) -> &dyn backend::Backend {
        match self {
            Imp::Cuda(d) => d,
            Imp::Sim(d) => d,
        }
    }
}

/// Calls a method of [`backend::Backend`] on whichever backend holds the device.
macro_rules! dispatch {
    ($self:ident . $m:ident ( $($a:expr),* )) => {
        $self.imp.backend().$m($($a),*)
    };
}

mod backend;
mod graph;
// The build script makes the choice (build.rs includes this file); the library asks it only
// what to tell a device the build holds no kernels for.
#[cfg_attr(not(test), allow(dead_code))]
mod ptx_archs;
mod ptx_cut;
pub use graph::{Graph, GraphRelease};
pub(crate) mod module;
pub use module::Module;
pub(crate) mod multicast;
pub(crate) use multicast::Multicast;
mod owned;
pub use owned::*;
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
    /// Where the device memory allocated through this handle (and its clones) is counted
    /// while it lives: a communicator's ([`Device::counted`]).
    ledger: Option<Arc<std::sync::atomic::AtomicUsize>>,
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
            ledger: None,
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

    /// This device with a ledger of its own: the bytes of device memory allocated through
    /// the handle returned (and its clones) and not yet freed are counted in the ledger.
    pub(crate) fn counted(&self) -> (Device, Arc<std::sync::atomic::AtomicUsize>) {
        let ledger = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let d = Device {
            ledger: Some(ledger.clone()),
            ..self.clone()
        };
        (d, ledger)
    }

    /// This device without a ledger.
    pub(crate) fn uncounted(&self) -> Device {
        Device {
            ledger: None,
            ..self.clone()
        }
    }

    /// Counts `bytes` allocated (`more`) or freed in the ledger, if this handle has one.
    fn book(&self, bytes: usize, more: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        if let Some(l) = &self.ledger {
            match more {
                true => l.fetch_add(bytes, Relaxed),
                false => l.fetch_sub(bytes, Relaxed),
            };
        }
    }

    /// Whether it is a simulated device.
    pub fn is_sim(&self) -> bool {
        matches!(*self.imp, Imp::Sim(_))
    }

    /// Launches a kernel written in Rust with the device API (`nccl_device::api`) on the
    /// simulator: `body` runs once per thread of a grid of `grid` CTAs of `block` threads, each
    /// a host thread, in `stream`'s order, with `nccl_device::arch`'s thread and CTA indices
    /// set. A panic in it is the stream's error. For tests of closures; a kernel that runs on
    /// GPUs too is launched through [`Module::launch`] (on a GPU this is ncclInvalidUsage).
    pub fn launch_on_simulator(
        &self,
        grid: u32,
        block: u32,
        stream: StreamHandle,
        body: impl Fn() + Send + Sync + 'static,
    ) -> Result<()> {
        if grid == 0 || !(1..=1024).contains(&block) {
            return Err(Error::invalid_argument(format!(
                "a grid of {grid} CTAs of {block} threads (1 to 1024 threads, at least one CTA)"
            )));
        }
        match &*self.imp {
            Imp::Sim(d) => d.launch_body(grid, block, stream, Arc::new(body)),
            Imp::Cuda(_) => Err(Error::invalid_usage(
                "launch_on_simulator: this device is a GPU; a kernel of the device API runs on \
                 GPUs from a PTX module (nccl::Module, nccl_device::kernel!)",
            )),
        }
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
        /// Loads, once per device and process, the kernels a communicator may launch: those
        /// whose SASS the build embedded, and those NCCL_RS_PRELOAD_KERNELS names (JIT-compiled
        /// from their PTX); none with NCCL_RS_PRELOAD_KERNELS=0. Loading one later (a module,
        /// and the local memory it needs) makes CUDA wait for every kernel running on the
        /// device, and a wait held by peers — a `ncclWaitSignal` whose signals follow a
        /// collective this rank has yet to launch — then never ends. NCCL loads its kernels at
        /// init; here that costs 3–4 ms per kernel, so it is done where such waits become
        /// possible: a communicator's first window, and its device communicator.
        fn preload_kernels(&self) -> Result<usize> {
            let wanted = crate::env::RS_PRELOAD_KERNELS.raw().unwrap_or_default();
            if wanted.trim() == "0" {
                return Ok(0);
            }
            let prefixes: Vec<&str> = wanted
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .collect();
            let jit = |name: &str| {
                prefixes
                    .iter()
                    .any(|&p| p == "all" || name.starts_with(p))
            };
            let mut names: Vec<&str> = nccl_device::kernel_set::BUILT.to_vec();
            names.push(nccl_device::abi::WAIT_SIGNALS_ENTRY);
            dispatch!(self.preload(&names, &jit))
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
            dispatch!(self.launch(
                kernel.0,
                grid,
                block,
                stream,
                arg as *const A as *const u8,
                std::mem::size_of::<A>()
            ))
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
        /// Writes `value` to the 8 bytes at `addr` in `s`'s order, after a fence: the
        /// stream's earlier writes are visible first (no kernel, no SM).
        fn write_value64(&self, s: StreamHandle, addr: DevPtr, value: u64) -> Result<()> {
            dispatch!(self.write_value64(s, addr, value))
        }
    }
    crate::internal! {
        /// Holds `s` until the 8 bytes at `addr` hold at least `value` (no kernel, no SM).
        fn wait_value64(&self, s: StreamHandle, addr: DevPtr, value: u64) -> Result<()> {
            dispatch!(self.wait_value64(s, addr, value))
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
            dispatch!(self.event_create_untimed())
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
