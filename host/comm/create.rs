//! Creating a rank's communicator ([`Comm::create`]): bootstrap over the unique ids, peer facts,
//! the transport agreement, rings and their connections (p2p, SHM, the network), the trees and
//! NVLS, then the device structures.

use super::*;
use crate::topo::System;
use crate::transport::{self, Conn, Ctx, Set, Want};

pub(super) fn check_args(nranks: usize, rank: usize, ids: &[UniqueId]) -> Result<()> {
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
    /// transport, device structures. Every wait stops early when `abort` is set. The stages
    /// run in this order on every rank; each is a function below.
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
        // What this communicator allocates is counted from here on (`Comm::device_memory`).
        let user_device = device.uncounted();
        let (device, memory) = device.counted();
        let t0 = Instant::now();
        crate::env::log_params();
        let comm_id = net::comm_id(ids[0].public_bytes());
        let j = join(device, nranks, ids, rank, &config, abort)?;
        let (system, transports, shape) = agree_transports(&j)?;
        let faults = watch_faults(&j)?;
        let mut plan = plan_topology(&j, system, &transports, shape, &config, comm_id, &faults)?;
        let (free_before, _) = j.device.mem_info()?;
        let addrs: Vec<PeerAddr> = j
            .peers
            .iter()
            .map(|p| PeerAddr {
                device: p.device,
                same_process: p.same_process(&j.me),
                transport: transports.between(rank, p.rank as usize),
            })
            .collect();
        // Before the connection exchange, so every member in this process joins before any
        // can leave.
        let keep = keepalive::join(comm_id);
        let suspendable = Arc::new(Suspendable::new());
        let rings_made = connect_rings(&j, &plan, &addrs, &suspendable)?;
        let order = Arc::new(order::StreamOrder::new(j.device.clone()));
        let maker = LinkMaker::new(&j, &addrs, plan.net_path.clone(), &order, &suspendable);
        let links = Arc::new(maker.make(
            p2p_conns(&plan.shape, nranks),
            plan.shape.p2p_slot_bytes as usize,
        ));
        let reach = DirectReach {
            rank,
            links: &links,
            addrs: &addrs,
            transports: &transports,
            net_path: plan.net_path.as_deref(),
        };
        let (mut ring_tables, mut tree_tables) = (Vec::new(), Vec::new());
        let (tree_up, dbt) = connect_trees(&j, &plan, &links, &maker, &reach, &mut tree_tables)?;
        let slot = plan.shape.slot_bytes as usize;
        let pat_ctas = (plan.shape.nchannels as usize).min(pat::PAT_MAX_CTAS);
        let pat = match pat::wanted(nranks, plan.nodes.len(), plan.shape.algo_mask) {
            true => Some(pat::connect(
                rank,
                nranks,
                &j.device,
                pat_ctas,
                slot,
                |c| maker.make(1, slot).keyed(c as u32),
            )?),
            false => None,
        };
        let pat_packed = pat::packed_bytes(nranks, slot);
        plan.tuner
            .set_pat(pat.as_ref().map_or(0, |p| p.ctas), pat_packed);
        let deterministic = deterministic::setup(
            &j.bootstrap,
            &j.device,
            &links,
            config.deterministic,
            (plan.shape.nchannels as usize, slot),
            |ctas, slot| maker.make(ctas, slot),
        )?;

        // NVLS: only where the user set NCCL_NVLS_ENABLE to 1 on every rank (see nvls.rs),
        // after every rank agreed on the tuner (all of them decide alike here).
        let all_p2p = !transports.any(Transport::Net) && !transports.any(Transport::Shm);
        let nvls = nvls::setup(
            rank,
            &j.device,
            &j.bootstrap,
            &j.peers,
            all_p2p,
            (config.nvls_ctas, plan.shape.nchannels as usize),
        )
        .map_err(|e| e.context("NVLS setup"))?;
        plan.tuner.set_nvls(nvls.is_some());
        let shape = plan.shape;
        plan.tuner
            .set_ring_exchange(shape.kernel_flags & nccl_device::abi::FLAG_RING_EXCHANGE != 0);
        plan.tuner
            .set_tree_exchange(dbt.as_ref().is_some_and(|d| d.exchanges(&shape)));

        let kernel_abort = faults.kernel_abort.clone();
        let stamps = stamps::KernelStamps::from_env(&j.device, rank)?;
        let nnodes = net::nodes(&j.peers).len();
        let profiler = crate::profiler::CommProfiler::open(
            comm_id,
            config.comm_name.as_deref(),
            nnodes,
            nranks,
            rank,
        )
        .map(|p| profile::Profiling::new(p, &j.device))
        .transpose()?;
        let dev_comm = upload(Upload {
            j: &j,
            shape: &shape,
            rings: &plan.rings,
            made: &rings_made,
            reach: &reach,
            ring_tables: &mut ring_tables,
            tree_tables: &mut tree_tables,
            tree_up: tree_up.is_some(),
            kernel_abort: &kernel_abort,
            nvls: nvls.as_ref(),
            stamps: stamps.as_ref(),
            profile_stamps: profiler.as_ref().map_or(0, |p| p.stamps.device_ptr()),
        })?;
        let ring_ops = proxy_ops::RingQueues::of(
            &rings_made,
            &plan.rings,
            dbt.as_ref(),
            pat.as_ref(),
            rank,
            shape.nchannels as usize,
            shape.slot_bytes as usize,
        );
        j.bootstrap.barrier()?;
        let (free_after, _) = j.device.mem_info()?;
        abort.check()?;
        log::info!(
            "comm {}rank {rank}/{nranks} on device {} ({}): {} channels x {} threads, {} KiB slots, {} KiB of device memory, init {:.1} ms",
            config.comm_name.as_deref().map(|n| format!("{n} ")).unwrap_or_default(),
            j.device.ordinal,
            if j.device.is_sim() { "simulator" } else { "cuda" },
            shape.nchannels,
            shape.nthreads,
            shape.slot_bytes / 1024,
            memory.load(std::sync::atomic::Ordering::Relaxed) / 1024,
            t0.elapsed().as_secs_f64() * 1e3
        );
        let ras = register_health(&j, &config, comm_id, &order, &faults);
        watch_hangs(&j, &order);
        let Joined {
            device,
            bootstrap,
            peers,
            ..
        } = j;
        let comm = Comm {
            rank,
            nranks,
            device,
            shape,
            tuner: plan.tuner,
            bootstrap,
            links,
            tree_up,
            dbt,
            pat,
            nvls,
            rings: plan.rings,
            order,
            dev_comm,
            ring_resources: rings_made.resources,
            ring_ops,
            suspendable,
            kernels: Mutex::new(HashMap::new()),
            aborted: Arc::new(AtomicBool::new(false)),
            init_bytes: free_before.saturating_sub(free_after),
            memory,
            user_device,
            config,
            abort_flag: abort.clone(),
            finalized: AtomicBool::new(false),
            revoked: AtomicBool::new(false),
            async_error: faults.async_error,
            net: plan.net_path,
            ring_tables,
            tree_tables,
            graph_markers: peers.iter().map(|p| p.graph_register).collect(),
            registered: register::Registrations::new(
                crate::env::LOCAL_REGISTER.int() != 0,
                crate::env::GRAPH_REGISTER.int() != 0,
            ),
            windows: Default::default(),
            deterministic,
            graph_regs: Arc::default(),
            kernel_abort,
            split_turns: Arc::default(),
            ras,
            stamps,
            profiler,
            keep,
            _one_thread: NotSync::default(),
        };
        comm.register_deterministic_scratch()?;
        Ok(comm)
    }
}

/// What every stage after the bootstrap reads: this rank, its device, the bootstrap and every
/// rank's facts.
struct Joined {
    rank: usize,
    nranks: usize,
    device: Device,
    bootstrap: Arc<Bootstrap>,
    me: PeerInfo,
    peers: Vec<PeerInfo>,
}

/// Stage 1: this rank's device, its bootstrap over `ids`, and every rank's facts.
fn join(
    device: Device,
    nranks: usize,
    ids: &[UniqueId],
    rank: usize,
    config: &ResolvedConfig,
    abort: &AbortFlag,
) -> Result<Joined> {
    device.make_current()?;
    device.check_kernels()?;
    let shape = Shape::from_env(&device, config)?;
    let timeout = Duration::from_millis(crate::env::BOOTSTRAP_TIMEOUT_MS.int().max(1) as u64);
    let bootstrap = Arc::new(
        Bootstrap::init_scalable(ids, rank, nranks, timeout, abort).map_err(|e| {
            // Most of its errors name the bootstrap already ("bootstrap rank 1: ..."): no
            // second "bootstrap: " in front of them.
            if e.message.starts_with("bootstrap") {
                e
            } else {
                e.context("bootstrap")
            }
        })?,
    );
    let me = PeerInfo::local(rank, &device, shape)?;
    let peers = PeerInfo::exchange(&bootstrap, &me)?;
    Ok(Joined {
        rank,
        nranks,
        device,
        bootstrap,
        me,
        peers,
    })
}

/// Stage 2: P2P, SHM or NET for every pair, alike on every rank, and the launch shape they
/// allow (rank 0's parameters rule, so every rank launches alike). Also gives the node's
/// topology, which the tuner takes next.
fn agree_transports(j: &Joined) -> Result<(System, transports::Transports, Shape)> {
    let system = tuning::node_system(j.rank, &j.device, &j.peers)?;
    let own_row = transports::own_row(j.rank, &j.device, &j.peers, &system)?;
    let transports = transports::Transports::agree(&j.bootstrap, &own_row)?;
    let mut shape = j.peers[0].shape;
    if transports.any(Transport::Net) || transports.any(Transport::Shm) {
        // The kernels' agreement on fewer CTAs runs over p2p counter lines only: every ring
        // connection must be one (this matrix is every rank's).
        shape.reg_ctas = 0;
    }
    if transports.any(Transport::Net) {
        // Across nodes (or with p2p and SHM off on one).
        shape.nchannels = shape.net_nchannels;
        // A proxy sends a step slot by slot, each slot spaced by the connection's stride: one
        // slot per Simple step (every rank knows every pair's transport, so all agree).
        shape.slice_steps = 1;
    }
    if transports.any(Transport::Shm) {
        // Host memory carries these rings: as across nodes, the channels NCCL's search finds
        // over such paths (two), not NVLink's 32 sets of pinned FIFOs.
        shape.nchannels = shape.net_nchannels;
    }
    Ok((system, transports, shape))
}

/// Where faults go: a peer gone (seen by the bootstrap, by us or another rank) and the
/// network's errors become the communicator's async error and stop the kernels.
struct Faults {
    async_error: Arc<Mutex<Option<Error>>>,
    kernel_abort: Arc<crate::cuda::HostFlag>,
    sink: net::FaultSink,
}

/// Stage 3: the fault plumbing, watching the bootstrap from now on.
fn watch_faults(j: &Joined) -> Result<Faults> {
    let async_error: Arc<Mutex<Option<Error>>> = Arc::default();
    let kernel_abort = Arc::new(j.device.alloc_host_flag()?);
    let sink = fault_sink(j.rank, &async_error, &kernel_abort);
    j.bootstrap.watch({
        let f = sink.clone();
        move |e| f(e)
    });
    Ok(Faults {
        async_error,
        kernel_abort,
        sink,
    })
}

/// What the topology stage decided, alike on every rank.
struct Plan {
    shape: Shape,
    /// The network side, across nodes.
    net_path: Option<Arc<NetPath>>,
    /// Every node's ranks.
    nodes: Vec<Vec<usize>>,
    tuner: crate::tune::Tuner,
    rings: Rings,
}

/// Stage 4: the network path, the tuner and the rings.
fn plan_topology(
    j: &Joined,
    system: System,
    transports: &transports::Transports,
    shape: Shape,
    config: &ResolvedConfig,
    comm_id: u64,
    faults: &Faults,
) -> Result<Plan> {
    let choice = net::Choice {
        name: config.net_name.as_deref(),
        comm_id,
        traffic_class: config.traffic_class,
    };
    let rank = j.rank;
    // This GPU's position among its node's (the node's topology numbers them so).
    let local = j
        .peers
        .iter()
        .filter(|p| p.host_hash == j.peers[rank].host_hash && p.rank < j.peers[rank].rank)
        .count();
    let on_net_error = net_fault_sink(faults.sink.clone(), &j.bootstrap);
    let net_path = net_path(
        transports.remote(rank),
        &j.device,
        &choice,
        on_net_error,
        &system,
        local,
    )?;
    // Across nodes the tuner models the network: the node count and the NICs' speed.
    let nodes_of = nodes(&j.peers);
    let net_model = net_path
        .as_ref()
        .filter(|_| nodes_of.len() > 1)
        .map(|np| tuning::NetModel::of(&*np.net, nodes_of.len(), shape.nchannels as usize));
    let (mut tuner, graphs) = tuning::build(rank, &j.device, system, &j.peers, &shape, net_model)
        .map_err(|e| e.context("tuning"))?;
    if tuner.agree(&j.bootstrap.allgather(&tuner.facts())?)? {
        log::warn!("rank {rank}: topology or tuning differs from rank 0's; using rank 0's");
        tuner.log();
    }
    // Channel c runs on rank 0's ring c (NCCL_RINGS, else the search's), repeated cyclically.
    let rings = rings::agree(&j.bootstrap, &graphs, &nodes_of, shape.nchannels as usize)
        .map_err(|e| e.context("rings"))?;
    Ok(Plan {
        shape,
        net_path,
        nodes: nodes_of,
        tuner,
        rings,
    })
}

/// Every channel's ring neighbours of this rank: (previous, next).
fn ring_peers(j: &Joined, plan: &Plan) -> Vec<(usize, usize)> {
    (0..plan.shape.nchannels as usize)
        .map(|c| plan.rings.peers(c, j.rank))
        .collect()
}

/// Stage 5: the rings' connections to both neighbours of every channel, in one round of
/// every transport (none with a single rank). Per channel: a send to the next rank, a
/// receive from the previous one, keyed by the channel.
fn connect_rings(
    j: &Joined,
    plan: &Plan,
    addrs: &[PeerAddr],
    suspendable: &Arc<Suspendable>,
) -> Result<transport::Made> {
    if j.nranks == 1 {
        return Ok(transport::Made::default());
    }
    let wants: Vec<Want> = ring_peers(j, plan)
        .into_iter()
        .enumerate()
        .flat_map(|(c, (prev, next))| {
            let key = c as u32;
            [
                Want {
                    peer: next,
                    dir: Dir::Send,
                    key,
                },
                Want {
                    peer: prev,
                    dir: Dir::Recv,
                    key,
                },
            ]
        })
        .collect();
    let cx = Ctx {
        rank: j.rank,
        device: &j.device,
        bootstrap: &j.bootstrap,
        peers: addrs,
        net: plan.net_path.as_deref(),
        suspendable,
    };
    let set = Set::Ring {
        nchannels: plan.shape.nchannels as usize,
        slot_bytes: plan.shape.slot_bytes as usize,
    };
    transport::setup(&cx, set, &wants)?.connect(&cx)
}

/// Send/receive connections per peer: 64 CTAs' worth spread over the peers, at most 16 per
/// peer, unless NCCL_RS_P2P_CONNS sets it (`Shape::p2p_conns`).
/// A launch then covers half the distances (MAX_P2P_ITEMS / 2 CTAs per direction), so an
/// all-to-all takes two launches. With 4 per peer, 2xH200 sendrecv moved 90 GB/s against
/// NCCL's 354 at 512 MiB (each CTA ~22 GB/s); on 4xH200 at 512 MiB, 8 per peer (32 / nranks)
/// moved 279 GB/s and 16 per peer 317-322 (NCCL: 350; results/h200x4-sendrecv-*conns*).
fn p2p_conns(shape: &Shape, nranks: usize) -> usize {
    match shape.p2p_conns {
        0 => (MAX_P2P_ITEMS / nranks).clamp(1, MAX_P2P_ITEMS / 4),
        n => n as usize,
    }
}

/// Makes links like the communicator's (send/receive connections made on first use), with
/// `n` connections per peer and `slot`-byte FIFO slots: the send/recv links, and the trees'.
struct LinkMaker {
    rank: usize,
    device: Device,
    bootstrap: Arc<Bootstrap>,
    addrs: Vec<PeerAddr>,
    net: Option<Arc<NetPath>>,
    fences: crate::transport::links::Fences,
    suspendable: Arc<Suspendable>,
}

impl LinkMaker {
    fn new(
        j: &Joined,
        addrs: &[PeerAddr],
        net: Option<Arc<NetPath>>,
        order: &Arc<order::StreamOrder>,
        suspendable: &Arc<Suspendable>,
    ) -> LinkMaker {
        // A communicator being dropped has waited for its kernels: nothing to fence.
        let order = Arc::downgrade(order);
        LinkMaker {
            rank: j.rank,
            device: j.device.clone(),
            bootstrap: j.bootstrap.clone(),
            addrs: addrs.to_vec(),
            net,
            fences: Arc::new(move || order.upgrade().map_or(Ok(None), |o| o.fence())),
            suspendable: suspendable.clone(),
        }
    }

    fn make(&self, n: usize, slot: usize) -> Links {
        Links::new(
            self.rank,
            self.device.clone(),
            self.bootstrap.clone(),
            self.addrs.clone(),
            n,
            slot,
            self.net.clone(),
        )
        .with_fences(self.fences.clone())
        .with_suspendable(self.suspendable.clone())
    }
}

/// How a send to a ring or tree neighbour reaches the buffers it offers (zero-copy ring and
/// tree collectives): connections to peers of this node through p2p take the handshake (both
/// ends judge a pair alike from the agreed transport), and a send reaches the peer's
/// registered buffers as send/recv does (`Links::direct_reach`).
struct DirectReach<'a> {
    rank: usize,
    links: &'a Links,
    addrs: &'a [PeerAddr],
    transports: &'a transports::Transports,
    net_path: Option<&'a NetPath>,
}

impl DirectReach<'_> {
    /// Whether `r` is another rank of this node joined by p2p.
    fn p2p_peer(&self, r: usize) -> bool {
        r != self.rank
            && !self.net_path.is_some_and(|n| n.remote[r])
            && self.transports.between(self.rank, r) == Transport::P2p
    }

    /// The reach word of a send to `peer`; a peer in another process joins `tables`, whose
    /// records a registered launch drains first.
    fn of(&self, peer: usize, tables: &mut Vec<usize>) -> u64 {
        if !self.p2p_peer(peer) {
            return nccl_device::abi::DIRECT_OFF;
        }
        match self.links.direct_reach(peer) {
            Ok(Some(reach)) => {
                if !self.addrs[peer].same_process && !tables.contains(&peer) {
                    tables.push(peer);
                }
                reach
            }
            // Still the handshake (the peer expects it), never direct.
            Ok(None) => nccl_device::abi::DIRECT_DECLINE,
            Err(e) => {
                log::warn!("rank {}: rank {peer}'s registered buffers: {e}", self.rank);
                nccl_device::abi::DIRECT_DECLINE
            }
        }
    }
}

/// Stage 6: the trees. On one node the tree is the chain in ring order; across nodes NCCL's
/// double binary tree, each channel on links of its own with the same slots. The tree's up
/// links step with a quarter of the ring's slot (its halves pipeline through them); they are
/// the send/recv links only where those have that slot.
fn connect_trees(
    j: &Joined,
    plan: &Plan,
    links: &Links,
    maker: &LinkMaker,
    reach: &DirectReach,
    tree_tables: &mut Vec<usize>,
) -> Result<(Option<TreeUp>, Option<tree::Dbt>)> {
    use crate::tune::{Algo, AlgoFilter, Coll};
    let shape = &plan.shape;
    let tree_slot = (shape.slot_bytes as usize / 4).max(4096);
    if plan.nodes.len() <= 1 {
        let up = tree_up::connect(j.rank, links, shape, &plan.rings, tree_slot, |n| {
            maker.make(n, tree_slot)
        })?;
        return Ok((up, None));
    }
    let allowed =
        AlgoFilter::from_mask(shape.algo_mask).allows(Coll::AllReduce, Algo::Tree as usize);
    if !allowed {
        return Ok((None, None));
    }
    let trees = crate::graph::dbt_channels(&plan.nodes, shape.nchannels as usize);
    // The tree's steps may be LL (one peer per step): its links inside the node get LL FIFOs
    // (network connections carry every protocol).
    let mut reach_of = |peer: usize| reach.of(peer, tree_tables);
    let made = tree::connect_dbt(
        j.rank,
        &j.device,
        &trees,
        &plan.nodes,
        reach.addrs,
        plan.net_path.as_deref(),
        &mut reach_of,
        |c| maker.make(1, tree_slot).keyed(c as u32).with_ll(),
    );
    Ok((None, Some(made.map_err(|e| e.context("tree connections"))?)))
}

/// What the device structures are made of.
struct Upload<'a> {
    j: &'a Joined,
    shape: &'a Shape,
    rings: &'a Rings,
    /// The rings' connections, whichever transports made them.
    made: &'a transport::Made,
    reach: &'a DirectReach<'a>,
    ring_tables: &'a mut Vec<usize>,
    tree_tables: &'a mut Vec<usize>,
    /// The one-node tree is connected (its way up runs against the ring).
    tree_up: bool,
    kernel_abort: &'a crate::cuda::HostFlag,
    nvls: Option<&'a nvls::Nvls>,
    stamps: Option<&'a stamps::KernelStamps>,
    /// The profiler's channel stamps (0: no profiler).
    profile_stamps: u64,
}

/// Stage 7: the device structures: `DevComm`, the channels, then each distinct ring as ranks
/// (channels share them), in one device allocation.
fn upload(u: Upload) -> Result<DevBuffer> {
    let (j, shape) = (u.j, u.shape);
    let (rank, nranks) = (j.rank, j.nranks);
    let nch = shape.nchannels as usize;
    let head = std::mem::size_of::<DevComm>().next_multiple_of(16);
    let ring_at = head + nch * std::mem::size_of::<ChannelDev>();
    let ring_words: Vec<u32> = u
        .rings
        .distinct()
        .iter()
        .flatten()
        .map(|&r| r as u32)
        .collect();
    let dev_comm = j.device.alloc(ring_at + ring_words.len() * 4)?;
    let mut channels = vec![ChannelDev::default(); nch];
    for (c, ch) in channels.iter_mut().enumerate() {
        let (prev, next) = u.rings.peers(c, rank);
        ch.recv_direct = u.reach.p2p_peer(prev) as u32;
        ch.send_reach = u.reach.of(next, u.ring_tables);
        // The one-node tree's way up runs against the ring (`tree_up`: the chain, on one
        // node only).
        ch.prev_reach = match u.tree_up {
            true => u.reach.of(prev, u.tree_tables),
            false => nccl_device::abi::DIRECT_OFF,
        };
        ch.ring_index = u.rings.position(c, rank) as u32;
        ch.ring_ranks = dev_comm.ptr + (ring_at + u.rings.index_of(c) * nranks * 4) as u64;
        ch.ring_prev = prev as u32;
        ch.ring_next = next as u32;
        for (_, conn) in u.made.conns.iter().filter(|(w, _)| w.key as usize == c) {
            match *conn {
                Conn::Send(s) => ch.send = s,
                Conn::Recv(r) => ch.recv = r,
            }
        }
    }
    let dc = DevComm {
        rank: rank as u32,
        nranks: nranks as u32,
        nchannels: shape.nchannels,
        slot_bytes: shape.slot_bytes,
        channels: dev_comm.ptr + head as u64,
        abort_flag: u.kernel_abort.ptr,
        nvls: u.nvls.map_or(0, |n| n.chans.ptr),
        nvls_nchannels: u.nvls.map_or(0, |n| n.nchannels as u32),
        lab_count: 0,
        lab_stamps: u.stamps.map_or(0, |s| s.device_ptr()),
        profile_stamps: u.profile_stamps,
    };
    dev_comm.write(0, as_bytes(std::slice::from_ref(&dc)))?;
    dev_comm.write(head, as_bytes(&channels))?;
    dev_comm.write(ring_at, as_bytes(&ring_words))?;
    Ok(dev_comm)
}

/// This communicator's health, for RAS queries.
fn register_health(
    j: &Joined,
    config: &ResolvedConfig,
    comm_id: u64,
    order: &Arc<order::StreamOrder>,
    faults: &Faults,
) -> Arc<crate::ras::Entry> {
    let (order, slot) = (Arc::downgrade(order), faults.async_error.clone());
    let health = crate::ras::Health::new(
        comm_id,
        j.rank,
        j.nranks,
        j.device.ordinal,
        config.comm_name.clone(),
        move || order.upgrade().and_then(|o| o.finished()),
        move || {
            let e = slot.lock().unwrap_or_else(|p| p.into_inner());
            e.as_ref().map(|e| e.to_string())
        },
    );
    crate::ras::register(Arc::new(health), &j.bootstrap)
}

/// Opt-in (NCCL_RS_PEER_HANG_TIMEOUT_MS): a peer whose process stopped (alive to TCP, silent
/// to us) becomes a fault when an operation waits on it (NCCL has no such bound).
fn watch_hangs(j: &Joined, order: &Arc<order::StreamOrder>) {
    let hang_ms = crate::env::RS_PEER_HANG_TIMEOUT_MS.int();
    if hang_ms > 0 {
        let order = Arc::downgrade(order);
        j.bootstrap
            .watch_hangs(Duration::from_millis(hang_ms as u64), move || {
                // Outstanding: not known to be finished (None: a launch in progress, or a
                // captured graph, whose work cannot be seen).
                order.upgrade().is_some_and(|o| o.finished() != Some(true))
            });
    }
}
