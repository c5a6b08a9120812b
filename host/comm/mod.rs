//! Communicators: state and lifecycle (init, split, finalize, destroy, abort) and the per-rank
//! facts shared at init.
//!
//! A [`Comm`] is always a complete communicator. Creation that does not block the caller
//! (non-blocking [`Config`], or inside `ncclGroupStart`/`End`) gives a [`PendingComm`] that turns
//! into a `Comm` when the creation completes.

mod config;
mod peer;
mod pending;
pub mod register;
mod split;
pub mod tuning;

pub use config::{Config, ResolvedConfig, SPLIT_NOCOLOR};
pub use pending::{Launch, PendingComm};

use crate::bootstrap::{AbortFlag, Bootstrap, UniqueId};
use crate::cuda::{DevBuffer, Device, Kernel};
use crate::error::{Error, Result};
use crate::transport::links::Links;
use crate::transport::p2p::{Layout, P2p, PeerAddr};
use nccl_device::abi::{ChannelDev, DevComm, MAX_CHANNELS};
use nccl_device::ops::RedOpKind;
use nccl_device::types::DataType;
use peer::PeerInfo;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Launch shape and buffer sizes, decided by rank 0's parameters so every rank agrees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub nchannels: u32,
    pub nthreads: u32,
    pub slot_bytes: u32,
    /// NCCL_ALGO and NCCL_PROTO as [`crate::tune::Filter`] masks.
    pub algo_mask: u64,
    pub proto_mask: u64,
}

impl Shape {
    /// From this process's parameters for `device`, the channels bounded by the config's
    /// minCTAs / maxCTAs.
    fn from_env(device: &Device, config: &ResolvedConfig) -> Result<Shape> {
        let env = crate::env::int;
        let sim = device.is_sim();
        let buff = match crate::env::raw("NCCL_BUFFSIZE") {
            Some(_) => env("NCCL_BUFFSIZE"),
            None if sim => env("NCCL_RS_SIM_BUFFSIZE"),
            None => env("NCCL_BUFFSIZE"),
        };
        if !(8 * 1024..=(1 << 30)).contains(&buff) {
            return Err(Error::invalid_argument(format!(
                "NCCL_BUFFSIZE={buff}: use 8 KiB to 1 GiB"
            )));
        }
        let slot = (buff as u32 / nccl_device::abi::NCCL_STEPS) & !127;
        let nthreads = if sim {
            env("NCCL_RS_SIM_NTHREADS")
        } else {
            env("NCCL_NTHREADS")
        };
        let most = crate::cuda::MAX_THREADS as i64;
        if !(1..=most).contains(&nthreads) || (!sim && nthreads % 32 != 0) {
            return Err(Error::invalid_argument(format!(
                "NCCL_NTHREADS={nthreads}: use a multiple of 32 up to {most}"
            )));
        }
        // 32 channels: measured 333 GB/s at 2 GiB on 4xH200 against 286 with 16 (NCCL: 362).
        let auto = if sim { 2 } else { 32 };
        let (min, max) = (env("NCCL_MIN_NCHANNELS"), env("NCCL_MAX_NCHANNELS"));
        let mut n = auto;
        if max > 0 {
            n = n.min(max);
        }
        if min > 0 {
            n = n.max(min);
        }
        let n = config.bound_channels(n.clamp(1, MAX_CHANNELS as i64) as u32);
        let (algo_mask, proto_mask) = tuning::filter_masks()?;
        Ok(Shape {
            nchannels: n,
            nthreads: nthreads as u32,
            slot_bytes: slot,
            algo_mask,
            proto_mask,
        })
    }
}

/// One rank's communicator.
pub struct Comm {
    pub(crate) rank: usize,
    pub(crate) nranks: usize,
    pub(crate) device: Device,
    pub(crate) shape: Shape,
    /// Picks protocol and channels per call, alike on every rank.
    pub(crate) tuner: crate::tune::Tuner,
    pub(crate) bootstrap: Arc<Bootstrap>,
    /// Point-to-point connections to any peer, made on first use.
    pub(crate) links: Arc<Links>,
    /// The tree's up connections (ConnSend array towards rank-1, ConnRecv array from rank+1;
    /// 0 where there is none), when NCCL_ALGO allows the tree.
    pub(crate) tree_up: Option<(u64, u64)>,
    /// Keeps this communicator's launches in issue order across streams.
    pub(crate) order: Arc<crate::enqueue::order::StreamOrder>,
    /// DevComm followed by its ChannelDev array, in device memory.
    pub(crate) dev_comm: DevBuffer,
    _p2p: Option<P2p>,
    kernels: Mutex<HashMap<(&'static str, DataType, RedOpKind), Kernel>>,
    aborted: AtomicBool,
    /// Device memory this communicator took at init (bytes), for reports.
    pub(crate) init_bytes: usize,
    config: ResolvedConfig,
    /// Set by `abort`; also stops a split child's creation.
    abort_flag: AbortFlag,
    /// After `finalize` (or `destroy`'s flush): no more operations.
    finalized: AtomicBool,
    /// An error raised outside any call (`ncclCommGetAsyncError`).
    async_error: Mutex<Option<Error>>,
    /// Buffers the user registered (`ncclCommRegister`).
    registered: register::Registrations,
    /// Raised by `abort`: the kernels stop waiting for peers and end.
    pub(crate) kernel_abort: crate::cuda::HostFlag,
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Comm(rank {} of {} on {:?})",
            self.rank, self.nranks, self.device
        )
    }
}

/// Connects the tree's up direction (the ring's reverse, as send/recv links) when the
/// filters allow the tree: every rank does it at init, so no collective waits on a handshake.
fn connect_tree(
    rank: usize,
    nranks: usize,
    links: &Links,
    shape: &Shape,
) -> Result<Option<(u64, u64)>> {
    use crate::transport::links::Dir;
    use crate::tune::{Algo, AlgoFilter, Coll};
    let allowed =
        AlgoFilter::from_mask(shape.algo_mask).allows(Coll::AllReduce, Algo::Tree as usize);
    if nranks == 1 || !allowed {
        return Ok(None);
    }
    let mut needs = Vec::new();
    if rank > 0 {
        needs.push((rank - 1, Dir::Send));
    }
    if rank + 1 < nranks {
        needs.push((rank + 1, Dir::Recv));
    }
    let started = links.start(&needs)?;
    links
        .finish(started)
        .map_err(|e| e.context("tree connections"))?;
    let send = match rank {
        0 => 0,
        _ => links.conn(rank - 1, Dir::Send, 0)?,
    };
    let recv = match rank + 1 < nranks {
        true => links.conn(rank + 1, Dir::Recv, 0)?,
        false => 0,
    };
    Ok(Some((send, recv)))
}

fn check_args(nranks: usize, rank: usize, ids: &[UniqueId]) -> Result<()> {
    if nranks == 0 {
        return Err(Error::invalid_argument("nranks is 0"));
    }
    if rank >= nranks {
        return Err(Error::invalid_argument(format!(
            "rank {rank} is out of range (nranks {nranks})"
        )));
    }
    if ids.is_empty() {
        return Err(Error::invalid_argument("no unique id given"));
    }
    if ids.len() > nranks {
        return Err(Error::invalid_argument(format!(
            "{} unique ids for {nranks} ranks: at most one id per rank",
            ids.len()
        )));
    }
    for id in ids {
        id.decode()?;
    }
    Ok(())
}

impl Comm {
    /// Creates this rank's communicator: bootstrap over `ids` (one root each), peer facts,
    /// transport, device structures. Every wait stops early when `abort` is set.
    pub(crate) fn create(
        device: Device,
        nranks: usize,
        ids: &[UniqueId],
        rank: usize,
        config: ResolvedConfig,
        abort: &AbortFlag,
    ) -> Result<Comm> {
        crate::debug::init();
        check_args(nranks, rank, ids)?;
        let t0 = Instant::now();
        crate::env::log_params();
        device.make_current()?;
        let shape = Shape::from_env(&device, &config)?;
        let timeout =
            Duration::from_millis(crate::env::int("NCCL_BOOTSTRAP_TIMEOUT_MS").max(1) as u64);
        let bootstrap = Bootstrap::init_scalable(ids, rank, nranks, timeout, abort)
            .map_err(|e| e.context("bootstrap"))?;
        let me = PeerInfo::local(rank, &device, shape)?;
        let peers = PeerInfo::exchange(&bootstrap, &me)?;
        let shape = peers[0].shape; // rank 0's parameters rule, so every rank launches alike
        let mut tuner =
            tuning::build(rank, &device, &peers, &shape).map_err(|e| e.context("tuning"))?;
        if tuner.agree(&bootstrap.allgather(&tuner.facts())?)? {
            log::warn!("rank {rank}: topology or tuning differs from rank 0's; using rank 0's");
            tuner.log();
        }
        let (free_before, _) = device.mem_info()?;
        // One ring, rank order, on every channel (every GPU pair is equal on an NVLink switch).
        let prev = (rank + nranks - 1) % nranks;
        let next = (rank + 1) % nranks;
        let layout = Layout::new(shape.nchannels as usize, shape.slot_bytes as usize);
        let addrs: Vec<PeerAddr> = peers
            .iter()
            .map(|p| PeerAddr {
                device: p.device,
                same_process: p.same_process(&me),
            })
            .collect();
        let p2p = if nranks > 1 {
            Some(P2p::setup(&device, &bootstrap, &addrs, prev, next, layout)?)
        } else {
            None
        };
        // Send/receive connections, made on first use: a few per peer (more CTAs per message
        // on GPUs), with FIFO slots a quarter of the ring's.
        let bootstrap = Arc::new(bootstrap);
        let order = Arc::new(crate::enqueue::order::StreamOrder::new(device.clone()));
        let nconns = if device.is_sim() {
            1
        } else {
            (32 / nranks).clamp(1, 4)
        };
        let links = Arc::new(Links::new(
            rank,
            device.clone(),
            bootstrap.clone(),
            addrs,
            nconns,
            (shape.slot_bytes as usize / 4).max(4096),
        ));

        let tree_up = connect_tree(rank, nranks, &links, &shape)?;

        let nch = shape.nchannels as usize;
        let head = std::mem::size_of::<DevComm>().next_multiple_of(16);
        // DevComm, the channels, then the ring as ranks (one ring order for every channel).
        let ring_at = head + nch * std::mem::size_of::<ChannelDev>();
        let ring: Vec<u32> = (0..nranks as u32).collect();
        let dev_comm = device.alloc(ring_at + nranks * 4)?;
        let mut channels = vec![ChannelDev::default(); nch];
        for (c, ch) in channels.iter_mut().enumerate() {
            ch.ring_index = rank as u32;
            ch.ring_ranks = dev_comm.ptr + ring_at as u64;
            ch.ring_prev = prev as u32;
            ch.ring_next = next as u32;
            if let Some(p) = &p2p {
                (ch.send, ch.recv) = p.conns(c);
            }
        }
        let kernel_abort = device.alloc_host_flag()?;
        let dc = DevComm {
            rank: rank as u32,
            nranks: nranks as u32,
            nchannels: shape.nchannels,
            slot_bytes: shape.slot_bytes,
            channels: dev_comm.ptr + head as u64,
            abort_flag: kernel_abort.ptr,
        };
        dev_comm.write(0, as_bytes(std::slice::from_ref(&dc)))?;
        dev_comm.write(head, as_bytes(&channels))?;
        dev_comm.write(ring_at, as_bytes(&ring))?;
        bootstrap.barrier()?;
        let (free_after, _) = device.mem_info()?;
        abort.check()?;
        log::info!(
            "comm {}rank {rank}/{nranks} on device {} ({}): {} channels x {} threads, {} KiB slots, init {:.1} ms",
            config.comm_name.as_deref().map(|n| format!("{n} ")).unwrap_or_default(),
            device.ordinal,
            if device.is_sim() { "simulator" } else { "cuda" },
            shape.nchannels,
            shape.nthreads,
            shape.slot_bytes / 1024,
            t0.elapsed().as_secs_f64() * 1e3
        );
        Ok(Comm {
            rank,
            nranks,
            device,
            shape,
            tuner,
            bootstrap,
            links,
            tree_up,
            order,
            dev_comm,
            _p2p: p2p,
            kernels: Mutex::new(HashMap::new()),
            aborted: AtomicBool::new(false),
            init_bytes: free_before.saturating_sub(free_after),
            config,
            abort_flag: abort.clone(),
            finalized: AtomicBool::new(false),
            async_error: Mutex::new(None),
            registered: register::Registrations::default(),
            kernel_abort,
        })
    }

    /// `ncclCommInitRank` on `device`: every rank calls it with the same id and count.
    pub fn init_rank_on(device: Device, nranks: usize, id: &UniqueId, rank: usize) -> Result<Comm> {
        Comm::init_rank_config_on(device, nranks, id, rank, &Config::default())
    }

    /// `ncclCommInitRankConfig` on `device`, waiting for the creation whatever
    /// `config.blocking` says (see [`Comm::start_init_rank_config_on`] for the non-blocking
    /// form).
    pub fn init_rank_config_on(
        device: Device,
        nranks: usize,
        id: &UniqueId,
        rank: usize,
        config: &Config,
    ) -> Result<Comm> {
        let config = config.resolve(None)?;
        Comm::create(
            device,
            nranks,
            std::slice::from_ref(id),
            rank,
            config,
            &AbortFlag::new(),
        )
    }

    /// `ncclCommInitRankConfig` on the calling thread's current device.
    pub fn init_rank_config(
        nranks: usize,
        id: &UniqueId,
        rank: usize,
        config: &Config,
    ) -> Result<Comm> {
        Comm::init_rank_config_on(Device::current()?, nranks, id, rank, config)
    }

    /// `ncclCommInitRankScalable` on `device`: every rank passes the same `ids` (1 to nranks
    /// of them, each from `get_unique_id`); rank r's bootstrap goes through the root of
    /// `ids[RootPlan::block_of(r)]`, so no root serves more than about nranks/len ranks.
    pub fn init_rank_scalable_on(
        device: Device,
        nranks: usize,
        rank: usize,
        ids: &[UniqueId],
        config: &Config,
    ) -> Result<Comm> {
        let config = config.resolve(None)?;
        Comm::create(device, nranks, ids, rank, config, &AbortFlag::new())
    }

    /// `ncclCommInitRankScalable` on the calling thread's current device.
    pub fn init_rank_scalable(
        nranks: usize,
        rank: usize,
        ids: &[UniqueId],
        config: &Config,
    ) -> Result<Comm> {
        Comm::init_rank_scalable_on(Device::current()?, nranks, rank, ids, config)
    }

    /// `ncclCommInitRankConfig` that honours `config.blocking` and groups: a blocking config
    /// creates now (or, inside `group_start`/`group_end`, at the group's end, concurrently with
    /// the group's other creations); a non-blocking one creates on a thread of its own and
    /// returns at once. Argument errors come back here; creation errors from the handle.
    pub fn start_init_rank_config_on(
        device: Device,
        nranks: usize,
        id: &UniqueId,
        rank: usize,
        config: &Config,
    ) -> Result<PendingComm> {
        Comm::start_init_rank_scalable_on(device, nranks, rank, std::slice::from_ref(id), config)
    }

    /// The non-blocking / group-aware form of [`Comm::init_rank_scalable_on`].
    pub fn start_init_rank_scalable_on(
        device: Device,
        nranks: usize,
        rank: usize,
        ids: &[UniqueId],
        config: &Config,
    ) -> Result<PendingComm> {
        let config = config.resolve(None)?;
        check_args(nranks, rank, ids)?;
        let launch = if config.blocking {
            Launch::Blocking
        } else {
            Launch::Background
        };
        let ids = ids.to_vec();
        PendingComm::start(launch, move |abort| {
            Comm::create(device, nranks, &ids, rank, config, abort)
        })
    }

    /// `ncclCommInitRank`: on the calling thread's current device.
    pub fn init_rank(nranks: usize, id: &UniqueId, rank: usize) -> Result<Comm> {
        Comm::init_rank_on(Device::current()?, nranks, id, rank)
    }

    /// `ncclCommInitAll`: one communicator per device for a single process, rank i on
    /// `devices[i]`.
    pub fn init_all(devices: &[i32]) -> Result<Vec<Comm>> {
        if devices.is_empty() {
            return Err(Error::invalid_argument("ncclCommInitAll with no devices"));
        }
        let id = crate::bootstrap::get_unique_id()?;
        let n = devices.len();
        let opened: Vec<Device> = devices
            .iter()
            .map(|&d| Device::open(d))
            .collect::<Result<_>>()?;
        let results: Vec<Result<Comm>> = std::thread::scope(|s| {
            let handles: Vec<_> = opened
                .into_iter()
                .enumerate()
                .map(|(i, dev)| s.spawn(move || Comm::init_rank_on(dev, n, &id, i)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::internal("an init thread panicked")))
                })
                .collect()
        });
        results.into_iter().collect()
    }

    pub fn rank(&self) -> usize {
        self.rank
    }
    /// `ncclCommUserRank`.
    pub fn user_rank(&self) -> usize {
        self.rank
    }
    /// The options this communicator runs with.
    pub fn config(&self) -> &ResolvedConfig {
        &self.config
    }
    /// `ncclCommCount`.
    pub fn count(&self) -> usize {
        self.nranks
    }
    /// `ncclCommCuDevice`.
    pub fn cu_device(&self) -> i32 {
        self.device.ordinal
    }
    pub fn device(&self) -> &Device {
        &self.device
    }
    pub fn shape(&self) -> Shape {
        self.shape
    }
    /// `ncclCommRegister`: declares `bytes` of this GPU's memory at `buff` for use in this
    /// communicator's operations; the handle is for [`Comm::deregister`].
    pub fn register(&self, buff: crate::cuda::DevPtr, bytes: usize) -> Result<register::RegHandle> {
        self.check_usable()?;
        self.registered.register(&self.device, buff, bytes)
    }

    /// `ncclCommDeregister`.
    pub fn deregister(&self, handle: register::RegHandle) -> Result<()> {
        self.registered.deregister(handle)
    }

    /// What a collective of `bytes` (NCCL's nBytes: AllGather's whole output, ReduceScatter's
    /// whole input, else one rank's buffer) runs with here, as the tuner picks it.
    pub fn tuning(&self, coll: crate::tune::Coll, bytes: usize) -> Result<crate::tune::Choice> {
        self.tuner.choose(coll, bytes)
    }
    /// Device memory this communicator allocated at init (cuMemGetInfo before and after).
    pub fn init_device_bytes(&self) -> usize {
        self.init_bytes
    }

    pub(crate) fn check_usable(&self) -> Result<()> {
        if self.aborted.load(Ordering::Acquire) {
            return Err(Error::invalid_usage("the communicator was aborted"));
        }
        if self.finalized.load(Ordering::Acquire) {
            return Err(Error::invalid_usage(
                "the communicator was finalized: only ncclCommDestroy may follow",
            ));
        }
        Ok(())
    }

    /// Records an error raised outside any call; `get_async_error` reports it.
    #[allow(dead_code)] // for proxies and enqueue, which report errors outside any call
    pub(crate) fn set_async_error(&self, e: Error) {
        let mut slot = self.async_error.lock().unwrap_or_else(|p| p.into_inner());
        slot.get_or_insert(e);
    }

    /// `ncclCommGetAsyncError`: Ok, or the error an operation raised in the background.
    pub fn get_async_error(&self) -> Result<()> {
        // A non-blocking group still issuing (InProgress) or failed comes first.
        self.order.background.state()?;
        match &*self.async_error.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Waits for every operation this rank issued.
    fn flush(&self) -> Result<()> {
        self.order
            .wait_idle()
            .map_err(|e| e.context(format!("rank {}: waiting for its operations", self.rank)))
    }

    /// `ncclCommFinalize`: waits until every operation this rank issued completed and every
    /// rank finalized (a barrier), so that `destroy` afterwards frees without waiting on
    /// anyone. Later operations are invalid usage. In a non-blocking C communicator this runs
    /// in the background.
    pub fn finalize(&self) -> Result<()> {
        self.check_usable()?;
        self.flush()?;
        self.bootstrap
            .barrier()
            .map_err(|e| e.context(format!("rank {}: finalize", self.rank)))?;
        self.finalized.store(true, Ordering::Release);
        Ok(())
    }

    /// Whether `finalize` completed.
    pub fn is_finalized(&self) -> bool {
        self.finalized.load(Ordering::Acquire)
    }

    /// `ncclCommDestroy`: waits for this rank's own operations (not for other ranks, unlike
    /// finalize) and frees everything. Dropping a `Comm` does the same, ignoring errors.
    pub fn destroy(self) -> Result<()> {
        let r = if self.is_finalized() || self.aborted.load(Ordering::Acquire) {
            Ok(())
        } else {
            self.flush()
        };
        self.finalized.store(true, Ordering::Release);
        drop(self);
        r
    }

    /// `ncclCommAbort`: stops the bootstrap so no later call waits on a peer, even a dead one;
    /// later operations are invalid usage. The memory is released when the communicator drops
    /// (without waiting for outstanding operations).
    pub fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
        self.kernel_abort.raise();
        self.abort_flag.abort();
        self.bootstrap.abort();
        // A non-blocking group issuing our work must stop before our memory may go; the
        // bootstrap abort above ends any handshake it waits on.
        let _ = self.order.background.wait();
    }

    /// Whether `abort` was called.
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    /// The kernel of `coll` for this type and op, loaded once per communicator.
    pub(crate) fn kernel(&self, coll: &'static str, dt: DataType, op: RedOpKind) -> Result<Kernel> {
        let key = (coll, dt, op);
        if let Some(k) = self
            .kernels
            .lock()
            .map_err(|_| Error::internal("kernel cache poisoned"))?
            .get(&key)
        {
            return Ok(*k);
        }
        let family = format!("nccl_{coll}_{}_", dt.name());
        let k = self
            .device
            .kernel(&format!("{family}{}", op.name()), &family)?;
        self.kernels
            .lock()
            .map_err(|_| Error::internal("kernel cache poisoned"))?
            .insert(key, k);
        Ok(k)
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        let _ = self.order.background.wait();
        // After an abort our kernels stop waiting and end: waiting for them keeps the memory
        // they use alive until then.
        if !self.is_finalized() {
            if let Err(e) = self.flush() {
                log::warn!("destroying rank {}: {e}", self.rank);
            }
        }
    }
}

/// The bytes of plain-data ABI structures, for copying them to the device.
fn as_bytes<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: T is a #[repr(C)] ABI structure of plain integers (no padding holes read as
    // uninitialised: every ABI type pads explicitly).
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}
