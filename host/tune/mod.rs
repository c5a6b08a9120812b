//! Tuning: for each call, the algorithm, protocol, channel count and thread count, from a
//! latency/bandwidth model of every (collective, algorithm, protocol), user filters (NCCL_ALGO,
//! NCCL_PROTO) and an optional tuner plugin (NCCL_TUNER_PLUGIN).
//!
//! Entry points:
//! - [`Tuner::new`]`(&system, &graphs, &TuneParams::from_env()?)` once per communicator,
//!   [`Tuner::choose`]`(coll, bytes)` per call → [`Choice`] { algo, proto, nchannels, nthreads,
//!   est_time_us }. `bytes` is the size of one rank's buffer: the send buffer of AllReduce,
//!   Broadcast and Reduce, the output of AllGather, the input of ReduceScatter (NCCL's `nBytes`).
//! - [`AlgoFilter::parse`] / [`ProtoFilter::parse`]: NCCL's syntax: `ring,tree`, `^tree`,
//!   `allreduce:tree,ring;broadcast:ring` (names in any case; an unknown name or collective is an
//!   invalid-argument error).
//!
//! The model: time = latency + bus bytes / bandwidth, where
//! - bus bytes = bytes × 2(n−1)/n (AllReduce ring), (n−1)/n (AllGather, ReduceScatter), 1
//!   (Broadcast, Reduce), and for the tree the data once each way through every link;
//! - bandwidth = the graph's bandwidth (intra-node ring, or the network when it is the bottleneck)
//!   × the protocol's efficiency (Simple 0.99, LL128 0.925, LL 0.42 of the graph's bandwidth), × the tree's
//!   efficiency for Tree, × the share of channels the size keeps busy;
//! - latency = the (algorithm, protocol) base plus one hop latency per step, by link kind.
//!
//! The constants are calibrated on NVIDIA NCCL on the 4×H200 host with one protocol forced
//! (the team's baseline runs of NCCL 2.28.9, 2026-11): LL ≈ 152 GB/s busbw and 9 µs, LL128 ≈ 330 GB/s and 22 µs,
//! Simple ≈ 358 GB/s and 35 µs (4 ranks, AllReduce); Tree ≈ 0.47 of Ring on one node.

mod agree;
pub mod plugin;

use crate::error::{Error, Result};
use crate::graph::Graphs;
use crate::topo::{PathType, System};
use std::fmt;

/// The collectives the model knows (values are NCCL's `ncclFunc_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Coll {
    /// Broadcast.
    Broadcast = 0,
    /// Reduce.
    Reduce = 1,
    /// AllGather.
    AllGather = 2,
    /// ReduceScatter.
    ReduceScatter = 3,
    /// AllReduce.
    AllReduce = 4,
}

impl Coll {
    /// Every collective the tuner knows, in NCCL's order.
    pub const ALL: [Coll; 5] = [
        Coll::Broadcast,
        Coll::Reduce,
        Coll::AllGather,
        Coll::ReduceScatter,
        Coll::AllReduce,
    ];
    /// Its name as NCCL logs it.
    pub fn as_str(self) -> &'static str {
        match self {
            Coll::Broadcast => "Broadcast",
            Coll::Reduce => "Reduce",
            Coll::AllGather => "AllGather",
            Coll::ReduceScatter => "ReduceScatter",
            Coll::AllReduce => "AllReduce",
        }
    }
}

/// Algorithms (values are NCCL's algorithm indices, as the tuner plugin's cost table uses them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Algo {
    /// Tree (double binary tree across nodes, chain within).
    Tree = 0,
    /// Ring.
    Ring = 1,
    /// CollNet direct (not available here).
    CollNetDirect = 2,
    /// CollNet chain (not available here).
    CollNetChain = 3,
    /// NVLink SHARP (not available here).
    Nvls = 4,
    /// NVLink SHARP with a tree (not available here).
    NvlsTree = 5,
    /// PAT (not available here).
    Pat = 6,
}

/// How many algorithms there are.
pub const NUM_ALGOS: usize = 7;

impl Algo {
    /// Every algorithm, in NCCL's order.
    pub const ALL: [Algo; NUM_ALGOS] = [
        Algo::Tree,
        Algo::Ring,
        Algo::CollNetDirect,
        Algo::CollNetChain,
        Algo::Nvls,
        Algo::NvlsTree,
        Algo::Pat,
    ];
    /// Its name as NCCL writes it (`NCCL_ALGO`).
    pub fn as_str(self) -> &'static str {
        match self {
            Algo::Tree => "Tree",
            Algo::Ring => "Ring",
            Algo::CollNetDirect => "CollNetDirect",
            Algo::CollNetChain => "CollNetChain",
            Algo::Nvls => "NVLS",
            Algo::NvlsTree => "NVLSTree",
            Algo::Pat => "PAT",
        }
    }
}

impl fmt::Display for Algo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Protocols (values are NCCL's protocol indices).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Proto {
    /// LL: 8-byte stores with flags.
    Ll = 0,
    /// LL128: 128-byte lines with a flag.
    Ll128 = 1,
    /// Simple: data, fence, counter.
    Simple = 2,
}

/// How many protocols there are.
pub const NUM_PROTOS: usize = 3;

impl Proto {
    /// Every protocol, in NCCL's order.
    pub const ALL: [Proto; NUM_PROTOS] = [Proto::Ll, Proto::Ll128, Proto::Simple];
    /// Its name as NCCL writes it (`NCCL_PROTO`).
    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Ll => "LL",
            Proto::Ll128 => "LL128",
            Proto::Simple => "Simple",
        }
    }
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Per-collective allow mask over items of one kind (algorithms or protocols).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Filter<const N: usize> {
    /// `allowed[coll][item]`.
    pub allowed: [[bool; N]; 5],
}

/// Which algorithms each collective may use.
pub type AlgoFilter = Filter<NUM_ALGOS>;
/// Which protocols each collective may use.
pub type ProtoFilter = Filter<NUM_PROTOS>;

impl<const N: usize> Default for Filter<N> {
    fn default() -> Self {
        Filter {
            allowed: [[true; N]; 5],
        }
    }
}

fn coll_by_name(s: &str) -> Option<Coll> {
    let k: String = s
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect::<String>()
        .to_ascii_lowercase();
    Coll::ALL
        .into_iter()
        .find(|c| c.as_str().eq_ignore_ascii_case(&k))
}

impl<const N: usize> Filter<N> {
    fn parse_with(var: &str, text: &str, names: &dyn Fn(&str) -> Option<usize>) -> Result<Self> {
        let mut f = Filter::default();
        let bad = |what: String| Error::invalid_argument(format!("{var}={text}: {what}"));
        for entry in text.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            let (colls, list): (Vec<Coll>, &str) = match entry.split_once(':') {
                Some((c, l)) => {
                    let c = c.trim();
                    let coll =
                        coll_by_name(c).ok_or_else(|| bad(format!("unknown collective '{c}'")))?;
                    (vec![coll], l)
                }
                None => (Coll::ALL.to_vec(), entry),
            };
            let list = list.trim();
            let (exclude, list) = match list.strip_prefix('^') {
                Some(l) => (true, l),
                None => (false, list),
            };
            let mut mask = [exclude; N];
            let mut any = false;
            for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                let i = names(name).ok_or_else(|| bad(format!("unknown name '{name}'")))?;
                mask[i] = !exclude;
                any = true;
            }
            if !any {
                return Err(bad("empty list".into()));
            }
            for c in colls {
                f.allowed[c as usize] = mask;
            }
        }
        Ok(f)
    }

    /// Whether `coll` may use item `item`.
    pub fn allows(&self, coll: Coll, item: usize) -> bool {
        self.allowed[coll as usize][item]
    }

    /// The filter as bits (`coll * N + item`), to send to other ranks.
    pub fn to_mask(self) -> u64 {
        let mut m = 0u64;
        for (c, row) in self.allowed.iter().enumerate() {
            for (i, &ok) in row.iter().enumerate() {
                if ok {
                    m |= 1 << (c * N + i);
                }
            }
        }
        m
    }

    /// The inverse of [`Filter::to_mask`].
    pub fn from_mask(m: u64) -> Self {
        let mut f = Filter {
            allowed: [[false; N]; 5],
        };
        for (c, row) in f.allowed.iter_mut().enumerate() {
            for (i, ok) in row.iter_mut().enumerate() {
                *ok = m & (1 << (c * N + i)) != 0;
            }
        }
        f
    }
}

impl AlgoFilter {
    /// NCCL_ALGO's syntax.
    pub fn parse(var: &str, text: &str) -> Result<AlgoFilter> {
        Filter::parse_with(var, text, &|n| {
            let n = n.to_ascii_lowercase();
            Algo::ALL
                .into_iter()
                .find(|a| a.as_str().eq_ignore_ascii_case(&n))
                .map(|a| a as usize)
        })
    }
}

impl ProtoFilter {
    /// NCCL_PROTO's syntax.
    pub fn parse(var: &str, text: &str) -> Result<ProtoFilter> {
        Filter::parse_with(var, text, &|n| {
            Proto::ALL
                .into_iter()
                .find(|p| p.as_str().eq_ignore_ascii_case(n))
                .map(|p| p as usize)
        })
    }
}

/// The tuning parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct TuneParams {
    /// NCCL_ALGO as a filter.
    pub algo: AlgoFilter,
    /// NCCL_PROTO as a filter.
    pub proto: ProtoFilter,
    /// NCCL_NTHREADS when set.
    pub nthreads: Option<u32>,
    /// Most threads a CTA may have (the kernels' limit).
    pub max_threads: u32,
    /// NCCL_TUNER_PLUGIN when set.
    pub plugin: Option<String>,
    /// `built[algo][proto]`: the kernels exist (the model knows more than is built; the
    /// communicator narrows this to what its kernels run).
    pub built: [[bool; NUM_PROTOS]; NUM_ALGOS],
    /// Largest call (bytes) each protocol is chosen for when another one may run it: a bound
    /// from measurements of our kernels where the model (calibrated on NVIDIA's) is too kind.
    /// A filter that leaves only this protocol lifts it.
    pub auto_max_bytes: [usize; NUM_PROTOS],
}

impl Default for TuneParams {
    fn default() -> TuneParams {
        TuneParams {
            algo: AlgoFilter::default(),
            proto: ProtoFilter::default(),
            nthreads: None,
            max_threads: 512,
            plugin: None,
            built: [[true; NUM_PROTOS]; NUM_ALGOS],
            auto_max_bytes: [usize::MAX; NUM_PROTOS],
        }
    }
}

impl TuneParams {
    /// From NCCL_ALGO, NCCL_PROTO, NCCL_NTHREADS, NCCL_TUNER_PLUGIN. Bad values are errors.
    pub fn from_env() -> Result<TuneParams> {
        let mut p = TuneParams::default();
        if let Some(v) = crate::env::ALGO.raw() {
            p.algo = AlgoFilter::parse("NCCL_ALGO", &v)?;
        }
        if let Some(v) = crate::env::PROTO.raw() {
            p.proto = ProtoFilter::parse("NCCL_PROTO", &v)?;
        }
        if crate::env::NTHREADS.raw().is_some() {
            let n = crate::env::NTHREADS.int();
            if !(64..=p.max_threads as i64).contains(&n) || n % 32 != 0 {
                return Err(Error::invalid_argument(format!(
                    "NCCL_NTHREADS={n}: use a multiple of 32 from 64 to {}",
                    p.max_threads
                )));
            }
            p.nthreads = Some(n as u32);
        }
        p.plugin = crate::env::TUNER_PLUGIN.raw();
        Ok(p)
    }
}

/// What to run for one call.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct Choice {
    /// The algorithm.
    pub algo: Algo,
    /// The protocol.
    pub proto: Proto,
    /// Channels (CTAs).
    pub nchannels: usize,
    /// Threads per CTA.
    pub nthreads: u32,
    /// The model's estimate, µs.
    pub est_time_us: f64,
}

/// Protocol efficiency: the share of the link bandwidth each protocol's kernels reach.
fn proto_eff(p: Proto) -> f64 {
    match p {
        Proto::Ll => 0.42,
        Proto::Ll128 => 0.925,
        Proto::Simple => 0.99,
    }
}

/// Base latency µs per (algorithm, protocol).
fn base_lat(a: Algo, p: Proto) -> f64 {
    match (a, p) {
        (Algo::Tree, Proto::Ll) => 6.0,
        (Algo::Tree, Proto::Ll128) => 15.0,
        (Algo::Tree, Proto::Simple) => 22.0,
        (_, Proto::Ll) => 5.0,
        (_, Proto::Ll128) => 14.5,
        (_, Proto::Simple) => 20.0,
    }
}

/// Hop latency µs per protocol for a step inside a node: over NVLink, or PCIe/SHM.
fn hop_lat(kind: PathType, p: Proto) -> f64 {
    let (ll, ll128, simple) = if kind <= PathType::Nvb {
        (0.6, 1.25, 2.5)
    } else {
        (1.0, 2.0, 3.0)
    };
    match p {
        Proto::Ll => ll,
        Proto::Ll128 => ll128,
        Proto::Simple => simple,
    }
}

/// Smallest bytes worth a channel of its own, per protocol.
fn min_bytes_per_channel(p: Proto) -> usize {
    match p {
        Proto::Ll => 16 << 10,
        Proto::Ll128 => 64 << 10,
        Proto::Simple => 64 << 10,
    }
}

/// Across nodes, Simple and LL128 calls run on at most this many channels until each has
/// [`NET_BYTES_PER_CHANNEL`]: one proxy thread carries every channel's network steps, and many
/// small ones cost it more than they gain. On one H200 as 2 nodes, 3 rounds
/// (results/h200-nodes2-mid-channels-s21.txt), 512 KiB took 95-115 us on 2 or 4 channels and 160-183 on 8
/// (ReduceScatter, AllGather; AllReduce's tree 119-136 on 4, 158-178 on 8), 1 MiB 112-138 on
/// 4 and 153-172 on 8; from 2 MiB 8 channels ran as fast as 4 or faster.
const NET_MID_CHANNELS: usize = 4;

/// Bytes of a call each channel past [`NET_MID_CHANNELS`] needs across nodes.
const NET_BYTES_PER_CHANNEL: usize = 256 << 10;

/// LL busbw (GB/s) a call reaches across nodes, whatever its channels: on one H100 as 2 nodes
/// over the socket network a two-rank AllReduce on LL moved 16 KiB in 12.8 us beyond its
/// latency on one channel, and 64-256 KiB at 0.7-0.9 GB/s on 2 to 8 (each LL step waits for
/// the proxies before its slot turns); results/h100-nodes2-tuner-exchange.txt.
const LL_NET_BW: f64 = 1.25;

/// A step across the network (µs) by protocol (LL, LL128, Simple), beyond the network's own
/// `latency` property: the sending kernel's publish, both proxies' passes and system calls,
/// the receiving kernel's look. LL's receiver polls its lines; the others wait for the
/// proxy's tail, one more round trip. Fitted to one H100 as 2 nodes over sockets, mean times
/// of forced choices at 16 B-1 KiB (results/h100-nodes2-tuner-exchange.txt): Ring/LL with the
/// exchange (one network step) 19.7 us, Tree/Simple with the exchange (one) 27.9, Ring/Simple
/// (two in a row) 41.5.
const NET_HOP_US: [f64; NUM_PROTOS] = [5.5, 13.6, 13.6];
/// What a call across nodes pays besides its steps, whatever the algorithm and protocol (the
/// launch, the proxies' first passes), in the same fit. It replaces the protocol bases.
const NET_BASE_US: f64 = 14.0;
/// What an LL tree across nodes pays beyond the ring's calls of as many network steps: the
/// same runs measured the two-node tree's exchange on LL at 24.7 us against the ring's 19.7.
const TREE_NET_LL_EXTRA_US: f64 = 5.0;

/// Simple (and LL128) busbw (GB/s) one channel reaches across nodes: the same lab moved a
/// 32 KiB AllReduce on one channel in about 16 us beyond its latency (Ring/Simple 61-64 us
/// against 42-46 at 8 bytes).
const NET_CHANNEL_BW: f64 = 2.0;

/// Tree throughput as a share of the ring's (one node's chain; measured 0.47 on 4×H200).
const TREE_INTRA_EFF: f64 = 0.47;
/// Tree throughput over the network as a share of the NICs' (up and down overlap).
const TREE_INTER_EFF: f64 = 0.9;
/// The same with one rank per node (2 x 1: the two ranks trade whole buffers at the top): on
/// one H200 as 2 nodes over sockets a forced Tree/Simple took 55-60 us more per MiB than
/// Ring/Simple from 1 to 4 MiB (sessions 13 and 15), about 0.66 of the ring's rate. Measured
/// on two nodes only, so used only where the tree trades at the top.
const TREE_ONE_RANK_NET_EFF: f64 = 0.66;

/// What a ring across nodes pays (µs) for each network step of each channel past the first:
/// one proxy thread per process moves every channel's steps, so they queue behind each other
/// (a tree that trades at the top has one step per channel and showed no such cost). Fitted
/// to the same runs: a forced Ring/Simple on 2 x 1 paid about 0, 45 and 120 us over the
/// model on 2, 4 and 8 channels (128 KiB-1 MiB; 2 steps per channel), which put the measured
/// tree-to-ring crossover between 2 and 4 MiB (results/h200-nodes2-latency-tuner-idle-s15.txt,
/// h200-nodes2-tuner-refit.txt); on 2 x 2 the ring's 8-channel calls were as far behind.
const RING_NET_STEP_US: f64 = 8.0;

/// What a network step pays (µs) when its message is long enough for the network's own threads
/// to move it (the socket network hands messages of `NCCL_RS_SOCKET_INLINE_BYTES` and more to
/// its helper threads: two thread wake-ups a side). Fitted to one H200 as 2 nodes over sockets
/// (sessions 15 and 16): one channel's Tree/Simple took 26 us more from 32 to 64 KiB, where its
/// one message crosses the limit, against 5 from 16 to 32 KiB; Ring/Simple at 1 MiB (64 KiB
/// steps) ran 30 us behind the model without it.
const NET_HANDOFF_US: f64 = 20.0;

/// What each network step of a call past its first pays (µs) for the GPU's turn between
/// steps in sequence: the kernel sees the step land, adds, writes its lines and publishes them,
/// and the proxy sees that and sends. On 4 H200s as 4 nodes x 1 over sockets (session 17,
/// results/h200x4-nodes-tuner-s17.txt), an 8-byte AllReduce took 91.5 us on Ring/LL (six
/// network steps in a row), 69.5 on Tree/LL and 101 on Tree/Simple (four: up two levels, down
/// two), 44, 28 and 33 us more than the model without it: 9-11 us a step, as the proxy
/// timeline's turn at each level of the tree (8-10 us, docs/lab-notes.md). The Simple ring's
/// step cost ([`NET_HOP_US`]) was fitted on two steps in a row and holds its turn already.
const NET_TURN_US: f64 = 9.5;

/// What each level of a tree across nodes that does not exchange at the top (more than two
/// nodes, or two with NCCL_RS_TREE_EXCHANGE=0) pays (µs), up and down, when its messages reach
/// the network's hand-off length: on 4 H200s as 4 nodes x 1 one channel's
/// Tree/Simple went from 149 to 408 us between 32 and 64 KiB (results/h200x4-nodes-tuner-s17.txt,
/// call 3), about 25 of it the bytes, the rest over its four levels; from there to 2 MiB it grew
/// at the tree's rate alone (873 us at 2 MiB on 8 channels). Each level waits for whole
/// messages from its children, so their hand-offs add up instead of overlapping.
const TREE_LEVEL_HANDOFF_US: f64 = 60.0;

/// The per-communicator tuner.
pub struct Tuner {
    nranks: usize,
    nnodes: usize,
    nlocal: usize,
    nchannels: usize,
    bw_intra: f64,
    bw_inter: f64,
    /// The network's own latency, µs (added to [`NET_HOP_US`]).
    net_lat: f64,
    intra_type: PathType,
    ll128_ok: bool,
    /// NVLS is set up (the communicator's multicast object exists: the user set
    /// NCCL_NVLS_ENABLE to 1 and every rank's GPU supports multicast).
    nvls: bool,
    /// A two-rank ring AllReduce on LL exchanges in one pass (`FLAG_RING_EXCHANGE`).
    ring_exchange: bool,
    /// Network messages at least this long cost [`NET_HANDOFF_US`] (`Net::handoff_from`).
    net_handoff_from: Option<usize>,
    /// The tree across two nodes exchanges at the top (`FLAG_TREE_EXCHANGE`): one network
    /// hop, chains inside the nodes, and LL steps possible.
    tree_exchange: bool,
    /// The double binary tree's depth over the nodes (`graph::dbt_depth`), kept: the tuner
    /// runs on every call, and the depth builds both trees.
    tree_depth: usize,
    params: TuneParams,
    plugin: Option<plugin::Plugin>,
}

impl Tuner {
    /// A tuner for `graphs` on nodes like `system`; loads the tuner plugin when one is named
    /// (a plugin that fails to load is reported and skipped, as NCCL does).
    pub fn new(system: &System, graphs: &Graphs, params: &TuneParams) -> Tuner {
        let nlocal = system.gpus.len().max(1);
        let plugin = params.plugin.as_deref().and_then(|name| {
            match plugin::Plugin::load(name, graphs.nranks, graphs.nnodes) {
                Ok(p) => Some(p),
                Err(e) => {
                    log::warn!(
                        "NCCL_TUNER_PLUGIN={name}: {}; using the internal model",
                        e.message
                    );
                    None
                }
            }
        });
        // LL128 needs 128-byte store atomicity: NVLink on Volta or newer, every step.
        let ll128_ok = system.min_sm() >= 70 && graphs.all_nvlink;
        let t = Tuner {
            nranks: graphs.nranks,
            nnodes: graphs.nnodes,
            nlocal,
            nchannels: graphs.nchannels,
            bw_intra: graphs.bw_intra,
            bw_inter: graphs.bw_inter,
            net_lat: graphs.lat_inter.max(0.0),
            intra_type: graphs.intra_type,
            ll128_ok,
            nvls: false,
            ring_exchange: false,
            net_handoff_from: None,
            tree_exchange: false,
            tree_depth: crate::graph::dbt_depth(graphs.nnodes),
            params: params.clone(),
            plugin,
        };
        t.log();
        t
    }

    /// Whether two-rank ring AllReduces on LL exchange (the communicator's agreed flags).
    pub(crate) fn set_ring_exchange(&mut self, on: bool) {
        self.ring_exchange = on;
    }

    /// From which message length a network step costs the backend's hand-off (this rank's
    /// network; [`Tuner::agree`] then takes rank 0's).
    pub(crate) fn set_net_handoff_from(&mut self, from: Option<usize>) {
        self.net_handoff_from = from;
    }

    /// Whether the tree AllReduce across two nodes exchanges at the top (the communicator's
    /// agreed flags and trees); only then is the tree offered with LL.
    pub(crate) fn set_tree_exchange(&mut self, on: bool) {
        self.tree_exchange = on;
    }

    /// Offers NVLS (AllReduce, ReduceScatter, AllGather) once the communicator set it up.
    pub(crate) fn set_nvls(&mut self, on: bool) {
        self.nvls = on;
    }

    /// Whether NVLS is offered.
    pub fn nvls(&self) -> bool {
        self.nvls
    }

    /// Whether the (collective, algorithm, protocol) exists here and the filters allow it.
    pub fn enabled(&self, coll: Coll, algo: Algo, proto: Proto) -> bool {
        let supported = match algo {
            Algo::Ring => true,
            Algo::Tree => coll == Coll::AllReduce,
            // Only where the communicator made its multicast object (never unless the user
            // set NCCL_NVLS_ENABLE to 1; the shared GPU hosts keep it at 0).
            Algo::Nvls => {
                self.nvls
                    && matches!(
                        coll,
                        Coll::AllReduce | Coll::ReduceScatter | Coll::AllGather
                    )
            }
            _ => false, // CollNet, NVLS tree, PAT: not built
        };
        // LL trees: across nodes (the double binary tree, whose links all carry LL); the chain
        // inside one node has Simple FIFOs on its way up.
        let ll_tree = algo != Algo::Tree || proto != Proto::Ll || self.nnodes > 1;
        supported
            && ll_tree
            && self.params.built[algo as usize][proto as usize]
            && (proto != Proto::Ll128 || self.ll128_ok)
            && self.params.algo.allows(coll, algo as usize)
            && self.params.proto.allows(coll, proto as usize)
    }

    /// Bus bandwidth GB/s of (algo, proto) with all channels busy.
    fn bw(&self, coll: Coll, algo: Algo, proto: Proto) -> f64 {
        let ring = if self.nnodes > 1 && self.nlocal > 1 {
            self.bw_intra.min(self.bw_inter)
        } else if self.nnodes > 1 {
            // One rank per node: every ring step crosses the network.
            self.bw_inter
        } else {
            self.bw_intra
        };
        let mut bw = match algo {
            Algo::Tree => {
                // Tree algbw, turned into busbw so both compare on bus bytes.
                let n = self.nranks as f64;
                let alg = if self.nnodes > 1 && self.nlocal > 1 {
                    (self.bw_intra * TREE_INTRA_EFF).min(self.bw_inter * TREE_INTER_EFF)
                } else if self.nnodes > 1 {
                    // One rank per node: no chain inside the nodes to slow the tree.
                    self.bw_inter * self.tree_net_eff()
                } else {
                    self.bw_intra * TREE_INTRA_EFF
                };
                alg * 2.0 * (n - 1.0) / n
            }
            _ => ring,
        } * proto_eff(proto);
        if self.nnodes > 1 && proto == Proto::Ll {
            // LL over the network: half the payload per packet, and each 16 KiB step waits for
            // the proxies (send, network, receive) before its slot turns.
            bw = (bw * 0.5).min(LL_NET_BW);
        }
        if coll != Coll::AllReduce && algo == Algo::Tree {
            bw = 0.0;
        }
        bw
    }

    fn latency(&self, coll: Coll, algo: Algo, proto: Proto) -> f64 {
        let nnodes = self.nnodes as f64;
        // Hops of one pass around a ring: inside nodes, and across them.
        let intra_steps = if self.nnodes > 1 {
            (self.nranks - self.nnodes) as f64
        } else {
            self.nranks as f64
        };
        let intra = hop_lat(self.intra_type, proto);
        let net = NET_HOP_US[proto as usize] + self.net_lat;
        let base = match self.nnodes > 1 {
            true => NET_BASE_US,
            false => base_lat(algo, proto),
        };
        match algo {
            // Barriers through the switch instead of ring steps: two per piece for AllReduce,
            // one for ReduceScatter and AllGather (uncalibrated: NVLS never ran on a GPU here).
            Algo::Nvls => {
                base + match coll {
                    Coll::AllReduce => 2.0 * intra,
                    _ => intra,
                }
            }
            Algo::Tree => {
                // Up and down the chain inside a node and the double binary tree's hops
                // across nodes (about log2 of the node count); with the exchange the two
                // heads trade sums: one network hop in all.
                let net_hops = match self.tree_exchange {
                    true => 1.0,
                    false => self.tree_levels(),
                };
                let extra = match (self.nnodes > 1, proto) {
                    (true, Proto::Ll) => TREE_NET_LL_EXTRA_US,
                    _ => 0.0,
                };
                let turns = match self.nnodes > 1 {
                    true => NET_TURN_US * (net_hops - 1.0),
                    false => 0.0,
                };
                base + 2.0 * (self.nlocal as f64 - 1.0) * intra + net_hops * net + extra + turns
            }
            _ => {
                let net_steps = if self.nnodes > 1 { nnodes } else { 0.0 };
                let pass = intra_steps * intra + net_steps * net;
                let share = (self.nranks as f64 - 1.0) / self.nranks as f64;
                let exchange = self.ring_exchange && self.nranks == 2 && proto == Proto::Ll;
                let passes = match coll {
                    Coll::AllReduce if !exchange => 2.0,
                    _ => 1.0,
                };
                // Simple's step cost holds its turn (see NET_TURN_US).
                let turns = match proto {
                    Proto::Ll if net_steps > 0.0 => {
                        NET_TURN_US * (passes * net_steps * share - 1.0).max(0.0)
                    }
                    _ => 0.0,
                };
                base + passes * pass * share + turns
            }
        }
    }

    fn bus_bytes(&self, coll: Coll, algo: Algo, bytes: usize) -> f64 {
        let n = self.nranks as f64;
        let b = bytes as f64;
        match (coll, algo) {
            (Coll::AllReduce, _) => b * 2.0 * (n - 1.0) / n,
            (Coll::AllGather | Coll::ReduceScatter, _) => b * (n - 1.0) / n,
            _ => b,
        }
    }

    /// Channels worth using for `bytes` with `proto`, as the model counts them.
    fn channels_for(&self, proto: Proto, bytes: usize) -> usize {
        bytes
            .div_ceil(min_bytes_per_channel(proto))
            .clamp(1, self.nchannels.max(1))
    }

    /// Channels a call of `bytes` with `proto` runs on: the model's, except that across nodes
    /// mid-sized Simple and LL128 calls keep to [`NET_MID_CHANNELS`]. The model's estimates
    /// keep its own count, which its ring/tree fits were made with (4 x 1's choices included,
    /// where this cap is not measured).
    fn launch_channels(&self, proto: Proto, bytes: usize) -> usize {
        let n = self.channels_for(proto, bytes);
        match self.nnodes > 1 && proto != Proto::Ll {
            true => n.min(NET_MID_CHANNELS.max(bytes / NET_BYTES_PER_CHANNEL)).max(1),
            false => n,
        }
    }

    /// The model's time (µs) for one (collective, algorithm, protocol) and size, with the
    /// channels it would use; `None` when not enabled.
    pub fn estimate(&self, coll: Coll, algo: Algo, proto: Proto, bytes: usize) -> Option<f64> {
        if !self.enabled(coll, algo, proto) {
            return None;
        }
        if self.nranks == 1 {
            return Some(base_lat(algo, proto));
        }
        let nch = self.channels_for(proto, bytes);
        let all = self.bw(coll, algo, proto);
        let bw = match self.nnodes > 1 {
            // Across nodes a channel is bound by its proxies' steps, not by a share of the
            // wire: one channel alone may fill it.
            true => {
                let reach = match proto {
                    Proto::Ll => LL_NET_BW,
                    _ => NET_CHANNEL_BW * nch as f64,
                };
                reach.min(all)
            }
            false => all * nch as f64 / self.nchannels.max(1) as f64,
        };
        if bw <= 0.0 {
            return None;
        }
        let bus = self.bus_bytes(coll, algo, bytes);
        let steps = self.ring_queue(coll, algo, proto, nch)
            + self.net_handoff(coll, algo, proto, bytes, nch)
            + self.tree_fill(algo, proto, bytes, nch);
        Some(self.latency(coll, algo, proto) + steps + bus / (bw * 1e3))
    }

    /// What an LL tree across nodes pays (µs) before its first chunk is through: each level
    /// up and down passes a whole LL step on before the next level starts on it, so the first
    /// step crosses the network once per level at LL's rate, and only the rest streams. On 4
    /// H200s as 4 nodes x 1 (results/h200x4-nodes-tuner-s17.txt) Tree/LL took 32 us more at
    /// 8 KiB than at 8 B and 84 more at 32 KiB (the model's bytes alone: 10 and 39). The
    /// exchange across two nodes is one level (none of this). Simple trees pay their levels in
    /// hand-offs instead ([`TREE_LEVEL_HANDOFF_US`]): from 64 KiB a channel's tree grew at its
    /// streaming rate.
    fn tree_fill(&self, algo: Algo, proto: Proto, bytes: usize, nch: usize) -> f64 {
        if algo != Algo::Tree || proto != Proto::Ll || self.nnodes < 2 || self.tree_exchange {
            return 0.0;
        }
        let levels = self.tree_levels();
        let chunk = (bytes / nch.max(1)).min(nccl_device::abi::LL_STEP_BYTES as usize) as f64;
        (levels - 1.0) * chunk / (LL_NET_BW * 1e3)
    }

    /// What the network's hand-offs add to a call of `bytes` on `nch` channels (µs;
    /// [`NET_HANDOFF_US`]): each network step a channel takes in turn pays it when its message
    /// reaches the network's limit. A ring step carries a rank's chunk of the channel's bytes
    /// (2 (n - 1) steps in turn for an AllReduce, n - 1 otherwise); a tree step the channel's
    /// bytes, once at the top where two nodes exchange, else once per level up and down.
    /// LL steps are small and never reach it.
    fn net_handoff(&self, coll: Coll, algo: Algo, proto: Proto, bytes: usize, nch: usize) -> f64 {
        let Some(from) = self.net_handoff_from else {
            return 0.0;
        };
        if self.nnodes < 2 || proto == Proto::Ll {
            return 0.0;
        }
        let per_channel = bytes / nch.max(1);
        let (message, steps, each) = match algo {
            Algo::Tree if self.tree_exchange => (per_channel, 1.0, NET_HANDOFF_US),
            // Up the double binary tree and back down, a level at a time each way.
            Algo::Tree => (per_channel, self.tree_levels(), TREE_LEVEL_HANDOFF_US),
            Algo::Nvls => return 0.0,
            _ => match coll {
                Coll::AllReduce | Coll::AllGather | Coll::ReduceScatter => (
                    per_channel / self.nranks.max(1),
                    self.ring_net_steps(coll, proto),
                    NET_HANDOFF_US,
                ),
                _ => (per_channel, self.ring_net_steps(coll, proto), NET_HANDOFF_US),
            },
        };
        match message >= from {
            true => each * steps,
            false => 0.0,
        }
    }

    /// The double binary tree's levels across nodes, up and down: a network step each.
    fn tree_levels(&self) -> f64 {
        2.0 * self.tree_depth as f64
    }

    /// Re-derives what follows from the node count (rank 0's, on [`Tuner::agree`]).
    fn set_nnodes(&mut self, nnodes: usize) {
        self.nnodes = nnodes;
        self.tree_depth = crate::graph::dbt_depth(nnodes);
    }

    /// The share of the network a tree across nodes of one rank each reaches.
    fn tree_net_eff(&self) -> f64 {
        match self.tree_exchange {
            true => TREE_ONE_RANK_NET_EFF,
            false => TREE_INTER_EFF,
        }
    }

    /// What the ring's steps across the network wait for each other at the proxy with `nch`
    /// channels (µs; [`RING_NET_STEP_US`]): each channel past the first adds its network steps,
    /// 2 (n - 1) for an AllReduce (one with the two-rank LL exchange), n - 1 otherwise.
    fn ring_queue(&self, coll: Coll, algo: Algo, proto: Proto, nch: usize) -> f64 {
        if self.nnodes < 2 || algo != Algo::Ring || nch < 2 {
            return 0.0;
        }
        RING_NET_STEP_US * self.ring_net_steps(coll, proto) * (nch - 1) as f64
    }

    /// The ring's steps a channel takes in turn for one call: 2 (n - 1) for an AllReduce (one
    /// with the two-rank LL exchange), n - 1 otherwise.
    fn ring_net_steps(&self, coll: Coll, proto: Proto) -> f64 {
        let n = self.nranks as f64;
        let exchange = self.ring_exchange && self.nranks == 2 && proto == Proto::Ll;
        match coll {
            Coll::AllReduce if exchange => 1.0,
            Coll::AllReduce => 2.0 * (n - 1.0),
            _ => n - 1.0,
        }
    }

    fn nthreads_for(&self, proto: Proto, bytes: usize, nch: usize) -> u32 {
        if let Some(n) = self.params.nthreads {
            return n;
        }
        let per_thread = match proto {
            Proto::Ll => 8,
            Proto::Ll128 => 32,
            Proto::Simple => 64,
        };
        let per_channel = bytes / nch.max(1);
        let mut nt = self.params.max_threads.max(64);
        while nt > 128 && per_channel < nt as usize * per_thread {
            nt /= 2;
        }
        nt
    }

    /// Algorithm, protocol, channels and threads for one call of `bytes` bytes.
    pub fn choose(&self, coll: Coll, bytes: usize) -> Result<Choice> {
        self.choose_with(coll, bytes, true)
    }

    /// [`Tuner::choose`], NVLS left out unless `allow_nvls` (a type or reduction the switch
    /// cannot reduce). Where the filters left nothing but NVLS, such a call runs on the ring.
    pub fn choose_with(&self, coll: Coll, bytes: usize, allow_nvls: bool) -> Result<Choice> {
        let allows_nvls = |a: &AlgoFilter| a.allows(coll, Algo::Nvls as usize);
        match self.choose_from(coll, bytes, allow_nvls) {
            Err(_) if !allow_nvls && self.nvls && allows_nvls(&self.params.algo) => {
                let proto = Proto::Simple;
                let nchannels = self.launch_channels(proto, bytes);
                Ok(Choice {
                    algo: Algo::Ring,
                    proto,
                    nchannels,
                    nthreads: self.nthreads_for(proto, bytes, nchannels),
                    est_time_us: 0.0,
                })
            }
            r => r,
        }
    }

    /// Ok when NCCL_ALGO / NCCL_PROTO leave some algorithm and protocol for `coll`. A one-rank
    /// call runs none of them and, as NCCL's, asks no model or plugin; it still refuses filters
    /// that would refuse every other call.
    pub fn leaves_some(&self, coll: Coll) -> Result<()> {
        let any = Algo::ALL
            .into_iter()
            .any(|a| Proto::ALL.into_iter().any(|p| self.enabled(coll, a, p)));
        match any {
            true => Ok(()),
            false => Err(self.nothing_left(coll)),
        }
    }

    fn nothing_left(&self, coll: Coll) -> Error {
        Error::invalid_usage(format!(
            "no algorithm/protocol left for {} (NCCL_ALGO/NCCL_PROTO exclude all that apply{})",
            coll.as_str(),
            if self.ll128_ok {
                ""
            } else {
                "; LL128 is off here: it needs NVLink between every pair of GPUs, sm_70 or newer"
            }
        ))
    }

    fn choose_from(&self, coll: Coll, bytes: usize, allow_nvls: bool) -> Result<Choice> {
        let mut table = [[-1.0f32; NUM_PROTOS]; NUM_ALGOS];
        for a in Algo::ALL {
            for p in Proto::ALL {
                if let Some(t) = self.estimate(coll, a, p, bytes) {
                    table[a as usize][p as usize] = t as f32;
                }
            }
        }
        let mut nch_override = None;
        if let Some(pl) = &self.plugin {
            let mut nch = self.nchannels as i32;
            match pl.get_coll_info(coll, bytes, &mut table, &mut nch) {
                Ok(()) if nch as usize != self.nchannels && nch > 0 => {
                    nch_override = Some((nch as usize).min(self.nchannels.max(1)))
                }
                Ok(()) => {}
                Err(e) => log::warn!("tuner plugin: {}; using the internal model", e.message),
            }
        }
        if !allow_nvls {
            table[Algo::Nvls as usize] = [-1.0; NUM_PROTOS];
        }
        let pick = |bounded: bool| {
            let mut best: Option<(Algo, Proto, f32)> = None;
            for a in Algo::ALL {
                for p in Proto::ALL {
                    let t = table[a as usize][p as usize];
                    let fits = !bounded || bytes <= self.params.auto_max_bytes[p as usize];
                    if t >= 0.0 && fits && self.enabled(coll, a, p) && best.is_none_or(|b| t < b.2)
                    {
                        best = Some((a, p, t));
                    }
                }
            }
            best
        };
        let best = pick(true).or_else(|| pick(false));
        let Some((algo, proto, _)) = best else {
            return Err(self.nothing_left(coll));
        };
        let nchannels = nch_override.unwrap_or_else(|| self.launch_channels(proto, bytes));
        let est = self.estimate(coll, algo, proto, bytes).unwrap_or(0.0);
        Ok(Choice {
            algo,
            proto,
            nchannels,
            nthreads: self.nthreads_for(proto, bytes, nchannels),
            est_time_us: est,
        })
    }

    /// Logs the model's latency and bandwidth table at NCCL_DEBUG=INFO, as NCCL's TUNING lines.
    pub fn log(&self) {
        if !log::log_enabled!(log::Level::Info) {
            return;
        }
        log::info!(
            "Tuning: {} ranks, {} nodes, {} channels, bw intra {:.1} inter {:.1} GB/s, LL128 {}{}",
            self.nranks,
            self.nnodes,
            self.nchannels,
            self.bw_intra,
            self.bw_inter,
            match (
                self.ll128_ok,
                self.params.built.iter().any(|a| a[Proto::Ll128 as usize])
            ) {
                (false, _) => "off",
                (true, true) => "on",
                (true, false) => "possible, not built",
            },
            self.plugin
                .as_ref()
                .map(|p| format!(", tuner plugin {}", p.name))
                .unwrap_or_default()
        );
        for c in Coll::ALL {
            let mut line = format!("{:>13} ", c.as_str());
            for a in [Algo::Tree, Algo::Ring] {
                for p in Proto::ALL {
                    if self.enabled(c, a, p) {
                        line.push_str(&format!(
                            " {}/{} {:.1}us {:.1}GB/s",
                            a,
                            p,
                            self.latency(c, a, p),
                            self.bw(c, a, p)
                        ));
                    }
                }
            }
            log::info!("{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Graphs, Pattern};
    use crate::topo::synthetic;

    /// A tuner for `nnodes` nodes of `nlocal` NVSwitch GPUs joined by a 10 Gb/s network of
    /// `lat_us` latency, 8 channels, the kernels the communicators build.
    fn across_nodes(nnodes: usize, nlocal: usize, lat_us: f64) -> Tuner {
        across(nnodes, nlocal, lat_us, 1.25)
    }

    /// [`across_nodes`] with a network of `gbs` GB/s.
    fn across(nnodes: usize, nlocal: usize, lat_us: f64, gbs: f64) -> Tuner {
        let system = System::from_xml_node(synthetic::nvswitch_node(nlocal, 90)).unwrap();
        let nranks = nnodes * nlocal;
        let graphs = Graphs {
            nranks,
            nnodes,
            nchannels: 8,
            patterns: vec![Pattern {
                gpus: (0..nlocal).collect(),
                net_in: Some(0),
                net_out: Some(0),
            }],
            rings: vec![(0..nranks).collect(); 8],
            trees: Vec::new(),
            speed: gbs,
            // A node of one GPU: its search finds no link inside it, and what it reports must
            // not bound the tree (which has no chain there).
            bw_intra: if nlocal == 1 { 5.0 } else { 160.0 },
            bw_inter: gbs,
            lat_inter: lat_us,
            intra_type: PathType::Nvl,
            net_type: PathType::Net,
            all_nvlink: true,
        };
        let mut built = [[false; NUM_PROTOS]; NUM_ALGOS];
        for (a, p) in [
            (Algo::Ring, Proto::Simple),
            (Algo::Ring, Proto::Ll),
            (Algo::Tree, Proto::Simple),
            (Algo::Tree, Proto::Ll),
        ] {
            built[a as usize][p as usize] = true;
        }
        let params = TuneParams {
            built,
            ..TuneParams::default()
        };
        Tuner::new(&system, &graphs, &params)
    }

    /// Asserts the tuner's AllReduce choice (algorithm, protocol) at each size.
    fn assert_allreduce_choices(t: &Tuner, what: &str, expected: &[(usize, Algo, Proto)]) {
        for &(bytes, algo, proto) in expected {
            let c = t.choose(Coll::AllReduce, bytes).unwrap();
            assert_eq!((c.algo, c.proto), (algo, proto), "{what}, {bytes} B");
        }
    }

    #[test]
    fn mid_sized_calls_across_nodes_keep_to_four_channels() {
        let t = across_nodes(2, 1, 25.0);
        // Simple: 64 KiB a channel up to 4, then 256 KiB a channel (measured on one H200).
        for (bytes, expected) in [(128 << 10, 2), (512 << 10, 4), (1 << 20, 4), (2 << 20, 8)] {
            assert_eq!(t.launch_channels(Proto::Simple, bytes), expected, "{bytes} B");
        }
        // The model keeps counting 8 (its ring/tree fits were made so).
        assert_eq!(t.channels_for(Proto::Simple, 512 << 10), 8);
        let rs = t.choose(Coll::ReduceScatter, 512 << 10).unwrap();
        assert_eq!((rs.proto, rs.nchannels), (Proto::Simple, 4));
        // LL keeps its own rule; inside one node nothing changes.
        assert_eq!(t.launch_channels(Proto::Ll, 128 << 10), 8);
        let one_node = across_nodes(1, 8, 25.0);
        assert_eq!(one_node.launch_channels(Proto::Simple, 512 << 10), 8);
    }

    #[test]
    fn calls_across_nodes_follow_the_measured_choices() {
        // 2 x 1 over loopback (10 GB/s) with both exchanges, as the communicators set them:
        // the best forced choice of results/h100-nodes2-tuner-exchange.txt at each size (mean
        // of 3 rounds): Ring/LL to 16 KiB (19.7-32.5 us), Tree/Simple at 256 KiB and 1 MiB (105
        // and 200 us against the ring's 167 and 306), Ring/Simple from 4 MiB (557 us against 647).
        // One H200 (results/h200-nodes2-latency-tuner-idle-s15.txt, medians of 6): Tree/Simple
        // at 32 KiB and from 128 KiB to 2 MiB (44, 86, 115, 175, 210, 347 us; the ring 55, 98,
        // 166, 318, 291, 377), Ring/Simple at 4 MiB (563 against 678); and 16 and 64 MiB on the
        // ring (h200-nodes2-tuner-refit.txt: 1.45 and 5.2 ms against the tree's 1.75 and 6.6).
        // At 64 KiB one channel's ring beat the tree by 4-7% (68 against 73 us, then 66 against
        // 70): the tree's one 64 KiB message goes through the socket network's helper threads,
        // the ring's two of 32 KiB inline (the hand-off, `NET_HANDOFF_US`).
        let mut t = across(2, 1, 0.0, 10.0);
        t.set_ring_exchange(true);
        t.set_tree_exchange(true);
        t.set_net_handoff_from(Some(64 << 10));
        let measured = [
            (16, Algo::Ring, Proto::Ll),
            (4096, Algo::Ring, Proto::Ll),
            (16 << 10, Algo::Ring, Proto::Ll),
            (32 << 10, Algo::Tree, Proto::Simple),
            (64 << 10, Algo::Ring, Proto::Simple),
            (128 << 10, Algo::Tree, Proto::Simple),
            (256 << 10, Algo::Tree, Proto::Simple),
            (512 << 10, Algo::Tree, Proto::Simple),
            (1 << 20, Algo::Tree, Proto::Simple),
            (2 << 20, Algo::Tree, Proto::Simple),
            (4 << 20, Algo::Ring, Proto::Simple),
            (16 << 20, Algo::Ring, Proto::Simple),
            (64 << 20, Algo::Ring, Proto::Simple),
        ];
        assert_allreduce_choices(&t, "2x1", &measured);
        // 2 x 2, same runs: the tree's exchange on LL to 4 KiB (32-40 us; Ring/LL 50-60,
        // Tree/Simple 42-45), Tree/Simple at 256 KiB (95-105 us; Tree/LL 162-170).
        let mut t = across(2, 2, 0.0, 10.0);
        t.set_tree_exchange(true);
        t.set_net_handoff_from(Some(64 << 10));
        for (bytes, proto) in [(8, Proto::Ll), (4096, Proto::Ll), (256 << 10, Proto::Simple)] {
            let c = t.choose(Coll::AllReduce, bytes).unwrap();
            assert_eq!((c.algo, c.proto), (Algo::Tree, proto), "2x2, {bytes} B");
        }
        // The network's own latency is paid on each of its steps: three of the ring's in 2 x 2,
        // two of NCCL's tree (up to the root and back down), one of the exchange.
        let (slow, fast) = (across_nodes(2, 2, 50.0), across_nodes(2, 2, 0.0));
        let ring = |t: &Tuner| t.estimate(Coll::AllReduce, Algo::Ring, Proto::Ll, 8).unwrap();
        let tree = |t: &Tuner| t.estimate(Coll::AllReduce, Algo::Tree, Proto::Simple, 8).unwrap();
        assert!((ring(&slow) - ring(&fast) - 150.0).abs() < 1e-6);
        assert!((tree(&slow) - tree(&fast) - 100.0).abs() < 1e-6);
        // 2 x 1 with the two-rank ring exchange: Ring/LL crosses the network once, and no
        // GPU turns between two steps.
        let mut t = across_nodes(2, 1, 0.0);
        let before = t.estimate(Coll::AllReduce, Algo::Ring, Proto::Ll, 8).unwrap();
        t.set_ring_exchange(true);
        let after = t.estimate(Coll::AllReduce, Algo::Ring, Proto::Ll, 8).unwrap();
        let saved = NET_HOP_US[Proto::Ll as usize] + NET_TURN_US;
        assert!((before - after - saved).abs() < 1e-6);
    }

    #[test]
    fn calls_across_four_nodes_follow_the_measured_choices() {
        // 4 x 1 on 4 H200s over loopback (its 20 GB/s shared by the 4 nodes), as the
        // communicator sets it (no exchange past two nodes): the best forced choice of
        // results/h200x4-nodes-tuner-s17.txt at each size (medians of 4): Tree/LL to 8 KiB
        // (69.5 us at 8 B against Ring/LL's 91.5; 101.5 at 8 KiB against 104), Ring/Simple at
        // 32 and 128 KiB (137 and 224 us; Tree/Simple 151 and 396, Tree/LL 154 and 478),
        // Tree/Simple from 512 KiB (747 us against the ring's 835; 1178 against 1616 at 2 MiB;
        // 9251 against 10821 at 32 MiB); in the next call also Ring/Simple at 64 and 256 KiB
        // (169 and 424 us; Tree/Simple 408 and 460) and Tree/Simple at 1 MiB (748 against
        // 1163). Without the turns, the levels' hand-offs and LL fill, and the shared loopback
        // the model took the tree at every size.
        let mut t = across(4, 1, 0.0, 5.0);
        t.set_net_handoff_from(Some(64 << 10));
        let measured = [
            (8, Algo::Tree, Proto::Ll),
            (2048, Algo::Tree, Proto::Ll),
            (8 << 10, Algo::Tree, Proto::Ll),
            (32 << 10, Algo::Ring, Proto::Simple),
            (64 << 10, Algo::Ring, Proto::Simple),
            (128 << 10, Algo::Ring, Proto::Simple),
            (256 << 10, Algo::Ring, Proto::Simple),
            (512 << 10, Algo::Tree, Proto::Simple),
            (1 << 20, Algo::Tree, Proto::Simple),
            (2 << 20, Algo::Tree, Proto::Simple),
            (32 << 20, Algo::Tree, Proto::Simple),
        ];
        assert_allreduce_choices(&t, "4x1", &measured);
        // Each network step past the first waits for a GPU's turn: six in a row for Ring/LL,
        // four levels for the tree; Ring/Simple's step cost holds it already.
        let lat = |a, p| t.latency(Coll::AllReduce, a, p);
        let hop = |p: Proto| NET_HOP_US[p as usize];
        let close = |a: f64, b: f64| (a - b).abs() < 1e-6;
        let ring_ll = NET_BASE_US + 6.0 * hop(Proto::Ll) + 5.0 * NET_TURN_US;
        assert!(close(lat(Algo::Ring, Proto::Ll), ring_ll));
        let tree_ll = NET_BASE_US + 4.0 * hop(Proto::Ll) + TREE_NET_LL_EXTRA_US + 3.0 * NET_TURN_US;
        assert!(close(lat(Algo::Tree, Proto::Ll), tree_ll));
        let ring_simple = NET_BASE_US + 6.0 * hop(Proto::Simple);
        assert!(close(lat(Algo::Ring, Proto::Simple), ring_simple));
        // LL's fill: the first step crosses each level in turn (three more levels than one);
        // Simple pays its levels in hand-offs instead.
        let fill = t.tree_fill(Algo::Tree, Proto::Ll, 8 << 10, 1);
        assert!((fill - 3.0 * (8 << 10) as f64 / (LL_NET_BW * 1e3)).abs() < 1e-6);
        assert_eq!(t.tree_fill(Algo::Tree, Proto::Simple, 64 << 10, 1), 0.0);
        let mut ex = across(2, 2, 0.0, 10.0);
        ex.set_tree_exchange(true);
        assert_eq!(ex.tree_fill(Algo::Tree, Proto::Ll, 8 << 10, 1), 0.0, "one level");
    }

    /// The ring's steps across nodes queue at the proxy: one channel pays nothing for it, each
    /// further one its network steps (2 (n - 1) for an AllReduce, one for the two-rank LL
    /// exchange, n - 1 for the others); a tree and a single node never.
    #[test]
    fn a_ring_across_nodes_pays_for_each_channel_past_the_first() {
        let mut t = across(2, 1, 0.0, 10.0);
        t.set_ring_exchange(true);
        assert_eq!(t.ring_queue(Coll::AllReduce, Algo::Ring, Proto::Simple, 1), 0.0);
        assert_eq!(t.ring_queue(Coll::AllReduce, Algo::Ring, Proto::Simple, 8), 7.0 * 2.0 * RING_NET_STEP_US);
        assert_eq!(t.ring_queue(Coll::AllReduce, Algo::Ring, Proto::Ll, 8), 7.0 * RING_NET_STEP_US);
        assert_eq!(t.ring_queue(Coll::AllReduce, Algo::Tree, Proto::Simple, 8), 0.0);
        let t = across(2, 2, 0.0, 10.0);
        assert_eq!(t.ring_queue(Coll::AllReduce, Algo::Ring, Proto::Simple, 3), 2.0 * 6.0 * RING_NET_STEP_US);
        assert_eq!(t.ring_queue(Coll::AllGather, Algo::Ring, Proto::Simple, 3), 2.0 * 3.0 * RING_NET_STEP_US);
        let one = across_nodes(1, 4, 0.0);
        assert_eq!(one.ring_queue(Coll::AllReduce, Algo::Ring, Proto::Simple, 8), 0.0);
        // It is part of the estimate: 8 channels' worth on 2 x 1 at 1 MiB, 4 at 256 KiB.
        let t = across(2, 1, 0.0, 10.0);
        for (bytes, nch) in [(1usize << 20, 8usize), (256 << 10, 4)] {
            let est = t.estimate(Coll::AllReduce, Algo::Ring, Proto::Simple, bytes).unwrap();
            let rest = t.latency(Coll::AllReduce, Algo::Ring, Proto::Simple)
                + bytes as f64 / (2.0 * nch as f64).min(9.9) / 1e3;
            let queue = 2.0 * (nch - 1) as f64 * RING_NET_STEP_US;
            assert!((est - rest - queue).abs() < 1e-6, "{bytes} B: {est} {rest} {queue}");
        }
    }

    /// A network step whose message reaches the network's hand-off length pays
    /// `NET_HANDOFF_US` for each step a channel takes in turn; below it, on LL, or on a network
    /// without hand-offs (plugins), nothing.
    #[test]
    fn network_steps_past_the_inline_limit_pay_the_handoff() {
        let mut t = across(2, 1, 0.0, 10.0);
        t.set_tree_exchange(true);
        let h = |t: &Tuner, a, p, bytes, nch| t.net_handoff(Coll::AllReduce, a, p, bytes, nch);
        assert_eq!(h(&t, Algo::Tree, Proto::Simple, 64 << 10, 1), 0.0, "no hand-off known");
        t.set_net_handoff_from(Some(64 << 10));
        // The tree's exchange: one message of the channel's bytes.
        assert_eq!(h(&t, Algo::Tree, Proto::Simple, 32 << 10, 1), 0.0);
        assert_eq!(h(&t, Algo::Tree, Proto::Simple, 64 << 10, 1), NET_HANDOFF_US);
        assert_eq!(h(&t, Algo::Tree, Proto::Simple, 256 << 10, 8), 0.0, "32 KiB a channel");
        // The two-rank ring: two steps in turn of half the channel's bytes.
        assert_eq!(h(&t, Algo::Ring, Proto::Simple, 64 << 10, 1), 0.0);
        assert_eq!(h(&t, Algo::Ring, Proto::Simple, 128 << 10, 1), 2.0 * NET_HANDOFF_US);
        assert_eq!(h(&t, Algo::Ring, Proto::Ll, 1 << 20, 1), 0.0, "LL steps are small");
        // A larger limit (NCCL_RS_SOCKET_INLINE_BYTES) moves it.
        t.set_net_handoff_from(Some(256 << 10));
        assert_eq!(h(&t, Algo::Tree, Proto::Simple, 128 << 10, 1), 0.0);
        // A tree across four nodes: two levels up and two down, a step each.
        let mut four = across_nodes(4, 1, 0.0);
        four.set_net_handoff_from(Some(64 << 10));
        assert_eq!(h(&four, Algo::Tree, Proto::Simple, 1 << 20, 1), 4.0 * TREE_LEVEL_HANDOFF_US);
        assert_eq!(h(&four, Algo::Tree, Proto::Simple, 256 << 10, 8), 0.0);
        assert!(h(&four, Algo::Ring, Proto::Simple, 1 << 20, 1) > 0.0);
        // One node: no network.
        let mut one = across_nodes(1, 4, 0.0);
        one.set_net_handoff_from(Some(64 << 10));
        assert_eq!(h(&one, Algo::Ring, Proto::Simple, 64 << 20, 1), 0.0);
    }

    #[test]
    fn a_two_node_tree_that_exchanges_crosses_the_network_once() {
        let mut t = across_nodes(2, 2, 0.0);
        // The latencies (without the exchange the first chunk's trip through the levels adds
        // its bytes' time too: `tree_fill`).
        let tree = |t: &Tuner, p: Proto| t.latency(Coll::AllReduce, Algo::Tree, p);
        // Without the exchange the tree runs LL too (one peer per step on its fans).
        let before = [tree(&t, Proto::Ll), tree(&t, Proto::Simple)];
        t.set_tree_exchange(true);
        // Up to the root and back down crossed 2 x depth network hops, with a GPU's turn
        // between each two; the heads' trade, one.
        let depth = crate::graph::dbt_depth(2) as f64;
        for (b, p) in before.into_iter().zip([Proto::Ll, Proto::Simple]) {
            let saved = (2.0 * depth - 1.0) * (NET_HOP_US[p as usize] + NET_TURN_US);
            assert!((b - tree(&t, p) - saved).abs() < 1e-6, "{p:?}");
        }
        // Inside one node the chain's way up has Simple FIFOs only: no LL tree there.
        let one = across_nodes(1, 4, 0.0);
        assert!(one.estimate(Coll::AllReduce, Algo::Tree, Proto::Ll, 8).is_none());
        // LL is offered and wins small calls (Ring/LL crosses the network three times in 2x2).
        let c = t.choose(Coll::AllReduce, 8).unwrap();
        assert_eq!((c.algo, c.proto), (Algo::Tree, Proto::Ll));
        let c = t.choose(Coll::AllReduce, 64 << 20).unwrap();
        assert_ne!(c.proto, Proto::Ll, "{c:?}");
    }

    #[test]
    fn filters_parse() {
        let f = AlgoFilter::parse("NCCL_ALGO", "ring").unwrap();
        assert!(f.allows(Coll::AllReduce, Algo::Ring as usize));
        assert!(!f.allows(Coll::AllReduce, Algo::Tree as usize));
        let f = AlgoFilter::parse("NCCL_ALGO", "^Tree").unwrap();
        assert!(f.allows(Coll::AllReduce, Algo::Ring as usize));
        assert!(!f.allows(Coll::Broadcast, Algo::Tree as usize));
        let f = AlgoFilter::parse("NCCL_ALGO", "allreduce:tree,ring;broadcast:ring").unwrap();
        assert!(f.allows(Coll::AllReduce, Algo::Tree as usize));
        assert!(!f.allows(Coll::Broadcast, Algo::Tree as usize));
        assert!(f.allows(Coll::AllGather, Algo::Tree as usize));
        let f = ProtoFilter::parse("NCCL_PROTO", "^ll128, ll").unwrap();
        assert!(f.allows(Coll::AllReduce, Proto::Simple as usize));
        assert!(!f.allows(Coll::AllReduce, Proto::Ll as usize));
        for bad in [
            "rings",
            "allreduce:",
            "alltoall:ring",
            "^",
            "ring;bcast:tree",
        ] {
            let e = AlgoFilter::parse("NCCL_ALGO", bad).unwrap_err();
            assert_eq!(e.code, crate::error::NcclResult::InvalidArgument, "{bad}");
            assert!(e.message.contains("NCCL_ALGO"));
        }
        assert!(ProtoFilter::parse("NCCL_PROTO", "LL256").is_err());
    }
}
