//! Communicators: state and lifecycle (init, split, finalize, destroy, abort) and the per-rank
//! facts shared at init.
//!
//! A [`Comm`] is always a complete communicator. Creation that does not block the caller
//! (non-blocking [`Config`], or inside `ncclGroupStart`/`End`) gives a [`PendingComm`] that turns
//! into a `Comm` when the creation completes.
//!
//! This layer sits below the enqueue layer (which turns calls and groups into kernel
//! launches) and never reaches up into it: what both need, the launch order a communicator
//! owns ([`order`]) and the thread's group nesting with its deferred creations
//! (`group_scope`), lives here.

mod abort_handle;
pub mod call;
mod config;
pub(crate) mod copy_engine;
mod create;
mod deterministic;
pub mod dev_api;
mod gin;
pub(crate) mod graph_reg;
pub(crate) mod group_scope;
mod grow;
mod inspect;
mod keepalive;
mod net;
pub(crate) mod nvls;
pub mod onesided;
mod onesided_net;
pub mod op;
pub mod order;
mod pat;
mod peer;
mod pending;
mod plan;
pub(crate) mod profile;
mod properties;
mod proxy_ops;
pub mod register;
mod revoke;
pub mod rings;
mod shape;
mod share;
mod shared;
mod split;
mod stamps;
pub mod suspend;
mod transports;
mod tree;
mod tree_up;
pub mod tuning;
mod turns;
pub mod window;
mod window_mc;

pub use abort_handle::AbortHandle;
pub use call::CollCall;
pub(crate) use call::{call_bytes, Sizes};
pub use config::{
    Config, ResolvedConfig, CTA_POLICY_DEFAULT, CTA_POLICY_EFFICIENCY, CTA_POLICY_ZERO,
    SPLIT_NOCOLOR,
};
pub use op::{ReduceOp, Scalar};
pub use pending::{Launch, PendingComm};
pub(crate) use plan::{kernel_name, LaunchPlan};
pub use properties::{GinType, Properties};
pub use split::{SHRINK_ABORT, SHRINK_DEFAULT};

use crate::bootstrap::{AbortFlag, Bootstrap, UniqueId};
use crate::cuda::{DevBuffer, Device, Kernel};
use crate::error::{Error, NcclResult, Result};
use crate::graph::Transport;
use crate::transport::links::Links;
use crate::transport::net::NetPath;
use crate::transport::p2p::PeerAddr;
use crate::transport::suspend::{Phase, Suspendable};
use crate::transport::{Dir, Resources};
use nccl_device::abi::{ChannelDev, Coll, DevComm, MAX_CHANNELS, MAX_P2P_ITEMS};
use nccl_device::ops::RedOpKind;
use nccl_device::types::DataType;
use net::{fault_sink, net_fault_sink, net_path, nodes};
use peer::PeerInfo;
use rings::Rings;
pub(crate) use shared::{NotSync, Shared};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use shape::Shape;

/// One rank's communicator.
pub struct Comm {
    rank: usize,
    nranks: usize,
    device: Device,
    shape: Shape,
    /// Picks protocol and channels per call, alike on every rank.
    tuner: crate::tune::Tuner,
    bootstrap: Arc<Bootstrap>,
    /// Point-to-point connections to any peer, made on first use.
    links: Arc<Links>,
    /// The tree's up connections, when NCCL_ALGO allows the tree on one node: see [`TreeUp`].
    tree_up: Option<TreeUp>,
    /// Across nodes, the double binary tree's connections when NCCL_ALGO allows the tree
    /// (then `tree_up` is None): see [`tree`].
    dbt: Option<tree::Dbt>,
    /// PAT's connections (AllGather and ReduceScatter with one rank per node), where made.
    pat: Option<pat::Pat>,
    /// NVLS's multicast scratch, where the user set NCCL_NVLS_ENABLE to 1 and the GPUs allow it.
    nvls: Option<nvls::Nvls>,
    /// Every channel's ring, alike on every rank (rank 0's).
    rings: Rings,
    /// Keeps this communicator's launches in issue order across streams.
    order: Arc<order::StreamOrder>,
    /// DevComm followed by its ChannelDev array, in device memory.
    dev_comm: DevBuffer,
    /// The memory behind the rings' connections, whichever transports made them (p2p blocks
    /// and mappings, SHM segments; the network's live with the proxy).
    ring_resources: Resources,
    /// The op queues of the rings' network connections, where a profiler plugin is loaded
    /// (the proxy's profiler events: [`proxy_ops`]).
    ring_ops: Option<Arc<proxy_ops::RingQueues>>,
    /// The connection memory `ncclCommSuspend` releases (see [`suspend`]).
    suspendable: Arc<Suspendable>,
    kernels: Mutex<HashMap<(Coll, DataType, RedOpKind), Kernel>>,
    /// Set by `abort` (shared with [`AbortHandle`]s).
    aborted: Arc<AtomicBool>,
    /// Device memory this communicator took at init (bytes), for reports.
    init_bytes: usize,
    /// Device memory this communicator holds now (bytes): what its device handle allocated
    /// and has not freed ([`Device::counted`]).
    memory: Arc<std::sync::atomic::AtomicUsize>,
    /// The device as [`Comm::device`] gives it, without the ledger: what users allocate
    /// through it is not this communicator's memory.
    user_device: Device,
    config: ResolvedConfig,
    /// Set by `abort`; also stops a split child's creation.
    abort_flag: AbortFlag,
    /// After `finalize` (or `destroy`'s flush): no more operations.
    finalized: AtomicBool,
    /// After `revoke` (`revoke.rs`): only shrink, split, destroy or abort.
    revoked: AtomicBool,
    /// An error raised outside any call (`ncclCommGetAsyncError`).
    async_error: Arc<Mutex<Option<Error>>>,
    /// Buffers the user registered (`ncclCommRegister`).
    registered: register::Registrations,
    /// The windows (`ncclCommWindowRegister`) and the symmetric state.
    windows: window::Windows,
    /// The deterministic mode's staging memory, where it is on.
    deterministic: Option<deterministic::Deterministic>,
    /// Buffers of captured operations registered for peers in other processes, and the marks
    /// that tell those peers when they are in.
    graph_regs: Arc<graph_reg::GraphRegs>,
    /// Ring successors in other processes whose registration tables ring sends read
    /// ([`ChannelDev::send_reach`]): brought up to date before a launch that may use them.
    ring_tables: Vec<usize>,
    /// Tree neighbours in other processes whose registration tables tree launches read: the
    /// one-node tree's ring predecessors (its way up, [`ChannelDev::prev_reach`]), the double
    /// binary tree's parents and children inside the node (`TreeDev::parent_reach`,
    /// `child_reach`). Brought up to date before a tree launch only.
    tree_tables: Vec<usize>,
    /// Per rank: its captured operations send graph-registration marks (NCCL_GRAPH_REGISTER
    /// there); a captured launch waits only for those that do.
    graph_markers: Vec<bool>,
    /// Raised by `abort`: the kernels stop waiting for peers and end.
    kernel_abort: Arc<crate::cuda::HostFlag>,
    /// The network side of a communicator spanning several nodes (None on one node).
    net: Option<Arc<NetPath>>,
    /// The order in which this communicator's splits and shrinks agree over its bootstrap.
    split_turns: Arc<turns::Turns>,
    /// This communicator's health, for RAS queries (see [`crate::ras`]).
    ras: Arc<crate::ras::Entry>,
    /// The kernel-stamps lab's memory, where NCCL_RS_KERNEL_STAMPS is set (see [`stamps`]).
    stamps: Option<stamps::KernelStamps>,
    /// This communicator's context in the profiler plugin, where one is loaded.
    profiler: Option<profile::Profiling>,
    /// Where the connection memory goes when this rank drops while other ranks of the
    /// communicator in this process may still write into it (see [`keepalive`]).
    keep: Arc<keepalive::Keep>,
    /// `Send` but not `Sync`: one thread at a time issues on a communicator (see [`NotSync`]).
    _one_thread: NotSync,
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

/// The tree's up links: per tree CTA `c`, the ConnSend array towards the predecessor on
/// channel `c`'s ring and the ConnRecv array from its successor (0 where there is none),
/// indexed by CTA; how many CTAs they serve and their FIFO slots; and what they own when they
/// are the tree's own (their links and the gathered arrays).
pub(crate) struct TreeUp {
    pub arrays: (u64, u64),
    pub ctas: usize,
    pub slot_bytes: usize,
    _own: Option<(Links, Option<(DevBuffer, DevBuffer)>)>,
}

impl Comm {
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
        create::check_args(nranks, rank, ids)?;
        let launch = Launch::for_blocking(config.blocking);
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
        // Every rank is in this process: the bootstrap stays on loopback (not the interface
        // NCCL_SOCKET_IFNAME or the default picks, nor NCCL_COMM_ID's fixed address).
        let id = crate::bootstrap::new_local_root_id()?;
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

    /// `ncclCommCuRank`: this rank's number in the communicator.
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
    /// The device this communicator's rank runs on.
    // Not `self.device`: that handle counts what it allocates as this communicator's.
    #[allow(clippy::misnamed_getters)]
    pub fn device(&self) -> &Device {
        &self.user_device
    }
    /// `ncclCommRegister`: declares `bytes` of this GPU's memory at `buff` for use in this
    /// communicator's operations; the handle is for [`Comm::deregister`]. Public as
    /// `Comm::register_raw` (unsafe) and, typed, `Comm::register`.
    pub(crate) fn register_ptr(
        &self,
        buff: crate::cuda::DevPtr,
        bytes: usize,
    ) -> Result<register::RegHandle> {
        self.check_usable()?;
        self.release_graph_regs();
        let h = self.registered.register(&self.device, buff, bytes)?;
        if self.registered.zero_copy_enabled() {
            // Peers in other processes map it; a failure to tell them only costs copies.
            if let Err(e) = self.links.export_registration(h, buff, bytes) {
                log::warn!("telling peers of registered buffer {buff:#x}: {e}");
            }
        }
        Ok(h)
    }

    /// `ncclCommDeregister`.
    pub fn deregister(&self, handle: register::RegHandle) -> Result<()> {
        self.registered.deregister(handle)?;
        if let Err(e) = self.links.withdraw_registration(handle) {
            log::warn!("telling peers of a deregistered buffer: {e}");
        }
        Ok(())
    }

    /// What a collective of `bytes` (NCCL's nBytes: AllGather's whole output, ReduceScatter's
    /// whole input, else one rank's buffer) runs with here, as the tuner picks it (what
    /// `NCCL_DEBUG=INFO` with `NCCL_DEBUG_SUBSYS=TUNING` logs for each call).
    pub fn tuning(&self, coll: crate::Coll, bytes: usize) -> Result<crate::TuningChoice> {
        self.tuner.choose(coll, bytes)
    }
    /// Device memory this communicator allocated at init (cuMemGetInfo before and after).
    pub fn init_device_bytes(&self) -> usize {
        self.init_bytes
    }

    /// Device memory this communicator holds now (`ncclCommMemStats`): every buffer it
    /// allocated and has not freed (its connections', windows' symmetric state, device
    /// communicators'), not the user's buffers nor peers' memory it maps.
    pub fn device_memory(&self) -> usize {
        self.memory.load(Ordering::Relaxed)
    }

    /// Whether the tuner leaves `coll` some algorithm and protocol (NCCL_ALGO / NCCL_PROTO).
    pub(crate) fn leaves_some(&self, coll: Coll) -> Result<()> {
        self.tuner.leaves_some(coll)
    }

    /// Whether `peer`'s captured operations send graph-registration marks (NCCL_GRAPH_REGISTER
    /// there): a captured send waits only for those that do.
    pub(crate) fn graph_marks_from(&self, peer: usize) -> bool {
        self.graph_markers.get(peer).copied().unwrap_or(false)
    }

    /// The kernels' abort flag (its device address), raised by `abort`.
    pub(crate) fn kernel_abort_ptr(&self) -> u64 {
        self.kernel_abort.ptr
    }

    pub(crate) fn check_usable(&self) -> Result<()> {
        if self.is_revoked() {
            return Err(Error::invalid_usage(
                "the communicator was revoked (ncclCommRevoke): only ncclCommShrink, \
                 ncclCommSplit, ncclCommDestroy and ncclCommAbort may follow",
            ));
        }
        if self.aborted.load(Ordering::Acquire) {
            return Err(Error::invalid_usage("the communicator was aborted"));
        }
        match self.suspendable.phase() {
            Phase::Active => {}
            Phase::Suspended => {
                return Err(Error::invalid_usage(
                    "the communicator is suspended (ncclCommSuspend): ncclCommResume first",
                ))
            }
            Phase::Broken => {
                return Err(Error::invalid_usage(
                    "a suspend or resume of the communicator failed part-way: only \
                     ncclCommDestroy and ncclCommAbort may follow",
                ))
            }
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

    /// The error raised in the background (a peer gone, a network failure), if any.
    fn raised_error(&self) -> Result<()> {
        match &*self.async_error.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// `ncclCommGetAsyncError`: Ok, or the error an operation raised in the background.
    pub fn get_async_error(&self) -> Result<()> {
        // A non-blocking group still issuing (InProgress) or failed comes first.
        self.order.background.state()?;
        self.raised_error()
    }

    /// What `ncclCommGetAsyncError` reports: `InProgress` while a non-blocking group still
    /// issues this communicator's operations in the background, then `Success`, or the code
    /// of the error a group or operation raised in the background.
    pub fn async_state(&self) -> NcclResult {
        match self.get_async_error() {
            Ok(()) => NcclResult::Success,
            Err(e) => e.code,
        }
    }

    /// Waits until no non-blocking group issues this communicator's operations any more; Ok,
    /// or the error the last one ended with.
    pub fn wait_group(&self) -> Result<()> {
        self.order.background.wait()
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
    /// in the background. After a fault (a peer gone, a network error) it returns that error
    /// instead of waiting for ranks that may never come.
    pub fn finalize(&self) -> Result<()> {
        if self.is_revoked() {
            return Err(Error::invalid_argument(
                "ncclCommFinalize: the communicator was revoked (destroy or abort it)",
            ));
        }
        self.check_usable()?;
        self.flush()?;
        self.raised_error()
            .map_err(|e| e.context(format!("rank {}: finalize", self.rank)))?;
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
    /// finalize) and frees everything; after a fault (a peer gone) it frees all the same and
    /// returns that error. Dropping a `Comm` does the same, ignoring errors.
    pub fn destroy(self) -> Result<()> {
        let r = if self.is_finalized() || self.aborted.load(Ordering::Acquire) {
            Ok(())
        } else {
            self.flush().and_then(|()| self.raised_error())
        };
        self.finalized.store(true, Ordering::Release);
        drop(self);
        r
    }

    /// `ncclCommAbort`: stops the bootstrap so no later call waits on a peer, even a dead one;
    /// later operations are invalid usage. The memory is released when the communicator drops
    /// (without waiting for outstanding operations). From another thread, use an
    /// [`AbortHandle`] ([`Comm::abort_handle`]).
    pub fn abort(&self) {
        self.abort_handle().abort();
    }

    /// A handle that aborts this communicator or reads its async error from any thread (a
    /// watchdog's, while this one is blocked in the communicator's work).
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle::of(self)
    }

    /// What `NCCL_SHRINK_ABORT` asks before a shrink: the kernels in flight stop waiting on
    /// peers and return, and later operations are invalid usage, but the bootstrap stays open
    /// for the shrink's own messages.
    pub(crate) fn stop_operations(&self) {
        self.abort_handle().stop_operations();
    }

    /// Whether `abort` was called.
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
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
        // A fault notice thread may keep the bootstrap a moment longer: it must not reach
        // this communicator's flag and error slot any more.
        self.bootstrap.unwatch();
        // Our kernels are done, but a peer's in this process may still write into our
        // connection memory: it goes with the last member in this process.
        self.keep.leave(std::mem::take(&mut self.ring_resources));
        if let Some(t) = self.tree_up.take() {
            self.keep.leave(t);
        }
        if let Some(t) = self.dbt.take() {
            self.keep.leave(t);
        }
        if let Some(p) = self.pat.take() {
            self.keep.leave(p);
        }
        if let Some(d) = self.deterministic.take() {
            self.keep.leave(d);
        }
        // Peers' NVLS kernels may still reach our scratch through the multicast mapping.
        if let Some(n) = self.nvls.take() {
            self.keep.leave(n);
        }
        self.keep.leave(self.links.clone());
    }
}

/// The bytes of plain-data ABI structures, for copying them to the device.
fn as_bytes<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: T is a #[repr(C)] ABI structure of plain integers (no padding holes read as
    // uninitialised: every ABI type pads explicitly).
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}
