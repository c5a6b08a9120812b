//! The CPU simulator backend: device memory is host memory (POSIX shared memory, so that
//! simulated GPUs in other processes can map it like CUDA IPC), a stream is a worker thread
//! running its queue in order, and a kernel launch runs the real `nccl-device` kernels, each
//! CTA a group of host threads (`nccl_device::arch::sim`).

use super::backend::{Capture, Context, Kernels, Memory, Sharing, Streams};
use super::{DevPtr, DeviceProps, GraphRelease, StreamHandle};
use crate::error::{Error, Result};
use nccl_device::abi::{CollArgs, P2pArgs};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Instant;

// One file per seam of `super::backend` (each holds that trait's implementation).
mod capture;
mod context;
mod kernels;
mod memory;
mod multicast;
mod sharing;
mod streams;
mod suspend;

pub use multicast::*;

/// Simulated GPUs in the process: `NCCL_RS_SIM_DEVICES`, 8 by default.
pub fn device_count() -> usize {
    crate::env::RS_SIM_DEVICES.int().max(0) as usize
}

std::thread_local! {
    static CURRENT: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
}

pub fn current_ordinal() -> i32 {
    CURRENT.with(|c| c.get())
}

std::thread_local! {
    /// Whether this thread's capture mode is relaxed (CUDA's default is global).
    static RELAXED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The simulator's `cuThreadExchangeStreamCaptureMode(RELAXED)`, undone on drop.
pub(crate) struct RelaxedCapture(bool);

impl RelaxedCapture {
    pub(crate) fn enter() -> RelaxedCapture {
        RelaxedCapture(RELAXED.with(|r| r.replace(true)))
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        RELAXED.with(|r| r.set(self.0));
    }
}

/// Invalidates the open captures of the streams `which` picks; whether there were any.
fn invalidate_captures(which: impl Fn(&Stream) -> bool) -> bool {
    let capturing: Vec<Arc<Stream>> = lock(registry())
        .streams
        .values()
        .filter(|st| st.capturing() && which(st))
        .cloned()
        .collect();
    for st in &capturing {
        st.invalidated.store(true, Ordering::SeqCst);
    }
    !capturing.is_empty()
}

/// One piece of simulated device memory.
struct Region {
    bytes: usize,
    /// Unique among the process's regions, as CUDA's buffer ids are.
    id: u64,
    ordinal: i32,
    /// The shared-memory name, for allocations we own (None for mappings of a peer's and
    /// for VMM allocations).
    name: Option<String>,
    /// A VMM allocation's memfd, its shareable handle (as `cuMemCreate` with a POSIX
    /// descriptor handle type gives one); None for every other region.
    vmm_fd: Option<std::os::fd::OwnedFd>,
    /// A VMM allocation evicted, or a peer's detached (`suspend.rs`): its range holds no
    /// memory until restored or reattached.
    parked: bool,
}

/// The next region's [`Region::id`].
static REGION_IDS: AtomicU64 = AtomicU64::new(1);

fn regions() -> &'static Mutex<BTreeMap<u64, Region>> {
    static R: OnceLock<Mutex<BTreeMap<u64, Region>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(BTreeMap::new()))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Maps the shared-memory object `name` (creating it with `bytes` when `create`). `None`:
/// `create` was asked and the name is taken.
/// Maps the shared-memory object `name` whole (created with `bytes` when `create`): its address
/// and its real size, or None when `create` found the name taken.
fn map_shm(name: &str, bytes: usize, create: bool) -> Result<Option<(u64, usize)>> {
    let c =
        std::ffi::CString::new(name).map_err(|_| Error::internal("shm name holds a NUL byte"))?;
    let flags = if create {
        libc::O_CREAT | libc::O_EXCL | libc::O_RDWR
    } else {
        libc::O_RDWR
    };
    // SAFETY: plain system calls on a name we own; every result is checked.
    unsafe {
        let fd = libc::shm_open(c.as_ptr(), flags, 0o600);
        if fd < 0
            && create
            && std::io::Error::last_os_error().kind() == std::io::ErrorKind::AlreadyExists
        {
            return Ok(None);
        }
        if fd < 0 {
            return Err(Error::system(format!(
                "shm_open({name}): {}",
                std::io::Error::last_os_error()
            )));
        }
        let len = bytes.max(1);
        if create && libc::ftruncate(fd, len as libc::off_t) != 0 {
            let e = std::io::Error::last_os_error();
            libc::close(fd);
            libc::shm_unlink(c.as_ptr());
            return Err(Error::system(format!("ftruncate({name}, {len}): {e}")));
        }
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 {
            libc::close(fd);
            return Err(Error::system(format!(
                "fstat({name}): {}",
                std::io::Error::last_os_error()
            )));
        }
        let size = st.st_size as usize;
        let p = libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        );
        libc::close(fd);
        if p == libc::MAP_FAILED {
            return Err(Error::system(format!(
                "mmap({name}, {size}): {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(Some((p as u64, size)))
    }
}

/// Maps `bytes` of the file behind `fd` shared, readable and writable.
///
/// # Safety
/// `fd` is a live descriptor of a file of at least `bytes`.
unsafe fn map_fd(fd: i32, bytes: usize) -> Result<u64> {
    // SAFETY: as the caller promises; the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Error::system(format!(
            "mmap of {bytes} bytes: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(p as u64)
}

/// Kernels the simulator knows, by PTX entry-point name, with their parameter type.
#[derive(Clone, Copy)]
enum Entry {
    Coll(unsafe fn(&CollArgs)),
    P2p(unsafe fn(&P2pArgs)),
    Wait(unsafe fn(&nccl_device::abi::WaitArgs)),
}

fn kernel_table() -> &'static (Vec<Entry>, HashMap<String, usize>) {
    static T: OnceLock<(Vec<Entry>, HashMap<String, usize>)> = OnceLock::new();
    T.get_or_init(|| {
        let mut fns: Vec<Entry> = Vec::new();
        let mut names = HashMap::new();
        nccl_device::sim_kernels::each_coll_kernel(&mut |name, f| {
            names.insert(name.to_string(), fns.len());
            fns.push(Entry::Coll(f));
        });
        if let Some((p2p, f)) = nccl_device::sim_kernels::P2P_KERNEL {
            names.insert(p2p.to_string(), fns.len());
            fns.push(Entry::P2p(f));
        }
        let (wait, f) = nccl_device::sim_kernels::WAIT_KERNEL;
        names.insert(wait.to_string(), fns.len());
        fns.push(Entry::Wait(f));
        (fns, names)
    })
}

type Job = Box<dyn FnOnce() -> std::result::Result<(), String> + Send>;
/// A node of a graph: issuing it (when the graph is launched, or at once outside a capture)
/// gives the job the stream runs. Issue time matters to events: an external record counts as
/// the event's latest record from the launch on, and an external wait targets the latest
/// record at the launch.
type Replayable = Arc<dyn Fn() -> Job + Send + Sync>;

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    submitted: u64,
    done: u64,
    /// The first failure (a kernel trap), reported by every later sync.
    error: Option<String>,
    /// Destroyed: the worker ends once the queue is empty.
    closed: bool,
}

/// An in-order queue of work, run by its own thread.
struct Stream {
    q: Mutex<Queue>,
    cv: Condvar,
    /// The launches captured so far while a graph capture is open on this stream.
    capture: Mutex<Option<Vec<Replayable>>>,
    /// Set when legacy-stream work joined the open capture implicitly: ending it fails.
    invalidated: AtomicBool,
    /// The open capture's id and what runs when the graph it makes is gone.
    capture_extra: Mutex<(u64, Vec<GraphRelease>)>,
    /// The device whose stream this is.
    ordinal: i32,
    /// Ordered with the legacy stream both ways (CUDA's default stream flags).
    blocking: bool,
}

/// CUDA's answers to what a capture forbids, worded as the simulator gives them.
const CAPTURE_UNSUPPORTED: &str =
    "not permitted while the stream is capturing a graph (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)";
const CAPTURED_EVENT: &str =
    "not permitted on an event last recorded in a capturing stream (CUDA_ERROR_CAPTURED_EVENT)";
const CAPTURE_IMPLICIT: &str = "legacy-stream work while a blocking stream of the device captures a graph (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)";
const CAPTURE_INVALIDATED: &str =
    "the capture was invalidated by an earlier error (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)";
const CAPTURE_ISOLATION: &str = "a capturing stream cannot wait for work outside its capture (CUDA_ERROR_STREAM_CAPTURE_ISOLATION)";

impl Stream {
    fn start(ordinal: i32, blocking: bool) -> Arc<Stream> {
        let s = Arc::new(Stream {
            q: Mutex::new(Queue::default()),
            cv: Condvar::new(),
            capture: Mutex::new(None),
            invalidated: AtomicBool::new(false),
            capture_extra: Mutex::new((0, Vec::new())),
            ordinal,
            blocking,
        });
        let w = s.clone();
        std::thread::Builder::new()
            .name("sim-stream".into())
            .spawn(move || w.work())
            .expect("nccl-rs sim: cannot start a stream thread");
        s
    }

    fn work(&self) {
        loop {
            let job = {
                let mut q = lock(&self.q);
                loop {
                    if let Some(j) = q.jobs.pop_front() {
                        break j;
                    }
                    if q.closed {
                        return;
                    }
                    q = self.cv.wait(q).unwrap_or_else(|p| p.into_inner());
                }
            };
            let failed = lock(&self.q).error.is_some();
            let r = if failed { Ok(()) } else { job() };
            let mut q = lock(&self.q);
            if let Err(e) = r {
                q.error.get_or_insert(e);
            }
            q.done += 1;
            self.cv.notify_all();
        }
    }

    fn push(&self, job: Job) {
        let mut q = lock(&self.q);
        q.jobs.push_back(job);
        q.submitted += 1;
        self.cv.notify_all();
    }

    fn capturing(&self) -> bool {
        lock(&self.capture).is_some()
    }

    /// Issues `node` in stream order, or adds it to the open capture.
    fn push_replayable(&self, node: Replayable) {
        if let Some(c) = lock(&self.capture).as_mut() {
            c.push(node);
            return;
        }
        self.push(node());
    }

    fn refuse_if_capturing(&self, what: &str) -> Result<()> {
        match self.capturing() {
            true => Err(Error::cuda(format!("{what}: {CAPTURE_UNSUPPORTED}"))),
            false => Ok(()),
        }
    }

    fn sync(&self) -> Result<()> {
        self.refuse_if_capturing("stream synchronize")?;
        let mut q = lock(&self.q);
        let target = q.submitted;
        while q.done < target {
            q = self.cv.wait(q).unwrap_or_else(|p| p.into_inner());
        }
        match &q.error {
            Some(e) => Err(Error::cuda(format!("simulated kernel failed: {e}"))),
            None => Ok(()),
        }
    }

    fn idle(&self) -> Result<bool> {
        self.refuse_if_capturing("stream query")?;
        let q = lock(&self.q);
        match &q.error {
            Some(e) => Err(Error::cuda(format!("simulated kernel failed: {e}"))),
            None => Ok(q.done == q.submitted),
        }
    }
}

#[derive(Default)]
struct Event {
    state: Mutex<EventState>,
}

/// Records are numbered; a wait or sync targets the latest record issued when it was called
/// (as cuStreamWaitEvent captures the event's state at the call), not a later one.
#[derive(Default)]
struct EventState {
    issued: u64,
    done: u64,
    /// When the latest completed record passed.
    at: Option<Instant>,
    /// The stream (by address) whose capture holds the latest record, if it was captured.
    captured_on: Option<usize>,
}

/// Issues a record of `ev`: from now on its latest; the job marks it passed.
fn issue_record(ev: &Arc<Event>) -> Job {
    let gen = {
        let mut st = lock(&ev.state);
        st.issued += 1;
        st.captured_on = None;
        st.issued
    };
    let ev = ev.clone();
    Box::new(move || {
        let mut st = lock(&ev.state);
        st.done = st.done.max(gen);
        st.at = Some(Instant::now());
        Ok(())
    })
}

/// Issues a wait for `ev`'s latest record so far.
fn issue_wait(ev: &Arc<Event>) -> Job {
    let target = lock(&ev.state).issued;
    let ev = ev.clone();
    Box::new(move || {
        ev.wait_for(target);
        Ok(())
    })
}

impl Event {
    fn wait_for(&self, target: u64) {
        while lock(&self.state).done < target {
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
    }
}

struct Registry {
    streams: HashMap<u64, Arc<Stream>>,
    events: HashMap<u64, Arc<Event>>,
    graphs: HashMap<u64, Arc<Vec<Replayable>>>,
    /// What runs when each graph is destroyed.
    graph_releases: HashMap<u64, Vec<GraphRelease>>,
}

fn registry() -> &'static Mutex<Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(|| {
        Mutex::new(Registry {
            streams: HashMap::new(),
            events: HashMap::new(),
            graphs: HashMap::new(),
            graph_releases: HashMap::new(),
        })
    })
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Every `flags` word the collective and the point-to-point kernels were launched with in this
/// process, OR-ed ([`launched_flags`]).
static COLL_FLAGS: AtomicU32 = AtomicU32::new(0);
static P2P_FLAGS: AtomicU32 = AtomicU32::new(0);
/// Kernel launches (and their replays' captures) in this process ([`launch_count`]).
static LAUNCHES: AtomicU64 = AtomicU64::new(0);
static NVLS_LAUNCHES: AtomicU64 = AtomicU64::new(0);

/// Collective launches with the NVLS algorithm so far in this process (tests check which
/// calls ran on the switch and which fell back).
pub fn nvls_launches() -> u64 {
    NVLS_LAUNCHES.load(Ordering::Relaxed)
}

static VMM_IMPORTS: AtomicU64 = AtomicU64::new(0);

/// How many peer processes' VMM allocations this process mapped from their descriptors so far
/// (tests check that registered `ncclMemAlloc` buffers took that path).
pub fn vmm_imports() -> u64 {
    VMM_IMPORTS.load(Ordering::Relaxed)
}

/// The allocation granularity the simulator's `alloc_vmm` rounds to (the driver's
/// recommended one on current GPUs).
pub const SIM_VMM_GRANULARITY: usize = 2 << 20;

/// How many kernels this process launched or captured on the simulator so far: tests check
/// with it that a path launches nothing.
pub fn launch_count() -> u64 {
    LAUNCHES.load(Ordering::Relaxed)
}

/// The kernel flags (`FLAG_*`) some collective launch and some point-to-point launch on the
/// simulator carried so far in this process: tests check with it that a setting reached the
/// kernels.
pub fn launched_flags() -> (u32, u32) {
    (
        COLL_FLAGS.load(Ordering::Relaxed),
        P2P_FLAGS.load(Ordering::Relaxed),
    )
}

/// Removes the regions of simulator processes that died without freeing them (a killed test
/// leaves its device memory in /dev/shm, where it holds RAM until reboot). A region belongs to
/// the pid in its name; one whose process no longer exists is unlinked. Only regions of our own
/// pid namespace are judged: containers sharing one /dev/shm see each other's pids as dead.
/// Names of older builds carry no namespace, so they are never judged (they may be alive in
/// another container; remove them by hand).
fn sweep_dead_regions() {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    let mut swept = 0usize;
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some((pid, ns)) = region_owner(&name.to_string_lossy()) else {
            continue;
        };
        if ns != Some(pid_namespace()) {
            continue;
        }
        // SAFETY: signal 0 only asks whether the process exists.
        let gone = unsafe { libc::kill(pid as libc::pid_t, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            if let Ok(c) = std::ffi::CString::new(format!("/{}", name.to_string_lossy())) {
                // SAFETY: unlinking a name; the memory goes once no one maps it.
                if unsafe { libc::shm_unlink(c.as_ptr()) } == 0 {
                    swept += 1;
                }
            }
        }
    }
    if swept > 0 {
        log::info!("simulator: removed {swept} regions of processes that no longer exist");
    }
}

/// The pid and pid namespace in a region name `ncclrs-<pid>@<namespace>-…` (names of older
/// builds have no namespace).
fn region_owner(name: &str) -> Option<(u32, Option<u64>)> {
    let owner = name.strip_prefix("ncclrs-")?.split('-').next()?;
    Some(match owner.split_once('@') {
        Some((pid, ns)) => (pid.parse().ok()?, Some(ns.parse().ok()?)),
        None => (owner.parse().ok()?, None),
    })
}

/// The inode of this process's pid namespace (0 where /proc does not say).
pub(crate) fn pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    static NS: OnceLock<u64> = OnceLock::new();
    *NS.get_or_init(|| {
        std::fs::metadata("/proc/self/ns/pid")
            .map(|m| m.ino())
            .unwrap_or(0)
    })
}

/// Whether `name` has the form `alloc` gives a region: `/ncclrs-<pid>@<pid namespace>-<nonce
/// in hex>-<n>`.
fn is_region_name(name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let Some(rest) = name.strip_prefix("/ncclrs-") else {
        return false;
    };
    let Some((pid, rest)) = rest.split_once('@') else {
        return false;
    };
    let mut parts = rest.split('-');
    let (ns, nonce, n) = (parts.next(), parts.next(), parts.next());
    digits(pid)
        && ns.is_some_and(digits)
        && nonce.is_some_and(|x| !x.is_empty() && x.bytes().all(|b| b.is_ascii_hexdigit()))
        && n.is_some_and(digits)
        && parts.next().is_none()
}

/// A per-process number in every region name, so that names differ from those a process
/// with a recycled pid left behind.
fn process_nonce() -> u32 {
    static N: OnceLock<u32> = OnceLock::new();
    *N.get_or_init(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() ^ d.as_secs() as u32)
            .unwrap_or(0);
        t ^ (&N as *const _ as usize as u32).rotate_left(16)
    })
}

pub struct Device {
    pub ordinal: i32,
    /// The legacy default stream (handle 0) of this device.
    default_stream: Arc<Stream>,
}

impl Device {
    pub fn open(ordinal: i32) -> Result<Device> {
        static SWEEP: std::sync::Once = std::sync::Once::new();
        SWEEP.call_once(sweep_dead_regions);
        let n = device_count();
        if ordinal < 0 || ordinal as usize >= n {
            return Err(Error::invalid_argument(format!(
                "simulated device {ordinal} does not exist ({n} simulated; NCCL_RS_SIM_DEVICES sets how many)"
            )));
        }
        Ok(Device {
            ordinal,
            default_stream: Stream::start(ordinal, false),
        })
    }

    fn stream(&self, s: StreamHandle) -> Result<Arc<Stream>> {
        if s.0 == 0 {
            self.legacy_usable()?;
            return Ok(self.default_stream.clone());
        }
        lock(registry())
            .streams
            .get(&s.0)
            .cloned()
            .ok_or_else(|| Error::invalid_argument(format!("unknown simulator stream {:#x}", s.0)))
    }

    /// As CUDA: the legacy stream is ordered with every blocking stream of its device, so
    /// using it while one of them captures would join that capture implicitly. That is
    /// refused, and the capture is invalidated.
    fn legacy_usable(&self) -> Result<()> {
        match invalidate_captures(|st| st.ordinal == self.ordinal && st.blocking) {
            false => Ok(()),
            true => Err(Error::cuda(CAPTURE_IMPLICIT)),
        }
    }

    /// As CUDA's global capture mode (the mode every capture here is begun in): a potentially
    /// unsafe call from a thread whose mode is not relaxed while a stream captures fails and
    /// invalidates the capture. Modelled for the calls the library makes at any time (an event
    /// query); CUDA counts more (allocation, freeing, synchronization).
    fn unsafe_in_global_capture(what: &str) -> Result<()> {
        match !RELAXED.with(|r| r.get()) && invalidate_captures(|_| true) {
            false => Ok(()),
            true => Err(Error::cuda(format!("{what}: {CAPTURE_UNSUPPORTED}"))),
        }
    }

    fn event(&self, e: u64) -> Result<Arc<Event>> {
        lock(registry())
            .events
            .get(&e)
            .cloned()
            .ok_or_else(|| Error::invalid_argument(format!("unknown event {e:#x}")))
    }

    fn unmap(&self, p: DevPtr) -> Result<()> {
        let r = lock(regions()).remove(&p).ok_or_else(|| {
            Error::invalid_argument(format!("{p:#x} is not simulated device memory"))
        })?;
        // SAFETY: p and its size come from our own mmap of this region.
        unsafe {
            libc::munmap(p as *mut libc::c_void, r.bytes.max(1));
            if let Some(name) = r.name {
                if let Ok(c) = std::ffi::CString::new(name) {
                    libc::shm_unlink(c.as_ptr());
                }
            }
        }
        Ok(())
    }

    /// Whether `len` bytes at `p` are simulated device memory (of one region, or of VMM
    /// allocations side by side, as [`Device::pointer_extent`] counts them).
    /// `p` as the address of a simulated device word: 8 aligned bytes of device memory.
    fn word(&self, p: DevPtr) -> Result<u64> {
        if !p.is_multiple_of(8) {
            return Err(Error::cuda(format!("{p:#x} is not 8-byte aligned")));
        }
        self.check_range(p, 8)?;
        Ok(p)
    }

    fn check_range(&self, p: DevPtr, len: usize) -> Result<()> {
        match self.pointer_extent(p, len)? {
            Some((_, avail)) if len <= avail => Ok(()),
            _ => Err(Error::cuda(format!(
                "memcpy on {len} bytes at {p:#x}: not simulated device memory"
            ))),
        }
    }
}

#[cfg(test)]
mod tests;
