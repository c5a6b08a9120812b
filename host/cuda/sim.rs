//! The CPU simulator backend: device memory is host memory (POSIX shared memory, so that
//! simulated GPUs in other processes can map it like CUDA IPC), a stream is a worker thread
//! running its queue in order, and a kernel launch runs the real `nccl-device` kernels, each
//! CTA a group of host threads (`nccl_device::arch::sim`).

use super::{DevPtr, DeviceProps, GraphRelease, StreamHandle};
use crate::error::{Error, Result};
use nccl_device::abi::{CollArgs, P2pArgs};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Instant;

mod multicast;

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

    pub fn make_current(&self) -> Result<()> {
        CURRENT.with(|c| c.set(self.ordinal));
        Ok(())
    }

    pub fn props(&self) -> Result<DeviceProps> {
        Ok(DeviceProps {
            name: "nccl-rs CPU simulator".into(),
            bus_id: format!("0000:{:02x}:00.0", self.ordinal + 1),
            compute_capability: (9, 0),
            sm_count: 4,
        })
    }

    pub fn mem_info(&self) -> Result<(usize, usize)> {
        let used: usize = lock(regions())
            .values()
            .filter(|r| r.ordinal == self.ordinal && (r.name.is_some() || r.vmm_fd.is_some()))
            .map(|r| r.bytes)
            .sum();
        let total = 16usize << 30;
        Ok((total.saturating_sub(used), total))
    }

    pub fn alloc(&self, bytes: usize) -> Result<DevPtr> {
        // A name left behind by a killed process that had our pid must not fail the
        // allocation: take the next number instead (O_EXCL never reuses a live region).
        let mut tries = 0;
        let (name, p) = loop {
            let name = format!(
                "/ncclrs-{}@{}-{:x}-{}",
                std::process::id(),
                pid_namespace(),
                process_nonce(),
                NEXT_ID.fetch_add(1, Ordering::Relaxed)
            );
            match map_shm(&name, bytes, true)? {
                Some((p, _)) => break (name, p),
                None if tries < 64 => tries += 1,
                None => return Err(Error::system(format!("shm_open({name}): name taken"))),
            }
        };
        lock(regions()).insert(
            p,
            Region {
                bytes,
                id: REGION_IDS.fetch_add(1, Ordering::Relaxed),
                ordinal: self.ordinal,
                name: Some(name),
                vmm_fd: None,
            },
        );
        Ok(p)
    }

    /// Memory as the driver's virtual memory API gives it (`ncclMemAlloc`): rounded up to
    /// [`SIM_VMM_GRANULARITY`], and shareable only through its descriptor (a memfd, kept with
    /// the region), like `cuMemCreate` with a POSIX descriptor handle: `ipc_handle` refuses it
    /// as `cuIpcGetMemHandle` does. (address, size).
    pub fn alloc_vmm(&self, bytes: usize) -> Result<(DevPtr, usize)> {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let size = bytes.max(1).div_ceil(SIM_VMM_GRANULARITY) * SIM_VMM_GRANULARITY;
        // SAFETY: plain system calls; the descriptor is owned at once and every result checked.
        let (fd, p) = unsafe {
            let raw = libc::memfd_create(c"ncclrs-vmm".as_ptr(), libc::MFD_CLOEXEC);
            if raw < 0 {
                return Err(Error::system(format!(
                    "memfd_create: {}",
                    std::io::Error::last_os_error()
                )));
            }
            let fd = OwnedFd::from_raw_fd(raw);
            if libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) != 0 {
                return Err(Error::system(format!(
                    "ftruncate(memfd, {size}): {}",
                    std::io::Error::last_os_error()
                )));
            }
            let p = map_fd(fd.as_raw_fd(), size)?;
            (fd, p)
        };
        lock(regions()).insert(
            p,
            Region {
                bytes: size,
                id: REGION_IDS.fetch_add(1, Ordering::Relaxed),
                ordinal: self.ordinal,
                name: None,
                vmm_fd: Some(fd),
            },
        );
        Ok((p, size))
    }

    /// VMM allocations side by side in one address range, as `cuMemAddressReserve` and one
    /// `cuMemCreate` + `cuMemMap` per piece make them (PyTorch's expandable segments): each
    /// piece of `sizes` (rounded up to [`SIM_VMM_GRANULARITY`]) its own memfd and region, the
    /// next starting where the previous ends. (address, size) of each; each is freed alone.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn alloc_vmm_adjacent(&self, sizes: &[usize]) -> Result<Vec<(DevPtr, usize)>> {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let rounded: Vec<usize> = sizes
            .iter()
            .map(|b| b.max(&1).div_ceil(SIM_VMM_GRANULARITY) * SIM_VMM_GRANULARITY)
            .collect();
        let total: usize = rounded.iter().sum();
        if total == 0 {
            return Ok(Vec::new());
        }
        let mut fds = Vec::new();
        for &size in &rounded {
            // SAFETY: plain system calls; the descriptor is owned at once, results checked.
            let fd = unsafe {
                let raw = libc::memfd_create(c"ncclrs-vmm".as_ptr(), libc::MFD_CLOEXEC);
                if raw < 0 {
                    return Err(Error::system(format!(
                        "memfd_create: {}",
                        std::io::Error::last_os_error()
                    )));
                }
                OwnedFd::from_raw_fd(raw)
            };
            // SAFETY: a live descriptor of ours.
            if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } != 0 {
                return Err(Error::system(format!(
                    "ftruncate(memfd, {size}): {}",
                    std::io::Error::last_os_error()
                )));
            }
            fds.push(fd);
        }
        // SAFETY: reserves address space only (no access, no memory); checked.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if at == libc::MAP_FAILED {
            return Err(Error::system(format!(
                "reserving {total} bytes: {}",
                std::io::Error::last_os_error()
            )));
        }
        let mut out = Vec::new();
        let mut p = at as u64;
        for (fd, &size) in fds.into_iter().zip(&rounded) {
            // SAFETY: replaces `size` bytes of the reservation made above (inside it: the
            // sizes add up to its length) with the memfd's pages.
            let q = unsafe {
                libc::mmap(
                    p as *mut libc::c_void,
                    size,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    fd.as_raw_fd(),
                    0,
                )
            };
            if q == libc::MAP_FAILED {
                let e = std::io::Error::last_os_error();
                // SAFETY: what is left of our reservation (the pieces mapped so far are
                // regions, freed by their owners; the rest goes here).
                unsafe { libc::munmap(p as *mut libc::c_void, total - (p - at as u64) as usize) };
                for (r, _) in out {
                    let _ = self.unmap(r);
                }
                return Err(Error::system(format!("mapping a VMM piece: {e}")));
            }
            lock(regions()).insert(
                p,
                Region {
                    bytes: size,
                    id: REGION_IDS.fetch_add(1, Ordering::Relaxed),
                    ordinal: self.ordinal,
                    name: None,
                    vmm_fd: Some(fd),
                },
            );
            out.push((p, size));
            p += size as u64;
        }
        Ok(out)
    }

    /// The VMM allocation holding `p` ([`Device::alloc_vmm`]): its base, size and a new
    /// descriptor of its memory, as the driver backend exports one (no allocation handle to
    /// retain here: 0). None for any other memory (as `cuMemRetainAllocationHandle` refuses
    /// it).
    pub fn vmm_export(
        &self,
        p: DevPtr,
    ) -> Result<Option<(DevPtr, usize, std::os::fd::OwnedFd, u64)>> {
        let regions = lock(regions());
        let Some((&base, r)) = regions.range(..=p).next_back() else {
            return Ok(None);
        };
        let Some(fd) = r.vmm_fd.as_ref().filter(|_| p < base + r.bytes as u64) else {
            return Ok(None);
        };
        let dup = fd.try_clone().map_err(|e| {
            Error::quiet(
                crate::error::NcclResult::SystemError,
                format!("dup of a VMM descriptor: {e}"),
            )
        })?;
        Ok(Some((base, r.bytes, dup, 0)))
    }

    pub fn vmm_export_release(&self, _handle: u64) -> Result<()> {
        Ok(())
    }

    /// Maps `bytes` of a peer's VMM allocation from its descriptor (which must hold them).
    pub fn vmm_import(
        &self,
        fd: std::os::fd::BorrowedFd<'_>,
        bytes: usize,
    ) -> Result<(DevPtr, u64)> {
        use std::os::fd::AsRawFd;
        let size = super::fdpass::file_size(fd)? as usize;
        if bytes == 0 || bytes > size {
            return Err(Error::quiet(
                crate::error::NcclResult::InvalidArgument,
                format!("a peer's VMM descriptor holds {size} bytes, its record claims {bytes}"),
            ));
        }
        // SAFETY: a live descriptor of at least `bytes` (checked above).
        let p = unsafe { map_fd(fd.as_raw_fd(), bytes)? };
        lock(regions()).insert(
            p,
            Region {
                bytes,
                id: REGION_IDS.fetch_add(1, Ordering::Relaxed),
                ordinal: self.ordinal,
                name: None,
                vmm_fd: None,
            },
        );
        VMM_IMPORTS.fetch_add(1, Ordering::Relaxed);
        Ok((p, 0))
    }

    pub fn vmm_unmap(&self, p: DevPtr, _bytes: usize, _handle: u64) -> Result<()> {
        self.unmap(p)
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

    pub fn free(&self, p: DevPtr) -> Result<()> {
        self.unmap(p)
    }

    /// Simulated device memory is host memory: the same address serves both sides.
    pub fn alloc_host_mapped(&self, bytes: usize) -> Result<(*mut u8, DevPtr)> {
        let p = self.alloc(bytes)?;
        Ok((p as *mut u8, p))
    }

    /// Host memory is what simulated kernels address: the same address serves both sides.
    pub fn host_register(&self, host: *mut u8, _bytes: usize) -> Result<DevPtr> {
        Ok(host as DevPtr)
    }

    pub fn host_unregister(&self, _host: *mut u8) -> Result<()> {
        Ok(())
    }

    pub fn free_host_mapped(&self, host: *mut u8) -> Result<()> {
        self.unmap(host as DevPtr)
    }

    /// Whether `len` bytes at `p` are simulated device memory (of one region, or of VMM
    /// allocations side by side, as [`Device::pointer_extent`] counts them).
    fn check_range(&self, p: DevPtr, len: usize) -> Result<()> {
        match self.pointer_extent(p, len)? {
            Some((_, avail)) if len <= avail => Ok(()),
            _ => Err(Error::cuda(format!(
                "memcpy on {len} bytes at {p:#x}: not simulated device memory"
            ))),
        }
    }

    pub fn copy_htod(&self, dst: DevPtr, src: &[u8]) -> Result<()> {
        self.check_range(dst, src.len())?;
        // SAFETY: the range lies inside a live mapping (checked above).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    pub fn copy_dtoh(&self, dst: &mut [u8], src: DevPtr) -> Result<()> {
        self.check_range(src, dst.len())?;
        // SAFETY: the range lies inside a live mapping (checked above).
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// The device of the region holding `p` and the bytes from `p` to the region's end, or
    /// None when `p` is in no region. As the driver backend: a VMM allocation followed by VMM
    /// allocations that start where it ends (of the same device) counts as far as `need`
    /// bytes require.
    pub fn pointer_extent(&self, p: DevPtr, need: usize) -> Result<Option<(i32, usize)>> {
        let regions = lock(regions());
        let Some((&base, r)) = regions.range(..=p).next_back() else {
            return Ok(None);
        };
        if p >= base + r.bytes.max(1) as u64 {
            return Ok(None);
        }
        let mut end = base + r.bytes as u64;
        let want = p.saturating_add(need as u64);
        if r.vmm_fd.is_some() {
            while end < want {
                match regions.get(&end) {
                    Some(n) if n.vmm_fd.is_some() && n.ordinal == r.ordinal && n.bytes > 0 => {
                        end += n.bytes as u64
                    }
                    _ => break,
                }
            }
        }
        Ok(Some((r.ordinal, (end - p) as usize)))
    }

    /// The base of the region holding `p`, None if `p` is not simulated device memory.
    pub fn allocation_base(&self, p: DevPtr) -> Result<Option<DevPtr>> {
        let regions = lock(regions());
        Ok(match regions.range(..=p).next_back() {
            Some((&base, r)) if p < base + r.bytes.max(1) as u64 => Some(base),
            _ => None,
        })
    }

    /// The id of the region holding `p` (unique among the process's regions, never reused).
    pub fn allocation_id(&self, p: DevPtr) -> Result<Option<u64>> {
        let regions = lock(regions());
        Ok(match regions.range(..=p).next_back() {
            Some((&base, r)) if p < base + r.bytes.max(1) as u64 => Some(r.id),
            _ => None,
        })
    }

    pub fn ipc_handle(&self, p: DevPtr) -> Result<[u8; 64]> {
        let regions = lock(regions());
        let r = regions.get(&p).ok_or_else(|| {
            Error::invalid_argument("IPC handle of a pointer that is no allocation base")
        })?;
        if r.vmm_fd.is_some() {
            // As cuIpcGetMemHandle: memory of the virtual memory API has no IPC handle.
            return Err(Error::invalid_argument(
                "IPC handle of memory of the virtual memory API",
            ));
        }
        let name = r
            .name
            .as_ref()
            .ok_or_else(|| Error::invalid_argument("IPC handle of a peer's mapping"))?;
        let mut h = [0u8; 64];
        h[..4].copy_from_slice(&(r.ordinal as u32).to_le_bytes());
        h[4..12].copy_from_slice(&(r.bytes as u64).to_le_bytes());
        let n = name.len().min(51);
        h[12..12 + n].copy_from_slice(&name.as_bytes()[..n]);
        Ok(h)
    }

    pub fn open_ipc(&self, h: &[u8; 64]) -> Result<DevPtr> {
        let ordinal = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as i32;
        let bytes = u64::from_le_bytes(h[4..12].try_into().unwrap_or_default()) as usize;
        let end = h[12..].iter().position(|&b| b == 0).map_or(64, |i| 12 + i);
        let name = std::str::from_utf8(&h[12..end])
            .map_err(|_| Error::invalid_argument("malformed simulator IPC handle"))?;
        // The name comes from a peer: only a region `alloc` names is mapped, not any shared
        // memory object this process may open.
        if !is_region_name(name) {
            return Err(Error::invalid_argument(format!(
                "simulator IPC handle names {name:?}, not a simulated device allocation"
            )));
        }
        let (p, size) = map_shm(name, bytes, false)?
            .ok_or_else(|| Error::internal("shm_open without O_CREAT reported a taken name"))?;
        // The size comes from a peer: the region must really hold it, or accesses past the
        // mapping would fault.
        if bytes > size {
            // SAFETY: unmaps exactly the mapping made above, which nothing else knows of yet.
            unsafe { libc::munmap(p as *mut libc::c_void, size) };
            return Err(Error::invalid_argument(format!(
                "simulator IPC handle of {name} claims {bytes} bytes, but the region holds {size}"
            )));
        }
        lock(regions()).insert(
            p,
            Region {
                bytes,
                id: REGION_IDS.fetch_add(1, Ordering::Relaxed),
                ordinal,
                name: None,
                vmm_fd: None,
            },
        );
        Ok(p)
    }

    pub fn close_ipc(&self, p: DevPtr) -> Result<()> {
        self.unmap(p)
    }

    pub fn function(&self, name: &str) -> Result<usize> {
        kernel_table()
            .1
            .get(name)
            .copied()
            .ok_or_else(|| Error::internal(format!("the simulator has no kernel {name}")))
    }

    pub fn launch(
        &self,
        func: usize,
        grid: u32,
        block: u32,
        stream: StreamHandle,
        arg: *const u8,
        size: usize,
    ) -> Result<()> {
        let entry = *kernel_table()
            .0
            .get(func)
            .ok_or_else(|| Error::internal("bad simulator kernel handle"))?;
        // The parameter is copied now (as cuLaunchKernel does); its size must be the kernel's.
        let body: Box<dyn Fn() + Send + Sync> = match entry {
            Entry::Coll(f) if size == std::mem::size_of::<CollArgs>() => {
                // SAFETY: the caller passes a parameter of the kernel's type (checked by size).
                let a: CollArgs = unsafe { std::ptr::read_unaligned(arg as *const CollArgs) };
                COLL_FLAGS.fetch_or(a.flags, Ordering::Relaxed);
                if a.algo == nccl_device::abi::ALGO_NVLS {
                    NVLS_LAUNCHES.fetch_add(1, Ordering::Relaxed);
                }
                // SAFETY: the host wired `a` to live buffers and a communicator, as on a GPU.
                Box::new(move || unsafe { f(&a) })
            }
            Entry::P2p(f) if size == std::mem::size_of::<P2pArgs>() => {
                // SAFETY: as above.
                let a: P2pArgs = unsafe { std::ptr::read_unaligned(arg as *const P2pArgs) };
                P2P_FLAGS.fetch_or(a.flags, Ordering::Relaxed);
                // SAFETY: as above.
                Box::new(move || unsafe { f(&a) })
            }
            _ => {
                return Err(Error::internal(
                    "simulated kernel launched with a parameter of the wrong size",
                ))
            }
        };
        let s = self.stream(stream)?;
        LAUNCHES.fetch_add(1, Ordering::Relaxed);
        let body: Arc<dyn Fn() + Send + Sync> = Arc::from(body);
        s.push_replayable(Arc::new(move || {
            let body = body.clone();
            Box::new(move || {
                let body = &*body;
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    std::thread::scope(|sc| {
                        for b in 0..grid {
                            sc.spawn(move || nccl_device::arch::sim::run_cta(b, grid, block, body));
                        }
                    })
                }));
                r.map_err(|p| {
                    p.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "kernel panicked".into())
                })
            })
        }));
        Ok(())
    }

    /// Copies `bytes` from `src` to `dst` in stream order (the copy engine's job on a GPU).
    pub fn copy_dtod_async(
        &self,
        dst: DevPtr,
        src: DevPtr,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        self.check_range(dst, bytes)?;
        self.check_range(src, bytes)?;
        let s = self.stream(stream)?;
        s.push_replayable(Arc::new(move || {
            Box::new(move || {
                // SAFETY: both ranges lay inside live mappings when the copy was queued, and
                // (as on a GPU) the caller keeps them until the stream passed the copy.
                unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
                Ok(())
            })
        }));
        Ok(())
    }

    pub fn stream_create(&self, blocking: bool) -> Result<StreamHandle> {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed) << 8 | 0x5;
        lock(registry())
            .streams
            .insert(id, Stream::start(self.ordinal, blocking));
        Ok(StreamHandle(id))
    }

    pub fn stream_destroy(&self, s: StreamHandle) -> Result<()> {
        if s.0 == 0 {
            return Err(Error::invalid_argument(
                "the default stream cannot be destroyed",
            ));
        }
        let st = self.stream(s)?;
        lock(registry()).streams.remove(&s.0);
        // Work already queued still runs (as cuStreamDestroy promises); then the worker ends.
        lock(&st.q).closed = true;
        st.cv.notify_all();
        Ok(())
    }

    pub fn stream_sync(&self, s: StreamHandle) -> Result<()> {
        self.stream(s)?.sync()
    }

    /// Waits for the legacy stream and every live stream of this device.
    pub fn synchronize(&self) -> Result<()> {
        let mine: Vec<Arc<Stream>> = lock(registry())
            .streams
            .values()
            .filter(|st| st.ordinal == self.ordinal)
            .cloned()
            .collect();
        let mut first = self.default_stream.sync().err();
        for st in mine {
            if let Err(e) = st.sync() {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    pub fn stream_query(&self, s: StreamHandle) -> Result<bool> {
        self.stream(s)?.idle()
    }

    pub fn event_create(&self) -> Result<u64> {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed) << 8 | 0xe;
        lock(registry())
            .events
            .insert(id, Arc::new(Event::default()));
        Ok(id)
    }

    pub fn event_record(&self, e: u64, s: StreamHandle) -> Result<()> {
        let ev = self.event(e)?;
        let stream = self.stream(s)?;
        if stream.capturing() {
            // A point inside the graph: waits of the same capture may follow it.
            lock(&ev.state).captured_on = Some(Arc::as_ptr(&stream) as usize);
            return Ok(());
        }
        stream.push(issue_record(&ev));
        Ok(())
    }

    /// A record that a capture keeps as an event record node (CU_EVENT_RECORD_EXTERNAL): each
    /// launch of the graph records `e`, usable outside the graph. Only inside a capture.
    pub fn event_record_external(&self, e: u64, s: StreamHandle) -> Result<()> {
        self.external_node(e, s, "record", issue_record)
    }

    /// A wait that a capture keeps as an event wait node (CU_EVENT_WAIT_EXTERNAL): each launch
    /// of the graph waits for `e`'s latest record at the launch. Only inside a capture.
    pub fn stream_wait_event_external(&self, s: StreamHandle, e: u64) -> Result<()> {
        self.external_node(e, s, "wait", issue_wait)
    }

    /// Adds to the capture open on `s` a node that issues `issue(e)` at each launch.
    fn external_node(
        &self,
        e: u64,
        s: StreamHandle,
        what: &str,
        issue: fn(&Arc<Event>) -> Job,
    ) -> Result<()> {
        let ev = self.event(e)?;
        let stream = self.stream(s)?;
        if !stream.capturing() {
            return Err(Error::cuda(format!(
                "an external event {what} outside a capture (CUDA_ERROR_INVALID_VALUE)"
            )));
        }
        stream.push_replayable(Arc::new(move || issue(&ev)));
        Ok(())
    }

    pub fn stream_wait_event(&self, s: StreamHandle, e: u64) -> Result<()> {
        let ev = self.event(e)?;
        let stream = self.stream(s)?;
        let (target, captured_on) = {
            let st = lock(&ev.state);
            (st.issued, st.captured_on)
        };
        match (stream.capturing(), captured_on) {
            (false, None) => {}
            (false, Some(_)) => return Err(Error::cuda(format!("stream wait: {CAPTURED_EVENT}"))),
            (true, None) => return Err(Error::cuda(format!("stream wait: {CAPTURE_ISOLATION}"))),
            // Within one stream's capture, stream order already holds.
            (true, Some(on)) if on == Arc::as_ptr(&stream) as usize => return Ok(()),
            (true, Some(_)) => {
                return Err(Error::invalid_usage(
                    "the simulator captures one stream at a time (no fork/join across streams)",
                ))
            }
        }
        stream.push(Box::new(move || {
            ev.wait_for(target);
            Ok(())
        }));
        Ok(())
    }

    pub fn event_query(&self, e: u64) -> Result<bool> {
        Self::unsafe_in_global_capture("event query")?;
        let ev = self.event(e)?;
        let st = lock(&ev.state);
        Ok(st.done >= st.issued)
    }

    pub fn event_sync(&self, e: u64) -> Result<()> {
        let ev = self.event(e)?;
        let (target, captured_on) = {
            let st = lock(&ev.state);
            (st.issued, st.captured_on)
        };
        if captured_on.is_some() {
            return Err(Error::cuda(format!("event synchronize: {CAPTURED_EVENT}")));
        }
        ev.wait_for(target);
        Ok(())
    }

    pub fn event_elapsed_ms(&self, start: u64, end: u64) -> Result<f32> {
        let (a, b) = (
            lock(&self.event(start)?.state).at,
            lock(&self.event(end)?.state).at,
        );
        match (a, b) {
            (Some(a), Some(b)) => Ok(b.saturating_duration_since(a).as_secs_f32() * 1e3),
            _ => Err(Error::invalid_usage("event not completed")),
        }
    }

    pub fn event_destroy(&self, e: u64) -> Result<()> {
        lock(registry()).events.remove(&e);
        Ok(())
    }

    pub fn stream_capturing(&self, s: StreamHandle) -> Result<bool> {
        Ok(self.stream(s)?.capturing())
    }

    pub fn capture_begin(&self, s: StreamHandle) -> Result<()> {
        let stream = self.stream(s)?;
        let mut c = lock(&stream.capture);
        if c.is_some() {
            return Err(Error::invalid_usage("the stream is capturing already"));
        }
        if s.0 == 0 {
            return Err(Error::cuda(format!(
                "capture of the legacy stream: {CAPTURE_UNSUPPORTED}"
            )));
        }
        stream.invalidated.store(false, Ordering::SeqCst);
        *c = Some(Vec::new());
        *lock(&stream.capture_extra) = (NEXT_ID.fetch_add(1, Ordering::Relaxed), Vec::new());
        Ok(())
    }

    /// The id of the capture open on `s`.
    pub fn capture_id(&self, s: StreamHandle) -> Result<Option<u64>> {
        let stream = self.stream(s)?;
        let open = stream.capturing() && !stream.invalidated.load(Ordering::SeqCst);
        Ok(open.then(|| lock(&stream.capture_extra).0))
    }

    /// Runs `release` when the graph the capture open on `s` makes is destroyed (at once if
    /// the capture fails). Not capturing: `release` comes back.
    pub fn on_graph_release(
        &self,
        s: StreamHandle,
        release: GraphRelease,
    ) -> Result<std::result::Result<(), GraphRelease>> {
        let stream = self.stream(s)?;
        if !stream.capturing() || stream.invalidated.load(Ordering::SeqCst) {
            return Ok(Err(release));
        }
        lock(&stream.capture_extra).1.push(release);
        Ok(Ok(()))
    }

    /// Ends the capture; the graph is its launches, replayed in order.
    pub fn capture_end(&self, s: StreamHandle) -> Result<(u64, u64)> {
        let stream = self.stream(s)?;
        let jobs = lock(&stream.capture)
            .take()
            .ok_or_else(|| Error::invalid_usage("the stream is not capturing"))?;
        let releases = std::mem::take(&mut lock(&stream.capture_extra).1);
        if stream.invalidated.swap(false, Ordering::SeqCst) {
            // No graph: what was tied to it is released now (as CUDA destroys the graph).
            releases.into_iter().for_each(|r| r());
            return Err(Error::cuda(format!(
                "cuStreamEndCapture: {CAPTURE_INVALIDATED}"
            )));
        }
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed) << 8 | 0x9;
        let mut reg = lock(registry());
        reg.graphs.insert(id, Arc::new(jobs));
        reg.graph_releases.insert(id, releases);
        Ok((id, id))
    }

    pub fn graph_launch(&self, exec: u64, s: StreamHandle) -> Result<()> {
        let jobs = lock(registry())
            .graphs
            .get(&exec)
            .cloned()
            .ok_or_else(|| Error::invalid_argument(format!("unknown graph {exec:#x}")))?;
        let stream = self.stream(s)?;
        for j in jobs.iter() {
            stream.push_replayable(j.clone());
        }
        Ok(())
    }

    /// How many nodes (launches, copies, external event waits and records) a graph holds:
    /// tests check with it what a captured call costs.
    pub fn graph_node_count(&self, exec: u64) -> Result<usize> {
        lock(registry())
            .graphs
            .get(&exec)
            .map(|g| g.len())
            .ok_or_else(|| Error::invalid_argument(format!("unknown graph {exec:#x}")))
    }

    pub fn graph_destroy(&self, graph: u64, _exec: u64) -> Result<()> {
        let releases = {
            let mut reg = lock(registry());
            reg.graphs.remove(&graph);
            reg.graph_releases.remove(&graph)
        };
        // Outside the registry's lock, as CUDA runs user objects' destructors on a thread of
        // its own.
        releases.into_iter().flatten().for_each(|r| r());
        Ok(())
    }
}

#[cfg(test)]
mod tests;
