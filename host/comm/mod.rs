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
mod config;
pub(crate) mod graph_reg;
pub(crate) mod group_scope;
mod keepalive;
mod net;
pub(crate) mod nvls;
pub mod order;
mod peer;
mod pending;
pub mod register;
pub mod rings;
mod shared;
mod split;
mod stamps;
mod transports;
mod tree;
pub mod tuning;
mod turns;

pub use abort_handle::AbortHandle;
pub use config::{Config, ResolvedConfig, SPLIT_NOCOLOR};
pub use pending::{Launch, PendingComm};
pub use split::{SHRINK_ABORT, SHRINK_DEFAULT};

use crate::bootstrap::{AbortFlag, Bootstrap, UniqueId};
use crate::cuda::{DevBuffer, Device, Kernel};
use crate::error::{Error, NcclResult, Result};
use crate::graph::Transport;
use crate::transport::links::{Dir, Links};
use crate::transport::net::setup::NetPath;
use crate::transport::p2p::{Layout, P2p, PeerAddr};
use crate::transport::shm::ShmRing;
use nccl_device::abi::{ChannelDev, Coll, DevComm, MAX_CHANNELS, MAX_P2P_ITEMS};
use nccl_device::ops::RedOpKind;
use nccl_device::types::DataType;
use net::{fault_sink, net_fault_sink, net_path, nodes, ring_net};
use peer::PeerInfo;
use rings::Rings;
pub(crate) use shared::{NotSync, Shared};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Launch shape and buffer sizes, decided by rank 0's parameters so every rank agrees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Channels (CTAs) per collective.
    pub nchannels: u32,
    /// Threads per CTA.
    pub nthreads: u32,
    /// Bytes of one FIFO slot (a step) of the Simple protocol.
    pub slot_bytes: u32,
    /// NCCL_ALGO and NCCL_PROTO as [`crate::tune::Filter`] masks.
    pub algo_mask: u64,
    /// NCCL_PROTO as a [`crate::tune::Filter`] mask.
    pub proto_mask: u64,
    /// Connections per peer of send/recv and of the tree's up links (CTAs per message); 0:
    /// from the communicator's size.
    pub p2p_conns: u32,
    /// Bytes of one FIFO slot of those connections (a step of a send/recv).
    pub p2p_slot_bytes: u32,
    /// FIFO slots one Simple ring step fills (NCCL's slice steps); 0: NCCL's choice per
    /// collective ([`Shape::slice_steps_for`]).
    pub slice_steps: u32,
    /// The kernels' `FLAG_*` bits ([`nccl_device::abi::CollArgs::flags`]).
    pub kernel_flags: u32,
    /// Channels when the ranks span several nodes: every channel's ring crosses the network
    /// once per node, on connections of its own (`NET_CHANNELS`; NCCL's search over one NIC
    /// per node gives two). NCCL_MIN_NCHANNELS raises it and NCCL_MAX_NCHANNELS caps it.
    pub net_nchannels: u32,
    /// CTAs a ring AllReduce, AllGather or Broadcast runs on when every rank's output is
    /// registered (zero-copy over p2p): [`nccl_device::abi::CollArgs::reg_ctas`]; 0 (the
    /// default): as many as unregistered (NCCL_RS_REGISTERED_CTAS).
    pub reg_ctas: u32,
}

/// Channels across nodes on GPUs unless NCCL_MIN/MAX_NCHANNELS say otherwise (see
/// [`Shape::net_nchannels`]). Each is a ring of its own socket connections: on one H100 as 2
/// nodes over loopback, 256 MiB AllReduce moved 4.5 GB/s busbw with 2, 8.2 with 8, 8.9 with 16
/// and 8.5 with 32, and 8 was best at 1 and 16 MiB (NCCL's sockets: 2.3-2.7 in the same runs;
/// results/h100-nodes2-channels.txt). The simulator keeps 2 (threads are its cores).
const NET_CHANNELS: i64 = 8;
const SIM_NET_CHANNELS: i64 = 2;

impl Shape {
    /// From this process's parameters for `device`, the channels bounded by the config's
    /// minCTAs / maxCTAs.
    fn from_env(device: &Device, config: &ResolvedConfig) -> Result<Shape> {
        use crate::env::{self as e, Param};
        let env = |p: Param| p.int();
        let sim = device.is_sim();
        let buff = match crate::env::BUFFSIZE.raw() {
            Some(_) => env(e::BUFFSIZE),
            None if sim => env(e::RS_SIM_BUFFSIZE),
            None => env(e::BUFFSIZE),
        };
        if !(8 * 1024..=(1 << 30)).contains(&buff) {
            return Err(Error::invalid_argument(format!(
                "NCCL_BUFFSIZE={buff}: use 8 KiB to 1 GiB"
            )));
        }
        let slot = (buff as u32 / nccl_device::abi::NCCL_STEPS) & !127;
        let nthreads = if sim {
            env(e::RS_SIM_NTHREADS)
        } else {
            env(e::NTHREADS)
        };
        let most = crate::cuda::MAX_THREADS as i64;
        if !(1..=most).contains(&nthreads) || (!sim && nthreads % 32 != 0) {
            return Err(Error::invalid_argument(format!(
                "NCCL_NTHREADS={nthreads}: use a multiple of 32 up to {most}"
            )));
        }
        // 32 channels: measured 333 GB/s at 2 GiB on 4xH200 against 286 with 16 (NCCL: 362).
        let auto = if sim { 2 } else { 32 };
        let (min, max) = (env(e::MIN_NCHANNELS), env(e::MAX_NCHANNELS));
        let mut n = auto;
        if max > 0 {
            n = n.min(max);
        }
        if min > 0 {
            n = n.max(min);
        }
        // Across nodes NCCL_MIN_NCHANNELS raises the default and NCCL_MAX_NCHANNELS caps it,
        // as inside a node (a minimum of 4 is 4 rings, not the 32 of NVLink).
        let mut net_n = if sim { SIM_NET_CHANNELS } else { NET_CHANNELS }.max(min);
        if max > 0 {
            net_n = net_n.min(max);
        }
        let n = config.bound_channels(n.clamp(1, MAX_CHANNELS as i64) as u32);
        let net_nchannels = config.bound_channels(net_n.clamp(1, MAX_CHANNELS as i64) as u32);
        let (algo_mask, proto_mask) = tuning::filter_masks()?;
        let (conns_var, conns_max) = match sim {
            true => (e::RS_SIM_P2P_CONNS, 8),
            false => (e::RS_P2P_CONNS, MAX_P2P_ITEMS as i64 / 4),
        };
        let p2p_conns = env(conns_var);
        if !(0..=conns_max).contains(&p2p_conns) {
            return Err(Error::invalid_argument(format!(
                "{}={p2p_conns}: use 1 to {conns_max} (0: 64 / nranks, up to 16)",
                conns_var.name
            )));
        }
        // NCCL_P2P_NVL_CHUNKSIZE as in NCCL, 512 KiB on GPUs by default: 2xH200 sendrecv at
        // 512 MiB moved 261 GB/s with 128 KiB slots, 312 with 256 KiB, 323 with 512 KiB
        // (NCCL: 353; results/h200x2-sendrecv-*). The simulator's: a quarter of its ring slot.
        let p2p_slot = match crate::env::P2P_NVL_CHUNKSIZE.raw() {
            Some(_) => env(e::P2P_NVL_CHUNKSIZE),
            None if sim => (slot as i64 / 4).max(4096),
            None => 512 * 1024,
        };
        if !(4096..=(1 << 24)).contains(&p2p_slot) || p2p_slot % 128 != 0 {
            return Err(Error::invalid_argument(format!(
                "NCCL_P2P_NVL_CHUNKSIZE={p2p_slot}: use a multiple of 128 from 4 KiB to 16 MiB"
            )));
        }
        // A slice must divide the FIFO's NCCL_STEPS = 8 slots and leave room for a second.
        let slice_steps = env(e::RS_SLICE_STEPS);
        if ![0, 1, 2, 4].contains(&slice_steps) {
            return Err(Error::invalid_argument(format!(
                "NCCL_RS_SLICE_STEPS={slice_steps}: use 1, 2 or 4 (0: by collective)"
            )));
        }
        let switch = |p: Param, flag: u32| match env(p) {
            0 => Ok(0),
            1 => Ok(flag),
            v => Err(Error::invalid_argument(format!("{}={v}: use 0 or 1", p.name))),
        };
        // They travel with rank 0's shape, so every rank agrees on them.
        let kernel_flags = switch(
            e::RS_SIMPLE_PUBLISHER,
            nccl_device::abi::FLAG_SIMPLE_PUBLISHER,
        )? | switch(
            e::RS_RING_EXCHANGE,
            nccl_device::abi::FLAG_RING_EXCHANGE,
        )? | switch(
            e::RS_TREE_EXCHANGE,
            nccl_device::abi::FLAG_TREE_EXCHANGE,
        )?;
        // Off by default: on 4 H100s a registered call's busbw fell with its CTAs (64 MiB
        // AllReduce 301 GB/s on 32, 267 on 16; 256 MiB AllGather 328 on 32, 209 on 8, 30 on 1;
        // results/h100x4-registered-fewer-ctas.txt): a CTA's loads and stores over NVLink move
        // about what its FIFO copies did.
        let reg_ctas = env(e::RS_REGISTERED_CTAS);
        if !(0..=MAX_CHANNELS as i64).contains(&reg_ctas) {
            return Err(Error::invalid_argument(format!(
                "NCCL_RS_REGISTERED_CTAS={reg_ctas}: use 0 (as many as unregistered calls) to {MAX_CHANNELS}"
            )));
        }
        let reg_ctas = reg_ctas as u32;
        Ok(Shape {
            nchannels: n,
            nthreads: nthreads as u32,
            slot_bytes: slot,
            algo_mask,
            proto_mask,
            p2p_conns: p2p_conns as u32,
            p2p_slot_bytes: p2p_slot as u32,
            slice_steps: slice_steps as u32,
            kernel_flags,
            net_nchannels,
            reg_ctas,
        })
    }

    /// Checks a shape that came from a peer (rank 0's rules every rank) against the ranges
    /// `from_env` allows, so that a corrupt or hostile record cannot make this rank allocate
    /// without bound or index past its arrays.
    pub(crate) fn check_from_peer(&self, rank: usize) -> Result<()> {
        let max_slot = (1u32 << 30) / nccl_device::abi::NCCL_STEPS;
        let bad = |what: &str, v: u64| {
            Err(Error::remote(format!(
                "rank {rank} sent a peer record with {what} = {v}, out of range"
            )))
        };
        let ch = 1..=MAX_CHANNELS as u32;
        if !ch.contains(&self.nchannels) {
            return bad("nchannels", self.nchannels.into());
        }
        if !ch.contains(&self.net_nchannels) {
            return bad("net_nchannels", self.net_nchannels.into());
        }
        if !(1..=crate::cuda::MAX_THREADS).contains(&self.nthreads) {
            return bad("nthreads", self.nthreads.into());
        }
        if !(128..=max_slot).contains(&self.slot_bytes) || !self.slot_bytes.is_multiple_of(128) {
            return bad("slot_bytes", self.slot_bytes.into());
        }
        if self.p2p_conns > (MAX_P2P_ITEMS / 4) as u32 {
            return bad("p2p_conns", self.p2p_conns.into());
        }
        if !(4096..=(1 << 24)).contains(&self.p2p_slot_bytes)
            || !self.p2p_slot_bytes.is_multiple_of(128)
        {
            return bad("p2p_slot_bytes", self.p2p_slot_bytes.into());
        }
        if ![0, 1, 2, 4].contains(&self.slice_steps) {
            return bad("slice_steps", self.slice_steps.into());
        }
        if self.reg_ctas > MAX_CHANNELS as u32 {
            return bad("reg_ctas", self.reg_ctas.into());
        }
        use nccl_device::abi::{FLAG_RING_EXCHANGE, FLAG_SIMPLE_PUBLISHER, FLAG_TREE_EXCHANGE};
        let known = FLAG_SIMPLE_PUBLISHER | FLAG_RING_EXCHANGE | FLAG_TREE_EXCHANGE;
        if self.kernel_flags & !known != 0 {
            return bad("kernel_flags", self.kernel_flags.into());
        }
        Ok(())
    }

    /// FIFO slots a Simple ring step of `coll` fills at once. As NCCL: two for AllReduce,
    /// AllGather and ReduceScatter (a 1 MiB step with the default 4 MiB buffer), one for the
    /// chains of Broadcast and Reduce, whose first bytes reach the last rank sooner so.
    pub fn slice_steps_for(&self, coll: nccl_device::abi::Coll) -> u32 {
        use nccl_device::abi::Coll;
        match (self.slice_steps, coll) {
            (0, Coll::Broadcast | Coll::Reduce) => 1,
            (0, _) => 2,
            (n, _) => n,
        }
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
    /// The tree's up connections, when NCCL_ALGO allows the tree on one node: see [`TreeUp`].
    pub(crate) tree_up: Option<TreeUp>,
    /// Across nodes, the double binary tree's connections when NCCL_ALGO allows the tree
    /// (then `tree_up` is None): see [`tree`].
    pub(crate) dbt: Option<tree::Dbt>,
    /// NVLS's multicast scratch, where the user set NCCL_NVLS_ENABLE to 1 and the GPUs allow it.
    pub(crate) nvls: Option<nvls::Nvls>,
    /// Every channel's ring, alike on every rank (rank 0's).
    rings: Rings,
    /// Keeps this communicator's launches in issue order across streams.
    pub(crate) order: Arc<order::StreamOrder>,
    /// DevComm followed by its ChannelDev array, in device memory.
    pub(crate) dev_comm: DevBuffer,
    _p2p: Option<P2p>,
    /// The ring's connections through host shared memory (neighbours p2p does not reach).
    _shm: Option<ShmRing>,
    kernels: Mutex<HashMap<(Coll, DataType, RedOpKind), Kernel>>,
    /// Set by `abort` (shared with [`AbortHandle`]s).
    aborted: Arc<AtomicBool>,
    /// Device memory this communicator took at init (bytes), for reports.
    pub(crate) init_bytes: usize,
    config: ResolvedConfig,
    /// Set by `abort`; also stops a split child's creation.
    abort_flag: AbortFlag,
    /// After `finalize` (or `destroy`'s flush): no more operations.
    finalized: AtomicBool,
    /// An error raised outside any call (`ncclCommGetAsyncError`).
    async_error: Arc<Mutex<Option<Error>>>,
    /// Buffers the user registered (`ncclCommRegister`).
    pub(crate) registered: register::Registrations,
    /// Buffers of captured operations registered for peers in other processes, and the marks
    /// that tell those peers when they are in.
    pub(crate) graph_regs: Arc<graph_reg::GraphRegs>,
    /// Ring successors in other processes whose registration tables ring sends read
    /// ([`ChannelDev::send_reach`]): brought up to date before a launch that may use them.
    pub(crate) ring_tables: Vec<usize>,
    /// Tree neighbours in other processes whose registration tables tree launches read: the
    /// one-node tree's ring predecessors (its way up, [`ChannelDev::prev_reach`]), the double
    /// binary tree's parents and children inside the node (`TreeDev::parent_reach`,
    /// `child_reach`). Brought up to date before a tree launch only.
    pub(crate) tree_tables: Vec<usize>,
    /// Per rank: its captured operations send graph-registration marks (NCCL_GRAPH_REGISTER
    /// there); a captured launch waits only for those that do.
    pub(crate) graph_markers: Vec<bool>,
    /// Raised by `abort`: the kernels stop waiting for peers and end.
    pub(crate) kernel_abort: Arc<crate::cuda::HostFlag>,
    /// The network side of a communicator spanning several nodes (None on one node).
    pub(crate) net: Option<Arc<NetPath>>,
    /// The order in which this communicator's splits and shrinks agree over its bootstrap.
    pub(crate) split_turns: Arc<turns::Turns>,
    /// This communicator's health, for RAS queries (see [`crate::ras`]).
    pub(crate) ras: Arc<crate::ras::Entry>,
    /// The kernel-stamps lab's memory, where NCCL_RS_KERNEL_STAMPS is set (see [`stamps`]).
    pub(crate) stamps: Option<stamps::KernelStamps>,
    /// Where the connection memory goes when this rank drops while other ranks of the
    /// communicator in this process may still write into it (see [`keepalive`]).
    keep: Arc<keepalive::Keep>,
    /// `Send` but not `Sync`: one thread at a time issues on a communicator (see [`NotSync`]).
    pub(crate) _one_thread: NotSync,
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

/// Connects the tree's up direction (the reverse of each tree CTA's ring, as send/recv links)
/// when the filters allow the tree: every rank does it at init, so no collective waits on a
/// handshake. There is a tree CTA per channel: CTA `c` runs the chain of channel `c`'s ring,
/// rooted at its position 0; it sends up to its predecessor there and receives from its
/// successor.
///
/// When every channel has the same ring and the send/recv links have a connection per channel
/// and `slot_bytes`-byte slots, the up links are those to the two neighbours, shared with
/// ncclSend/ncclRecv. Otherwise they are links of the tree's own (`own(n)` makes links of `n`
/// connections per peer; with one link per CTA, 4xH200 ran the tree on 4 CTAs at 0.16 of
/// NCCL's busbw); where the channels' rings differ, CTA `c` takes connection `c` of its own
/// peer, gathered into one array per direction. Every rank decides alike (the rings are rank
/// 0's), so both ends of every link take the same path.
fn connect_tree(
    rank: usize,
    links: &Links,
    shape: &Shape,
    rings: &Rings,
    slot_bytes: usize,
    own: impl FnOnce(usize) -> Links,
) -> Result<Option<TreeUp>> {
    use crate::transport::links::Dir;
    use crate::tune::{Algo, AlgoFilter, Coll};
    let nranks = rings.nranks();
    let allowed =
        AlgoFilter::from_mask(shape.algo_mask).allows(Coll::AllReduce, Algo::Tree as usize);
    if nranks == 1 || !allowed {
        return Ok(None);
    }
    let ctas = (shape.nchannels as usize).max(1);
    // Per CTA: (predecessor to send up to, successor to receive from).
    let ups: Vec<(Option<usize>, Option<usize>)> = (0..ctas)
        .map(|c| {
            let pos = rings.position(c, rank);
            let (prev, next) = rings.peers(c, rank);
            (
                (pos > 0).then_some(prev),
                (pos + 1 < nranks).then_some(next),
            )
        })
        .collect();
    let picks = |ups: &[(Option<usize>, Option<usize>)]| {
        let send: Vec<_> = ups.iter().map(|u| u.0.map(|p| (p, Dir::Send))).collect();
        let recv: Vec<_> = ups.iter().map(|u| u.1.map(|p| (p, Dir::Recv))).collect();
        (send, recv)
    };
    let connect = |links: &Links, needs: Vec<(usize, Dir)>| -> Result<()> {
        let started = links.start(&needs)?;
        links
            .finish(started)
            .map_err(|e| e.context("tree connections"))
    };
    // Connection 0 of the neighbours' links: an array of a connection per CTA.
    let first_conns = |links: &Links| -> Result<(u64, u64)> {
        let (send, recv) = picks(&ups[..1]);
        connect(links, send.iter().chain(&recv).flatten().copied().collect())?;
        let conn = |pick: Option<(usize, Dir)>| match pick {
            Some((peer, dir)) => links.conn(peer, dir, 0),
            None => Ok(0),
        };
        Ok((conn(send[0])?, conn(recv[0])?))
    };
    let one_ring = (0..ctas).all(|c| rings.index_of(c) == rings.index_of(0));
    if one_ring && links.nconns >= ctas && links.slot_bytes == slot_bytes {
        return Ok(Some(TreeUp {
            arrays: first_conns(links)?,
            ctas,
            slot_bytes: links.slot_bytes,
            _own: None,
        }));
    }
    let tree_links = own(ctas);
    let slot_bytes = tree_links.slot_bytes;
    if one_ring {
        let arrays = first_conns(&tree_links)?;
        return Ok(Some(TreeUp {
            arrays,
            ctas,
            slot_bytes,
            _own: Some((tree_links, None)),
        }));
    }
    let (send, recv) = picks(&ups);
    connect(
        &tree_links,
        send.iter().chain(&recv).flatten().copied().collect(),
    )?;
    let send_arr = tree_links.gather(&send)?;
    let recv_arr = tree_links.gather(&recv)?;
    Ok(Some(TreeUp {
        arrays: (send_arr.ptr, recv_arr.ptr),
        ctas,
        slot_bytes,
        _own: Some((tree_links, Some((send_arr, recv_arr)))),
    }))
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
            Duration::from_millis(crate::env::BOOTSTRAP_TIMEOUT_MS.int().max(1) as u64);
        let bootstrap = Arc::new(
            Bootstrap::init_scalable(ids, rank, nranks, timeout, abort).map_err(|e| {
                // Most of its errors name the bootstrap already ("bootstrap rank 1: ..."):
                // no second "bootstrap: " in front of them.
                if e.message.starts_with("bootstrap") {
                    e
                } else {
                    e.context("bootstrap")
                }
            })?,
        );
        let me = PeerInfo::local(rank, &device, shape)?;
        let peers = PeerInfo::exchange(&bootstrap, &me)?;
        // P2P, SHM or NET for every pair, alike on every rank.
        let system = tuning::node_system(rank, &device, &peers)?;
        let own_row = transports::own_row(rank, &device, &peers, &system)?;
        let transports = transports::Transports::agree(&bootstrap, &own_row)?;
        let mut shape = peers[0].shape; // rank 0's parameters rule, so every rank launches alike
        if transports.any(Transport::Net) || transports.any(Transport::Shm) {
            // The kernels' agreement on fewer CTAs runs over p2p counter lines only: every
            // ring connection must be one (this matrix is every rank's).
            shape.reg_ctas = 0;
        }
        if transports.any(Transport::Net) {
            // Across nodes (or with p2p and SHM off on one).
            shape.nchannels = shape.net_nchannels;
        }
        if transports.any(Transport::Shm) {
            // Host memory carries these rings: as across nodes, the channels NCCL's search
            // finds over such paths (two), not NVLink's 32 sets of pinned FIFOs.
            shape.nchannels = shape.net_nchannels;
        }
        // A peer gone (seen by the bootstrap, by us or another rank) and the network's errors
        // become the communicator's async error and stop the kernels.
        let async_error: Arc<Mutex<Option<Error>>> = Arc::default();
        let kernel_abort = Arc::new(device.alloc_host_flag()?);
        let on_fault = fault_sink(rank, &async_error, &kernel_abort);
        bootstrap.watch({
            let f = on_fault.clone();
            move |e| f(e)
        });
        let choice = net::Choice {
            name: config.net_name.as_deref(),
            comm_id: net::comm_id(&ids[0].internal),
            traffic_class: config.traffic_class,
        };
        // This GPU's position among its node's (the node's topology numbers them so).
        let local = peers
            .iter()
            .filter(|p| p.host_hash == peers[rank].host_hash && p.rank < peers[rank].rank)
            .count();
        let on_net_error = net_fault_sink(on_fault, &bootstrap);
        let net_path = net_path(
            transports.remote(rank),
            &device,
            &choice,
            on_net_error,
            &system,
            local,
        )?;
        // Across nodes the tuner models the network: the node count and the NICs' speed.
        let nodes_of = nodes(&peers);
        let net_model = net_path
            .as_ref()
            .filter(|_| nodes_of.len() > 1)
            .map(|np| tuning::NetModel::of(&*np.net, nodes_of.len(), shape.nchannels as usize));
        let (mut tuner, graphs) = tuning::build(rank, &device, system, &peers, &shape, net_model)
            .map_err(|e| e.context("tuning"))?;
        if tuner.agree(&bootstrap.allgather(&tuner.facts())?)? {
            log::warn!("rank {rank}: topology or tuning differs from rank 0's; using rank 0's");
            tuner.log();
        }
        // Channel c runs on rank 0's ring c (NCCL_RINGS, else the search's), repeated cyclically.
        let rings = rings::agree(&bootstrap, &graphs, &nodes_of, shape.nchannels as usize)
            .map_err(|e| e.context("rings"))?;
        let nch = shape.nchannels as usize;
        let ring_peers: Vec<(usize, usize)> = (0..nch).map(|c| rings.peers(c, rank)).collect();
        let (free_before, _) = device.mem_info()?;
        let layout = Layout::new(shape.nchannels as usize, shape.slot_bytes as usize);
        let addrs: Vec<PeerAddr> = peers
            .iter()
            .map(|p| PeerAddr {
                device: p.device,
                same_process: p.same_process(&me),
                transport: transports.between(rank, p.rank as usize),
            })
            .collect();
        let remote = |r: usize| net_path.as_ref().is_some_and(|n| n.remote[r]);
        if transports.any(Transport::Net) {
            // A proxy sends a step slot by slot, each slot spaced by the connection's stride:
            // one slot per Simple step (every rank knows every pair's transport, so all agree).
            shape.slice_steps = 1;
        }
        // Before the connection exchange, so every member in this process joins before any
        // can leave.
        let keep = keepalive::join(net::comm_id(&ids[0].internal));
        let p2p = if nranks > 1 {
            Some(P2p::setup(
                &device,
                &bootstrap,
                &addrs,
                &ring_peers,
                &|r: usize| remote(r) || transports.between(rank, r) == Transport::Shm,
                layout,
            )?)
        } else {
            None
        };
        // Ring neighbours on this node that p2p does not reach meet in host shared memory.
        let is_shm = |r: usize| r != rank && transports.between(rank, r) == Transport::Shm;
        let devices: Vec<i32> = peers.iter().map(|p| p.device).collect();
        let shm = if (0..nranks).any(is_shm) {
            let slot = shape.slot_bytes as usize;
            Some(ShmRing::setup(
                &device,
                &bootstrap,
                &ring_peers,
                &is_shm,
                slot,
                &devices,
            )?)
        } else {
            None
        };
        let ring_conns = match &net_path {
            Some(np) => ring_net(rank, np, &device, &bootstrap, &ring_peers, &shape)?,
            None => Vec::new(),
        };
        // Send/receive connections, made on first use: a few per peer (more CTAs per message
        // on GPUs), with FIFO slots of NCCL_P2P_NVL_CHUNKSIZE.
        let order = Arc::new(order::StreamOrder::new(device.clone()));
        // 64 CTAs' worth spread over the peers, at most 16 per peer: a launch then covers
        // half the distances (MAX_P2P_ITEMS / 2 CTAs per direction), so an all-to-all takes
        // two launches. With 4 per peer, 2xH200 sendrecv moved 90 GB/s against NCCL's 354 at
        // 512 MiB (each CTA ~22 GB/s); on 4xH200 at 512 MiB, 8 per peer (32 / nranks) moved
        // 279 GB/s and 16 per peer 317-322 (NCCL: 350; results/h200x4-sendrecv-*conns*).
        let nconns = match shape.p2p_conns {
            0 => (MAX_P2P_ITEMS / nranks).clamp(1, MAX_P2P_ITEMS / 4),
            n => n as usize,
        };
        // The tree's up links step with a quarter of the ring's slot (its halves pipeline
        // through them); they are the send/recv links only where those have that slot.
        let tree_slot = (shape.slot_bytes as usize / 4).max(4096);
        // Makes links like the communicator's, with `n` connections per peer and `slot`-byte
        // FIFO slots.
        let make_links = {
            let (device, bootstrap, addrs) = (device.clone(), bootstrap.clone(), addrs.clone());
            let net = net_path.clone();
            // A communicator being dropped has waited for its kernels: nothing to fence.
            let order = Arc::downgrade(&order);
            let fences: crate::transport::links::Fences =
                Arc::new(move || order.upgrade().map_or(Ok(None), |o| o.fence()));
            move |n, slot| {
                Links::new(rank, device, bootstrap, addrs, n, slot, net.clone())
                    .with_fences(fences.clone())
            }
        };
        let links = Arc::new(make_links.clone()(nconns, shape.p2p_slot_bytes as usize));
        // Zero-copy ring and tree collectives: their connections to peers of this node through
        // p2p take the handshake (both ends judge a pair alike from the agreed transport), and
        // a send reaches the peer's registered buffers as send/recv does
        // (`Links::direct_reach`).
        let p2p_peer =
            |r: usize| r != rank && !remote(r) && transports.between(rank, r) == Transport::P2p;
        let (mut ring_tables, mut tree_tables) = (Vec::new(), Vec::new());
        // How a send to ring or tree neighbour `peer` reaches the buffers it offers (a peer in
        // another process joins `tables`, whose records a registered launch drains first).
        let reach_of = |peer: usize, tables: &mut Vec<usize>| match p2p_peer(peer) {
            false => nccl_device::abi::DIRECT_OFF,
            true => match links.direct_reach(peer) {
                Ok(Some(reach)) => {
                    if !addrs[peer].same_process && !tables.contains(&peer) {
                        tables.push(peer);
                    }
                    reach
                }
                // Still the handshake (the peer expects it), never direct.
                Ok(None) => nccl_device::abi::DIRECT_DECLINE,
                Err(e) => {
                    log::warn!("rank {rank}: rank {peer}'s registered buffers: {e}");
                    nccl_device::abi::DIRECT_DECLINE
                }
            },
        };
        // On one node the tree is the chain in ring order; across nodes NCCL's double binary
        // tree, each channel on links of its own with the same slots.
        let (tree_up, dbt) = if nodes_of.len() > 1 {
            use crate::tune::{Algo, AlgoFilter, Coll};
            let allowed =
                AlgoFilter::from_mask(shape.algo_mask).allows(Coll::AllReduce, Algo::Tree as usize);
            let dbt = match allowed {
                true => {
                    let trees = crate::graph::dbt_channels(&nodes_of, nch);
                    let np = net_path.as_deref();
                    // The tree's steps may be LL (one peer per step): its links inside the
                    // node get LL FIFOs (network connections carry every protocol).
                    let mut reach = |peer: usize| reach_of(peer, &mut tree_tables);
                    let made = tree::connect_dbt(
                        rank,
                        &device,
                        &trees,
                        &nodes_of,
                        &addrs,
                        np,
                        &mut reach,
                        |c| make_links.clone()(1, tree_slot).keyed(c as u32).with_ll(),
                    );
                    Some(made.map_err(|e| e.context("tree connections"))?)
                }
                false => None,
            };
            (None, dbt)
        } else {
            let up = connect_tree(rank, &links, &shape, &rings, tree_slot, |n| {
                make_links(n, tree_slot)
            })?;
            (up, None)
        };

        // NVLS: only where the user set NCCL_NVLS_ENABLE to 1 on every rank (see nvls.rs), after every rank
        // agreed on the tuner (all of them decide alike here).
        let all_p2p = !transports.any(Transport::Net) && !transports.any(Transport::Shm);
        let nvls = nvls::setup(
            rank,
            &device,
            &bootstrap,
            &peers,
            all_p2p,
            shape.nchannels as usize,
        )
        .map_err(|e| e.context("NVLS setup"))?;
        tuner.set_nvls(nvls.is_some());
        tuner.set_ring_exchange(shape.kernel_flags & nccl_device::abi::FLAG_RING_EXCHANGE != 0);
        tuner.set_tree_exchange(dbt.as_ref().is_some_and(|d| d.exchanges(&shape)));

        let head = std::mem::size_of::<DevComm>().next_multiple_of(16);
        // DevComm, the channels, then each distinct ring as ranks (channels share them).
        let ring_at = head + nch * std::mem::size_of::<ChannelDev>();
        let ring_words: Vec<u32> = rings
            .distinct()
            .iter()
            .flatten()
            .map(|&r| r as u32)
            .collect();
        let dev_comm = device.alloc(ring_at + ring_words.len() * 4)?;
        let mut channels = vec![ChannelDev::default(); nch];
        for (c, ch) in channels.iter_mut().enumerate() {
            let (prev, next) = ring_peers[c];
            ch.recv_direct = p2p_peer(prev) as u32;
            ch.send_reach = reach_of(next, &mut ring_tables);
            // The one-node tree's way up runs against the ring (`tree_up`: the chain, on one
            // node only).
            ch.prev_reach = match tree_up.is_some() {
                true => reach_of(prev, &mut tree_tables),
                false => nccl_device::abi::DIRECT_OFF,
            };
            ch.ring_index = rings.position(c, rank) as u32;
            ch.ring_ranks = dev_comm.ptr + (ring_at + rings.index_of(c) * nranks * 4) as u64;
            ch.ring_prev = prev as u32;
            ch.ring_next = next as u32;
            if let Some(p) = &p2p {
                let (send, recv) = p.conns(c);
                ch.send = send.unwrap_or_default();
                ch.recv = recv.unwrap_or_default();
                if send.is_some() && next != rank {
                    log::info!(
                        "Channel {c:02}/0 : {rank}[{}] -> {next}[{}] via P2P/{}",
                        device.ordinal,
                        peers[next].device,
                        if addrs[next].same_process {
                            "direct pointer"
                        } else {
                            "IPC"
                        }
                    );
                }
            }
            if let Some((send, recv)) = shm.as_ref().map(|s| s.conns(c)) {
                if let Some(s) = send {
                    ch.send = s;
                }
                if let Some(r) = recv {
                    ch.recv = r;
                }
            }
            for m in ring_conns.iter().filter(|m| m.want.key as usize == c) {
                match m.want.dir {
                    Dir::Send => ch.send = m.send,
                    Dir::Recv => ch.recv = m.recv,
                }
            }
        }
        let stamps = stamps::KernelStamps::from_env(&device, rank)?;
        let dc = DevComm {
            rank: rank as u32,
            nranks: nranks as u32,
            nchannels: shape.nchannels,
            slot_bytes: shape.slot_bytes,
            channels: dev_comm.ptr + head as u64,
            abort_flag: kernel_abort.ptr,
            nvls: nvls.as_ref().map_or(0, |n| n.chans.ptr),
            nvls_nchannels: nvls.as_ref().map_or(0, |n| n.nchannels as u32),
            lab_count: 0,
            lab_stamps: stamps.as_ref().map_or(0, |s| s.device_ptr()),
        };
        dev_comm.write(0, as_bytes(std::slice::from_ref(&dc)))?;
        dev_comm.write(head, as_bytes(&channels))?;
        dev_comm.write(ring_at, as_bytes(&ring_words))?;
        if let Some(np) = &net_path {
            np.proxy
                .add(ring_conns.into_iter().map(|m| m.conn).collect());
        }
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
        let ras = {
            let (order, slot) = (Arc::downgrade(&order), async_error.clone());
            let health = crate::ras::Health::new(
                net::comm_id(&ids[0].internal),
                rank,
                nranks,
                device.ordinal,
                config.comm_name.clone(),
                move || order.upgrade().and_then(|o| o.finished()),
                move || {
                    let e = slot.lock().unwrap_or_else(|p| p.into_inner());
                    e.as_ref().map(|e| e.to_string())
                },
            );
            crate::ras::register(Arc::new(health), &bootstrap)
        };
        // Opt-in: a peer whose process stopped (alive to TCP, silent to us) becomes a fault
        // when an operation waits on it (NCCL has no such bound).
        let hang_ms = crate::env::RS_PEER_HANG_TIMEOUT_MS.int();
        if hang_ms > 0 {
            let order = Arc::downgrade(&order);
            bootstrap.watch_hangs(Duration::from_millis(hang_ms as u64), move || {
                // Outstanding: not known to be finished (None: a launch in progress, or a
                // captured graph, whose work cannot be seen).
                order.upgrade().is_some_and(|o| o.finished() != Some(true))
            });
        }
        Ok(Comm {
            rank,
            nranks,
            device,
            shape,
            tuner,
            bootstrap,
            links,
            tree_up,
            dbt,
            nvls,
            rings,
            order,
            dev_comm,
            _p2p: p2p,
            _shm: shm,
            kernels: Mutex::new(HashMap::new()),
            aborted: Arc::new(AtomicBool::new(false)),
            init_bytes: free_before.saturating_sub(free_after),
            config,
            abort_flag: abort.clone(),
            finalized: AtomicBool::new(false),
            async_error,
            net: net_path,
            ring_tables,
            tree_tables,
            graph_markers: peers.iter().map(|p| p.graph_register).collect(),
            registered: register::Registrations::new(
                crate::env::LOCAL_REGISTER.int() != 0,
                crate::env::GRAPH_REGISTER.int() != 0,
            ),
            graph_regs: Arc::default(),
            kernel_abort,
            split_turns: Arc::default(),
            ras,
            stamps,
            keep,
            _one_thread: NotSync::default(),
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
    pub fn device(&self) -> &Device {
        &self.device
    }
    crate::internal! {
        /// The longest nap this communicator's proxy thread takes now (None without network
        /// connections): shorter once a launch that needs it was captured into a CUDA graph.
        fn proxy_max_nap(&self) -> Option<std::time::Duration> {
            self.net.as_ref().map(|n| n.proxy.max_nap())
        }
    }

    crate::internal! {
        /// A fence behind every kernel this communicator launched so far (what a peer's
        /// withdrawn mapping waits for); None when it launched none.
        fn launch_fence(&self) -> Result<Option<order::Fence>> {
            self.order.fence()
        }
    }

    crate::internal! {
        /// The bootstrap addresses of every rank, as this rank knows them.
        fn bootstrap_addresses(&self) -> Vec<std::net::SocketAddr> {
            self.bootstrap.peer_addresses()
        }
    }
    crate::internal! {
        /// The step counters of the send/recv connections to (`send`) or from `peer`, one per
        /// connection, as the kernels left them; None before the first message made them.
        fn p2p_steps(&self, peer: usize, send: bool) -> Result<Option<Vec<u64>>> {
            let dir = if send { Dir::Send } else { Dir::Recv };
            self.links.steps(peer, dir)
        }
    }
    crate::internal! {
        /// Per channel, the ring steps whose data the predecessor wrote straight into this
        /// rank's output buffer (zero-copy ring collectives), counted by the kernels since init.
        fn ring_direct_steps(&self) -> Result<Vec<u64>> {
            self.channel_words(std::mem::offset_of!(ChannelDev, direct_steps))
        }
    }
    crate::internal! {
        /// The one-node tree's chain (None across nodes, or where the tree is filtered out):
        /// how many CTAs it serves and the bytes of its up links' FIFO slots.
        fn tree_chain(&self) -> Option<(usize, usize)> {
            self.tree_up.as_ref().map(|t| (t.ctas, t.slot_bytes))
        }
    }
    crate::internal! {
        /// The double binary tree across nodes (None on one node, or where the tree is
        /// filtered out): how many CTAs it serves and the bytes of its links' FIFO slots.
        fn dbt_geometry(&self) -> Option<(usize, usize)> {
            self.dbt.as_ref().map(|d| (d.ctas, d.slot_bytes))
        }
    }
    crate::internal! {
        /// Per channel, the step counter of the ring's send connection as the kernels left it.
        fn ring_send_steps(&self) -> Result<Vec<u64>> {
            self.channel_words(
                std::mem::offset_of!(ChannelDev, send)
                    + std::mem::offset_of!(nccl_device::abi::ConnSend, step),
            )
        }
    }
    /// Per channel, the u64 at byte `at` of its `ChannelDev` in device memory.
    fn channel_words(&self, at: usize) -> Result<Vec<u64>> {
        let nch = self.shape.nchannels as usize;
        let size = std::mem::size_of::<ChannelDev>();
        let head = std::mem::size_of::<DevComm>().next_multiple_of(16);
        let mut raw = vec![0u8; nch * size];
        self.dev_comm.read(head, &mut raw)?;
        Ok(raw
            .chunks_exact(size)
            .map(|ch| u64::from_le_bytes(ch[at..at + 8].try_into().unwrap_or_default()))
            .collect())
    }
    crate::internal! {
        /// The launch shape every rank agreed on at creation.
        fn shape(&self) -> Shape {
            self.shape
        }
    }

    crate::internal! {
        /// Every channel's ring (ranks in ring order), as the kernels read it: from this rank's
        /// channel structures in device memory, checked against what init agreed.
        fn channel_rings(&self) -> Result<Vec<Vec<usize>>> {
            let nch = self.shape.nchannels as usize;
            let size = std::mem::size_of::<ChannelDev>();
            let head = std::mem::size_of::<DevComm>().next_multiple_of(16);
            let mut raw = vec![0u8; nch * size];
            self.dev_comm.read(head, &mut raw)?;
            let u32_at = |b: &[u8], i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
            let mut out = Vec::with_capacity(nch);
            for (c, ch) in raw.chunks_exact(size).enumerate() {
                let index = u32_at(ch, std::mem::offset_of!(ChannelDev, ring_index)) as usize;
                let prev = u32_at(ch, std::mem::offset_of!(ChannelDev, ring_prev)) as usize;
                let next = u32_at(ch, std::mem::offset_of!(ChannelDev, ring_next)) as usize;
                let at = std::mem::offset_of!(ChannelDev, ring_ranks);
                let mut ptr = [0u8; 8];
                ptr.copy_from_slice(&ch[at..at + 8]);
                let mut words = vec![0u8; self.nranks * 4];
                self.device.copy_dtoh(&mut words, u64::from_le_bytes(ptr))?;
                let ring: Vec<usize> = (0..self.nranks)
                    .map(|i| u32_at(&words, 4 * i) as usize)
                    .collect();
                let n = self.nranks;
                let consistent = index < n
                    && ring[index] == self.rank
                    && ring[(index + n - 1) % n] == prev
                    && ring[(index + 1) % n] == next
                    && ring == self.rings.ring(c);
                if !consistent {
                    return Err(Error::internal(format!(
                        "rank {}: channel {c} holds ring {ring:?} at index {index} (prev {prev}, next {next}); init agreed on {:?}",
                        self.rank,
                        self.rings.ring(c)
                    )));
                }
                out.push(ring);
            }
            Ok(out)
        }
    }

    crate::internal! {
        /// Across nodes, this rank's place in every channel's tree (parent, children), as
        /// its kernels read it (the device array checked against what init connected);
        /// None where the communicator has no double binary tree (one node, or NCCL_ALGO
        /// leaves no tree).
        fn tree_places(&self) -> Result<Option<Vec<crate::graph::Place>>> {
            let Some(d) = &self.dbt else {
                return Ok(None);
            };
            let size = std::mem::size_of::<nccl_device::abi::TreeDev>();
            let mut raw = vec![0u8; d.ctas * size];
            self.device.copy_dtoh(&mut raw, d.array.ptr)?;
            for (c, (up, down)) in d.places.iter().enumerate() {
                let b = &raw[c * size..(c + 1) * size];
                let word = |i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().unwrap_or_default());
                let n = (word(0) & 0xffff_ffff) as usize;
                let kids = nccl_device::abi::TREE_MAX_CHILDREN;
                let conns_ok = (word(1) != 0) == up.is_some()
                    && (word(2) != 0) == up.is_some()
                    && (0..kids).all(|i| (word(3 + i) != 0) == (i < n))
                    && (0..kids).all(|i| (word(3 + kids + i) != 0) == (i < n));
                if n != down.len() || !conns_ok {
                    return Err(Error::internal(format!(
                        "rank {}: channel {c}'s tree on the device has {n} children and other connections than init made ({up:?}, {down:?})",
                        self.rank
                    )));
                }
            }
            Ok(Some(d.places.clone()))
        }
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

    /// The kernel of `coll` for this type and op (the copies have one kernel, as uint8),
    /// loaded once per communicator. Each kernel is a module of its own: a first call
    /// JIT-compiles only what it runs.
    pub(crate) fn kernel(&self, coll: Coll, dt: DataType, op: RedOpKind) -> Result<Kernel> {
        let key = (coll, dt, op);
        if let Some(k) = self
            .kernels
            .lock()
            .map_err(|_| Error::internal("kernel cache poisoned"))?
            .get(&key)
        {
            return Ok(*k);
        }
        let k = self.device.kernel(&kernel_name(coll, dt, op))?;
        self.kernels
            .lock()
            .map_err(|_| Error::internal("kernel cache poisoned"))?
            .insert(key, k);
        Ok(k)
    }
}

/// The entry point of `coll`'s kernel for `dt` and `op` (the copies have one kernel, as
/// uint8): `nccl_<symbol>`, or `nccl_<symbol>_<type>_<reduction>`.
pub(crate) fn kernel_name(coll: Coll, dt: DataType, op: RedOpKind) -> String {
    match coll.copies() {
        true => format!("nccl_{}", coll.symbol()),
        false => format!("nccl_{}_{}_{}", coll.symbol(), dt.name(), op.name()),
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
        if let Some(p) = self._p2p.take() {
            self.keep.leave(p);
        }
        if let Some(s) = self._shm.take() {
            self.keep.leave(s);
        }
        if let Some(t) = self.tree_up.take() {
            self.keep.leave(t);
        }
        if let Some(t) = self.dbt.take() {
            self.keep.leave(t);
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

#[cfg(test)]
mod tests {
    use super::Shape;
    use nccl_device::abi::Coll;

    #[test]
    fn slice_steps_follow_nccl_unless_set() {
        let mut s = Shape {
            nchannels: 2,
            nthreads: 64,
            slot_bytes: 8192,
            algo_mask: 0,
            proto_mask: 0,
            p2p_conns: 0,
            p2p_slot_bytes: 4096,
            slice_steps: 0,
            kernel_flags: 0,
            net_nchannels: 2,
            reg_ctas: 0,
        };
        let by_coll = |s: &Shape| Coll::ALL.map(|c| s.slice_steps_for(c));
        // AllReduce, Broadcast, Reduce, AllGather, ReduceScatter.
        assert_eq!(by_coll(&s), [2, 1, 1, 2, 2]);
        s.slice_steps = 4;
        assert_eq!(by_coll(&s), [4; 5]);
    }
}
