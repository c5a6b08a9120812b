//! What a backend offers, as traits: the CUDA driver (`driver::Device`) and the simulator
//! (`sim::Device`) implement every one, so the compiler checks that the two offer the same
//! operations, and [`super::Device`] calls them through `&dyn Backend`. One trait per seam, and
//! each backend keeps each seam's implementation in a file of that name (`driver/streams.rs`,
//! `sim/streams.rs`, ...).
//!
//! Left out, on purpose: opening a device (each backend's constructor), operations between two
//! objects of one backend (peer access, multicast objects: matched pairwise in `mod.rs` and
//! `multicast.rs`), and what one backend alone has (DMA-BUF export, the simulator's adjacent VMM
//! allocations and counters).

use super::{DevPtr, DeviceProps, GraphRelease, StreamHandle};
use crate::error::Result;
use std::os::fd::{BorrowedFd, OwnedFd};

/// Every seam: what `super::Device` needs of a backend.
pub(crate) trait Backend:
    Context + Memory + Sharing + Suspending + Streams + Capture + Kernels
{
}

impl<T: Context + Memory + Sharing + Suspending + Streams + Capture + Kernels> Backend for T {}

/// The device itself: making it current, what it is, waiting for it.
pub(crate) trait Context: Send + Sync {
    /// Makes the device current for the calling thread (`cudaSetDevice`).
    fn make_current(&self) -> Result<()>;
    /// Name, bus id, compute capability and SM count.
    fn props(&self) -> Result<DeviceProps>;
    /// (free, total) bytes of device memory.
    fn mem_info(&self) -> Result<(usize, usize)>;
    /// Waits until every stream of the device is idle (`cuCtxSynchronize`).
    fn synchronize(&self) -> Result<()>;
    /// Whether the device can take part in multicast objects (NVLS).
    fn multicast_supported(&self) -> Result<bool>;
    /// The granularity of a multicast object over `ndev` devices holding `bytes`.
    fn multicast_granularity(&self, ndev: usize, bytes: usize) -> Result<usize>;
}

/// Device and host memory of this process: allocation, copies, and what a pointer is.
pub(crate) trait Memory {
    /// `bytes` of zeroed device memory (at least 1).
    fn alloc(&self, bytes: usize) -> Result<DevPtr>;
    /// Frees what [`Memory::alloc`] gave.
    fn free(&self, p: DevPtr) -> Result<()>;
    /// `bytes` of zeroed pinned host memory, and its address on the device.
    fn alloc_host_mapped(&self, bytes: usize) -> Result<(*mut u8, DevPtr)>;
    /// Frees what [`Memory::alloc_host_mapped`] gave.
    fn free_host_mapped(&self, host: *mut u8) -> Result<()>;
    /// Pins `bytes` of host memory at `host` and maps them for the device.
    fn host_register(&self, host: *mut u8, bytes: usize) -> Result<DevPtr>;
    /// Undoes [`Memory::host_register`].
    fn host_unregister(&self, host: *mut u8) -> Result<()>;
    /// Copies `src` to the device address `dst`, after the legacy stream's work.
    fn copy_htod(&self, dst: DevPtr, src: &[u8]) -> Result<()>;
    /// Copies `dst.len()` bytes from the device address `src`.
    fn copy_dtoh(&self, dst: &mut [u8], src: DevPtr) -> Result<()>;
    /// Copies `bytes` between device addresses, in `stream`'s order.
    fn copy_dtod_async(
        &self,
        dst: DevPtr,
        src: DevPtr,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()>;
    /// The device owning `p` and the bytes of its allocation from `p` on (VMM mappings
    /// followed until `need` bytes are covered), or None for memory the backend does not know.
    fn pointer_extent(&self, p: DevPtr, need: usize) -> Result<Option<(i32, usize)>>;
    /// The base of the allocation holding `p`.
    fn allocation_base(&self, p: DevPtr) -> Result<Option<DevPtr>>;
    /// An id of the allocation holding `p`, never reused in the process.
    fn allocation_id(&self, p: DevPtr) -> Result<Option<u64>>;
}

/// Memory shared between processes: IPC handles, and the virtual memory API's allocations with
/// their file descriptors.
pub(crate) trait Sharing {
    /// A handle another process opens to map the allocation at `p` (`cuIpcGetMemHandle`).
    fn ipc_handle(&self, p: DevPtr) -> Result<[u8; 64]>;
    /// Maps a peer process's allocation by its IPC handle.
    fn open_ipc(&self, handle: &[u8; 64]) -> Result<DevPtr>;
    /// Unmaps what [`Sharing::open_ipc`] mapped.
    fn close_ipc(&self, p: DevPtr) -> Result<()>;
    /// `bytes` (rounded up to the granularity, the multicast one too where `multicast` and NVLS
    /// may be used) through the virtual memory API, exportable as a file descriptor: the
    /// address and the bytes mapped.
    fn alloc_vmm(&self, bytes: usize, multicast: bool) -> Result<(DevPtr, usize)>;
    /// The VMM allocation holding `p`: (base, bytes, its descriptor, a handle to release),
    /// or None, quietly, for other memory.
    fn vmm_export(&self, p: DevPtr) -> Result<Option<(DevPtr, usize, OwnedFd, u64)>>;
    /// Releases the handle [`Sharing::vmm_export`] gave.
    fn vmm_export_release(&self, handle: u64) -> Result<()>;
    /// Maps `bytes` of a peer's VMM allocation from its descriptor: (address, handle).
    fn vmm_import(&self, fd: BorrowedFd<'_>, bytes: usize) -> Result<(DevPtr, u64)>;
    /// Unmaps what [`Sharing::vmm_import`] mapped.
    fn vmm_unmap(&self, ptr: DevPtr, bytes: usize, handle: u64) -> Result<()>;
}

/// The physical memory behind VMM mappings released and regained while their address ranges
/// stay reserved (`ncclCommSuspend` / `ncclCommResume`): kernels, graphs and peers keep the
/// addresses they hold. Between the two, the range is mapped to nothing, and any access faults.
pub(crate) trait Suspending {
    /// Releases the memory of [`Sharing::alloc_vmm`]'s allocation at `p` (the whole of it).
    fn vmm_evict(&self, p: DevPtr) -> Result<()>;
    /// New memory (its contents undefined) for the evicted allocation at `p`, mapped where it
    /// was, with the access it had.
    fn vmm_restore(&self, p: DevPtr) -> Result<()>;
    /// Unmaps and releases the peer's allocation [`Sharing::vmm_import`] mapped at `p`.
    fn vmm_detach(&self, p: DevPtr, bytes: usize) -> Result<()>;
    /// Maps the peer's allocation behind descriptor `fd` at `p`, where a detached mapping of
    /// `bytes` was.
    fn vmm_reattach(&self, fd: BorrowedFd<'_>, p: DevPtr, bytes: usize) -> Result<()>;
}

/// Streams and events.
pub(crate) trait Streams {
    /// A stream; `blocking`: ordered with the legacy default stream both ways.
    fn stream_create(&self, blocking: bool) -> Result<StreamHandle>;
    /// Destroys a stream; queued work still runs.
    fn stream_destroy(&self, s: StreamHandle) -> Result<()>;
    /// Waits until the work queued on `s` has run.
    fn stream_sync(&self, s: StreamHandle) -> Result<()>;
    /// Whether the work queued on `s` has run, without waiting.
    fn stream_query(&self, s: StreamHandle) -> Result<bool>;
    /// Writes `value` to the 8 bytes at `addr` in `s`'s order, after a fence: the stream's
    /// earlier writes (copies included) are visible before it (`cuStreamWriteValue64`).
    fn write_value64(&self, s: StreamHandle, addr: DevPtr, value: u64) -> Result<()>;
    /// Holds `s` until the 8 bytes at `addr` hold at least `value` (`cuStreamWaitValue64`,
    /// GEQ): work queued after it starts only then.
    fn wait_value64(&self, s: StreamHandle, addr: DevPtr, value: u64) -> Result<()>;
    /// A timing event.
    fn event_create(&self) -> Result<u64>;
    /// An event that orders work but cannot time it (where the backend tells them apart).
    fn event_create_untimed(&self) -> Result<u64> {
        self.event_create()
    }
    /// Records `e` on `s`.
    fn event_record(&self, e: u64, s: StreamHandle) -> Result<()>;
    /// Inside a capture: each launch of the graph records `e`.
    fn event_record_external(&self, e: u64, s: StreamHandle) -> Result<()>;
    /// Later work on `s` waits for `e`.
    fn stream_wait_event(&self, s: StreamHandle, e: u64) -> Result<()>;
    /// Inside a capture: each launch of the graph waits for `e`'s latest record then.
    fn stream_wait_event_external(&self, s: StreamHandle, e: u64) -> Result<()>;
    /// Whether `e` has happened, without waiting.
    fn event_query(&self, e: u64) -> Result<bool>;
    /// Waits for `e`.
    fn event_sync(&self, e: u64) -> Result<()>;
    /// Milliseconds between two recorded timing events.
    fn event_elapsed_ms(&self, start: u64, end: u64) -> Result<f32>;
    /// Destroys `e`.
    fn event_destroy(&self, e: u64) -> Result<()>;
}

/// Stream capture into graphs, and the graphs.
pub(crate) trait Capture {
    /// Whether `s` is capturing.
    fn stream_capturing(&self, s: StreamHandle) -> Result<bool>;
    /// The id of the capture `s` is in, if any.
    fn capture_id(&self, s: StreamHandle) -> Result<Option<u64>>;
    /// Hands `release` to the graph `s` is capturing, to run when the graph is destroyed;
    /// gives it back where `s` is not capturing.
    fn on_graph_release(
        &self,
        s: StreamHandle,
        release: GraphRelease,
    ) -> Result<std::result::Result<(), GraphRelease>>;
    /// Starts capturing `s`.
    fn capture_begin(&self, s: StreamHandle) -> Result<()>;
    /// Ends the capture of `s`: (graph, executable graph).
    fn capture_end(&self, s: StreamHandle) -> Result<(u64, u64)>;
    /// Launches an executable graph on `s`.
    fn graph_launch(&self, exec: u64, s: StreamHandle) -> Result<()>;
    /// Destroys a graph and its executable.
    fn graph_destroy(&self, graph: u64, exec: u64) -> Result<()>;
}

/// The kernels: finding one, launching it.
pub(crate) trait Kernels {
    /// The kernel `name`, loaded on first use.
    fn function(&self, name: &str) -> Result<usize>;
    /// Loads each of `names` now, where its SASS for this device is embedded or `jit` says
    /// to JIT-compile its PTX, then reserves the local memory the largest loaded needs: how
    /// many were loaded (`Device::preload_kernels` says why).
    fn preload(&self, names: &[&str], jit: &dyn Fn(&str) -> bool) -> Result<usize>;
    /// Launches `func` on `grid` CTAs of `block` threads with one by-value parameter of
    /// `arg_bytes` bytes at `arg`.
    fn launch(
        &self,
        func: usize,
        grid: u32,
        block: u32,
        stream: StreamHandle,
        arg: *const u8,
        arg_bytes: usize,
    ) -> Result<()>;
}
