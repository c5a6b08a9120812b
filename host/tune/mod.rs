//! Tuning: for each call, the algorithm, protocol, channel count and thread count, from a
//! latency/bandwidth model of every (collective, algorithm, protocol), user filters (NCCL_ALGO,
//! NCCL_PROTO) and an optional tuner plugin (NCCL_TUNER_PLUGIN).
//!
//! Entry points:
//! - [`Tuner::new`]`(&system, &graphs, &TuneParams::from_env()?)` once per communicator,
//!   [`Tuner::choose`]`(coll, bytes)` per call → [`Choice`] { algo, proto, nchannels, nthreads,
//!   est_time_us }. `bytes` is the size of one rank's buffer: the send buffer of AllReduce,
//!   Broadcast and Reduce, the output of AllGather, the input of ReduceScatter (NCCL's `nBytes`).
//! - `AlgoFilter::parse` / `ProtoFilter::parse` (`filter.rs`): NCCL's syntax: `ring,tree`, `^tree`,
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
mod filter;
mod model;
pub mod plugin;

pub use filter::{AlgoFilter, ProtoFilter};
use model::*;
pub use nccl_device::abi::{Algo, Proto, NUM_ALGOS, NUM_PROTOS};

use crate::error::{Error, Result};
use crate::graph::Graphs;
use crate::topo::{PathType, System};

/// The collectives the model knows: the device ABI's, whose values are NCCL's `ncclFunc_t`.
pub use nccl_device::abi::Coll;

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
        if crate::env::PAT_ENABLE.int() == 0 {
            for row in p.algo.allowed.iter_mut() {
                row[Algo::Pat as usize] = false;
            }
        }
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
    /// CTAs PAT is connected on (one rank per node: `comm/pat.rs`); 0: not connected.
    pat_ctas: usize,
    /// Largest call PAT moves as one packed piece per CTA (`comm/pat.rs`): the only calls
    /// its model describes, and the only ones it is chosen for unless a filter leaves it alone.
    pat_packed_bytes: usize,
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
            pat_ctas: 0,
            pat_packed_bytes: 0,
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

    /// Offers PAT (AllGather, ReduceScatter) once the communicator connected it, on `ctas`
    /// channels (0: not connected), for calls up to `packed_bytes` unless a filter leaves it
    /// alone.
    pub(crate) fn set_pat(&mut self, ctas: usize, packed_bytes: usize) {
        self.pat_ctas = ctas;
        self.pat_packed_bytes = packed_bytes;
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
            Algo::Pat => self.pat_ctas > 0 && matches!(coll, Coll::AllGather | Coll::ReduceScatter),
            _ => false, // CollNet, NVLS tree: not built
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
            Algo::Pat => ring * PAT_BW_EFF,
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
            // One network message per dimension in a row (small calls pack a dimension's
            // offsets into one), each a turn of the proxies as the tree's levels.
            Algo::Pat => {
                let dims = nccl_device::abi::pat_dims(self.nranks) as f64;
                base + dims * net + (dims - 1.0).max(0.0) * NET_TURN_US
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

    /// `nch` channels, within what `algo` has: PAT runs on the CTAs it connected.
    fn algo_channels(&self, algo: Algo, nch: usize) -> usize {
        match algo {
            Algo::Pat => nch.min(self.pat_ctas).max(1),
            _ => nch,
        }
    }

    /// Channels a call of `bytes` with `proto` runs on: the model's, except that across nodes
    /// mid-sized Simple and LL128 calls keep to [`NET_MID_CHANNELS`]. The model's estimates
    /// keep its own count, which its ring/tree fits were made with (4 x 1's choices included,
    /// where this cap is not measured).
    fn launch_channels(&self, proto: Proto, bytes: usize) -> usize {
        let n = self.channels_for(proto, bytes);
        match self.nnodes > 1 && proto != Proto::Ll {
            true => n
                .min(NET_MID_CHANNELS.max(bytes / NET_BYTES_PER_CHANNEL))
                .max(1),
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
        let nch = self.algo_channels(algo, self.channels_for(proto, bytes));
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
                _ => (
                    per_channel,
                    self.ring_net_steps(coll, proto),
                    NET_HANDOFF_US,
                ),
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
        match any || self.symmetric_protos(coll) != (false, false) {
            true => Ok(()),
            false => Err(self.nothing_left(coll)),
        }
    }

    /// The forms of the symmetric path (`comm/window.rs`) NCCL_ALGO / NCCL_PROTO leave
    /// `coll`: (LL lines, loads as Simple). Only AllReduce, AllGather and ReduceScatter have it.
    pub fn symmetric_protos(&self, coll: Coll) -> (bool, bool) {
        let has = matches!(
            coll,
            Coll::AllReduce | Coll::AllGather | Coll::ReduceScatter
        );
        if !has || !self.params.algo.allows(coll, filter::SYMMETRIC) {
            return (false, false);
        }
        let proto = |p: Proto| self.params.proto.allows(coll, p as usize);
        (proto(Proto::Ll), proto(Proto::Simple))
    }

    fn nothing_left(&self, coll: Coll) -> Error {
        Error::invalid_usage(format!(
            "no algorithm/protocol left for {} (NCCL_ALGO/NCCL_PROTO exclude all that apply{}{})",
            coll.name(),
            if self.ll128_ok {
                ""
            } else {
                "; LL128 is off here: it needs NVLink between every pair of GPUs, sm_70 or newer"
            },
            match self.symmetric_protos(coll) {
                (false, false) => "",
                _ =>
                    "; the symmetric path takes only calls on ranks that registered a symmetric \
                      window, up to NCCL_RS_SYMMETRIC_MAX_BYTES per rank",
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
                    // Past its packed calls PAT runs its dimensions piece by piece, unpipelined:
                    // on the simulator as 4 nodes, 1.2-2.0x the ring's time from 32 KiB
                    // (results/sim-pat-4nodes-s38.txt).
                    let pat_fits = a != Algo::Pat || bytes <= self.pat_packed_bytes;
                    let fits =
                        !bounded || (bytes <= self.params.auto_max_bytes[p as usize] && pat_fits);
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
        let nchannels = self.algo_channels(algo, nchannels);
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
            let mut line = format!("{:>13} ", c.name());
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
mod tests;
