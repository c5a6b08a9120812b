//! Graph search: the transport between every pair of GPUs, and the rings and trees a communicator
//! runs on, with their channel count and bandwidth.
//!
//! Entry points:
//! - [`Params::from_env`]: NCCL_P2P_LEVEL, NCCL_P2P_DISABLE, NCCL_SHM_DISABLE, NCCL_NET_GDR_LEVEL,
//!   NCCL_MIN_NCHANNELS, NCCL_MAX_NCHANNELS, NCCL_CROSS_NIC (read once, through `env`).
//! - [`transport`] / [`gdr`]: P2P, SHM or NET for a GPU pair; GPUDirect RDMA for a GPU/NET pair.
//! - [`search`]`(&system, nnodes, &params)`: every node is `system` (homogeneous nodes); global
//!   rank of node `n`'s GPU `g` (position in `system.gpus`) is `n * ngpus + g` unless
//!   [`search_ranks`] is given an explicit map. Returns [`Graphs`]: per channel one ring (all
//!   ranks, each exactly once) and one tree (channels alternate between the two trees of the
//!   double binary tree across nodes; a chain inside each node), plus the bandwidths `tune` uses.
//!
//! The intra-node search looks for channel patterns (an order of the node's GPUs, entering from
//! and leaving to a NET when there are several nodes) at a per-channel speed, taking that speed
//! from every link each step crosses, and keeps the speed that gives the most total bandwidth.
//! Nodes are chained in node order, so every ring uses the same NIC index on every node (rail
//! alignment) and the search cost does not grow with the node count.

use crate::error::{Error, Result};
use crate::topo::{PathType, Paths, System};

mod trees;

pub use trees::*;

/// Most channels a communicator uses (the device ABI's limit).
pub const MAX_CHANNELS: usize = 32;
/// Most distinct patterns the search looks for.
const MAX_PATTERNS: usize = 16;
/// Per-channel speeds tried, GB/s, fastest first.
const SPEEDS: &[f64] = &[
    48.0, 40.0, 30.0, 24.0, 20.0, 16.0, 12.0, 10.0, 8.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2, 0.6,
];
/// DFS steps allowed per pattern before giving up at that speed.
const STEP_BUDGET: usize = 20_000;

/// The parameters of the search and of the transport choice.
#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    pub p2p_disable: bool,
    /// Farthest path P2P is used over (None: PXB, NCCL's default).
    pub p2p_level: Option<PathType>,
    pub shm_disable: bool,
    /// Farthest GPU→NIC path GPUDirect RDMA is used over (None: PXB).
    pub net_gdr_level: Option<PathType>,
    pub min_channels: usize,
    pub max_channels: usize,
    /// 0: a ring enters and leaves a node through the same NIC; 1: it may use different NICs;
    /// 2 (default): same NIC unless that costs a worse path.
    pub cross_nic: u8,
}

impl Default for Params {
    fn default() -> Params {
        Params {
            p2p_disable: false,
            p2p_level: None,
            shm_disable: false,
            net_gdr_level: None,
            min_channels: 0,
            max_channels: 0,
            cross_nic: 2,
        }
    }
}

impl Params {
    /// From the parameters table (environment, then NCCL_CONF_FILE). Bad values are errors.
    pub fn from_env() -> Result<Params> {
        use crate::env::{self as e, Param};
        let env = |p: Param| p.int();
        let level = |p: Param| -> Result<Option<PathType>> {
            p.raw()
                .map(|v| PathType::parse_level(p.name, &v))
                .transpose()
        };
        let cross_nic = env(e::CROSS_NIC);
        if !(0..=2).contains(&cross_nic) {
            return Err(Error::invalid_argument(format!(
                "NCCL_CROSS_NIC={cross_nic}: use 0, 1 or 2"
            )));
        }
        Ok(Params {
            p2p_disable: env(e::P2P_DISABLE) != 0,
            p2p_level: level(e::P2P_LEVEL)?,
            shm_disable: env(e::SHM_DISABLE) != 0,
            net_gdr_level: level(e::NET_GDR_LEVEL)?,
            min_channels: env(e::MIN_NCHANNELS).max(0) as usize,
            max_channels: env(e::MAX_NCHANNELS).max(0) as usize,
            cross_nic: cross_nic as u8,
        })
    }
}

/// How two ranks talk, nearest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Transport {
    /// CUDA peer access / IPC over NVLink or PCIe.
    P2p,
    /// Through host shared memory.
    Shm,
    /// Through the network.
    Net,
}

/// The transport between local GPUs `a` and `b` (positions in `system.gpus`) of one node.
pub fn transport(paths: &Paths, a: usize, b: usize, p: &Params) -> Transport {
    transport_over(paths.gpu_gpu[a][b].ty, p)
}

/// The transport between two GPUs of one node joined by a path of type `ty`.
pub fn transport_over(ty: PathType, p: &Params) -> Transport {
    let level = p.p2p_level.unwrap_or(PathType::Pxb);
    if !p.p2p_disable && ty != PathType::Dis && ty <= level {
        Transport::P2p
    } else if !p.shm_disable {
        Transport::Shm
    } else {
        Transport::Net
    }
}

/// Whether GPU `g` uses GPUDirect RDMA with NET `n` (positions in `system.gpus`/`system.nets`).
pub fn gdr(system: &System, paths: &Paths, g: usize, n: usize, p: &Params) -> bool {
    let level = p.net_gdr_level.unwrap_or(PathType::Pxb);
    system.gpus[g].gdr && system.nets[n].gdr && paths.gpu_net[g][n].ty <= level
}

/// A rank's place in one tree.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TreeNode {
    /// The parent rank, `None` at the root.
    pub up: Option<usize>,
    /// Child ranks (at most 3: the next GPU of the chain and two nodes).
    pub down: Vec<usize>,
}

/// A rank's place in one channel's tree as its kernel runs it: the parent (None at the root)
/// and the children.
pub type Place = (Option<usize>, Vec<usize>);

/// One tree over all ranks, indexed by rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tree {
    pub root: usize,
    pub nodes: Vec<TreeNode>,
    /// Which of the double binary tree's two trees (0 or 1).
    pub which: u8,
}

/// An intra-node channel pattern: the node's GPUs (positions in `system.gpus`) in ring order,
/// and the NETs it enters by and leaves by when there are several nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pattern {
    pub gpus: Vec<usize>,
    pub net_in: Option<usize>,
    pub net_out: Option<usize>,
}

/// What the search found.
#[derive(Clone, Debug)]
pub struct Graphs {
    pub nranks: usize,
    pub nnodes: usize,
    /// Channels to launch.
    pub nchannels: usize,
    /// Distinct patterns found; channel `c` uses `patterns[c % patterns.len()]`.
    pub patterns: Vec<Pattern>,
    /// Per channel, every rank once, in ring order.
    pub rings: Vec<Vec<usize>>,
    /// Per channel, one tree.
    pub trees: Vec<Tree>,
    /// Per-channel speed of the patterns, GB/s.
    pub speed: f64,
    /// Bandwidth of one node's ring inside the node (all channels), GB/s.
    pub bw_intra: f64,
    /// Network bandwidth a node's rings use (all channels), GB/s; 0 on one node.
    pub bw_inter: f64,
    /// The network's own latency (µs, its devices' `latency` property), 0 on one node.
    pub lat_inter: f64,
    /// The worst path type between consecutive GPUs of the rings inside a node.
    pub intra_type: PathType,
    /// The worst GPU↔NET path type of the rings (`Net` … `Loc` ordering of NCCL), `Loc` on one node.
    pub net_type: PathType,
    /// Every ring step inside a node is NVLink (LL128 is safe).
    pub all_nvlink: bool,
}

impl Graphs {
    /// (prev, next) of `rank` on every channel's ring.
    pub fn ring_peers(&self, rank: usize) -> Vec<(usize, usize)> {
        self.rings
            .iter()
            .map(|r| {
                let n = r.len();
                let i = r.iter().position(|&x| x == rank).unwrap_or(0);
                (r[(i + n - 1) % n], r[(i + 1) % n])
            })
            .collect()
    }

    /// Logs rings, trees (unless `with_trees` is false: a communicator across nodes logs the
    /// trees it runs on) and channel counts for `rank` at NCCL_DEBUG=INFO, as NCCL does.
    pub fn log(&self, rank: usize, with_trees: bool) {
        if !log::log_enabled!(log::Level::Info) {
            return;
        }
        log::info!(
            "Pattern {}, crossNic -, nChannels {}, bw {:.1}/{:.1}, type {}/{}, patterns {}",
            if self.nnodes > 1 { "Ring+Tree" } else { "Ring" },
            self.nchannels,
            self.bw_intra,
            self.bw_inter,
            self.intra_type,
            self.net_type,
            self.patterns.len()
        );
        for (c, r) in self.rings.iter().enumerate() {
            if r.len() <= 64 {
                let s: Vec<String> = r.iter().map(|x| x.to_string()).collect();
                log::info!("Channel {c:02}/{:02} : {}", self.nchannels, s.join(" "));
            }
        }
        if with_trees {
            log_trees(rank, &self.trees);
        }
        for (c, (p, n)) in self.ring_peers(rank).iter().enumerate() {
            log::debug!("Ring {c:02} : {p} -> {rank} -> {n}");
        }
        log::info!(
            "{} coll channels, {} p2p channels, {} nodes, {} ranks",
            self.nchannels,
            self.nchannels,
            self.nnodes,
            self.nranks
        );
    }
}

/// GB/s one CTA (channel) moves on a GPU of compute capability `sm`: channels are added until
/// their sum covers the graph's bandwidth (4×H200: 32 channels measured best for 360 GB/s).
fn per_channel_bw(sm: u32) -> f64 {
    if sm >= 90 {
        11.25
    } else {
        12.0
    }
}

/// Rings and trees for `nnodes` nodes that all look like `system`.
pub fn search(system: &System, nnodes: usize, params: &Params) -> Result<Graphs> {
    let n = system.gpus.len();
    let map: Vec<Vec<usize>> = (0..nnodes)
        .map(|node| (0..n).map(|g| node * n + g).collect())
        .collect();
    search_ranks(system, &map, params)
}

/// Rings and trees where `ranks[node][g]` is the global rank of node `node`'s GPU `g`
/// (position in `system.gpus`). Every rank in `0..nranks` must appear exactly once.
pub fn search_ranks(system: &System, ranks: &[Vec<usize>], params: &Params) -> Result<Graphs> {
    let ngpus = system.gpus.len();
    let nnodes = ranks.len();
    if ngpus == 0 || nnodes == 0 {
        return Err(Error::invalid_argument("graph search: no GPUs"));
    }
    let nranks = nnodes * ngpus;
    let mut seen = vec![false; nranks];
    for node in ranks {
        if node.len() != ngpus {
            return Err(Error::invalid_argument(format!(
                "graph search: a node lists {} ranks for {ngpus} GPUs",
                node.len()
            )));
        }
        for &r in node {
            if r >= nranks || std::mem::replace(&mut seen[r], true) {
                return Err(Error::invalid_argument(format!(
                    "graph search: rank {r} is out of range or listed twice"
                )));
            }
        }
    }
    if nnodes > 1 && system.nets.is_empty() {
        return Err(Error::invalid_usage(
            "graph search: several nodes but no network device",
        ));
    }
    let paths = system.paths();
    let (intra_speed, intra_pats) = search_patterns(system, &paths, false, params);
    let (speed, patterns) = if nnodes > 1 {
        search_patterns(system, &paths, true, params)
    } else {
        (intra_speed, intra_pats.clone())
    };
    if patterns.is_empty() {
        return Err(Error::internal(
            "graph search: no ring through the node's GPUs",
        ));
    }
    let bw_intra = intra_speed * intra_pats.len() as f64;
    let bw_inter = if nnodes > 1 {
        speed * patterns.len() as f64
    } else {
        0.0
    };
    let total = if nnodes > 1 { bw_inter } else { bw_intra };
    let mut nch = (total / per_channel_bw(system.min_sm())).ceil() as usize;
    nch = nch
        .clamp(patterns.len().min(MAX_CHANNELS), MAX_CHANNELS)
        .max(1);
    if nch > 1 && nch % 2 == 1 {
        nch += 1;
    }
    if params.max_channels > 0 {
        nch = nch.min(params.max_channels);
    }
    if params.min_channels > 0 {
        nch = nch.max(params.min_channels);
    }
    let nch = nch.clamp(1, MAX_CHANNELS);

    let mut intra_type = PathType::Loc;
    let mut all_nvlink = true;
    for p in &patterns {
        let k = p.gpus.len();
        let steps = if nnodes > 1 { k.saturating_sub(1) } else { k };
        for i in 0..steps {
            let (a, b) = (p.gpus[i], p.gpus[(i + 1) % k]);
            if a != b {
                let t = paths.gpu_gpu[a][b].ty;
                intra_type = intra_type.max(t);
                all_nvlink &= t <= PathType::Nvb;
            }
        }
    }
    let mut net_type = PathType::Loc;
    for p in &patterns {
        if let (Some(i), Some(o)) = (p.net_in, p.net_out) {
            let first = p.gpus[0];
            let last = p.gpus[p.gpus.len() - 1];
            net_type = net_type
                .max(paths.gpu_net[first][i].ty)
                .max(paths.gpu_net[last][o].ty);
        }
    }

    let mut rings = Vec::with_capacity(nch);
    let mut trees = Vec::with_capacity(nch);
    for c in 0..nch {
        let pat = &patterns[c % patterns.len()];
        let mut ring = Vec::with_capacity(nranks);
        for node in ranks {
            ring.extend(pat.gpus.iter().map(|&g| node[g]));
        }
        rings.push(ring);
        let which = (c % 2) as u8;
        trees.push(build_tree(ranks, &pat.gpus, which));
    }
    Ok(Graphs {
        nranks,
        nnodes,
        nchannels: nch,
        patterns,
        rings,
        trees,
        speed,
        bw_intra,
        bw_inter,
        lat_inter: 0.0,
        intra_type,
        net_type: if nnodes > 1 { net_type } else { PathType::Loc },
        all_nvlink,
    })
}

/// Residual bandwidth per directed link, indexed like `system.nodes[n].links[l]`.
struct Residual(Vec<Vec<f64>>);

impl Residual {
    fn new(system: &System) -> Residual {
        Residual(
            system
                .nodes
                .iter()
                .map(|n| n.links.iter().map(|l| l.bw).collect())
                .collect(),
        )
    }
    fn fits(&self, links: &[(usize, usize)], s: f64) -> bool {
        // A path may cross a link twice (never in practice); count it.
        links.iter().all(|&(n, l)| {
            let uses = links.iter().filter(|&&x| x == (n, l)).count() as f64;
            self.0[n][l] + 1e-9 >= s * uses
        })
    }
    fn take(&mut self, links: &[(usize, usize)], s: f64) {
        for &(n, l) in links {
            self.0[n][l] -= s;
        }
    }
    fn give(&mut self, links: &[(usize, usize)], s: f64) {
        for &(n, l) in links {
            self.0[n][l] += s;
        }
    }
}

/// The best speed and its patterns: one node's ring (`inter` false) or paths from a NET through
/// every GPU to a NET (`inter` true).
fn search_patterns(
    system: &System,
    paths: &Paths,
    inter: bool,
    params: &Params,
) -> (f64, Vec<Pattern>) {
    let n = system.gpus.len();
    if n == 1 && !inter {
        return (
            per_channel_bw(system.min_sm()),
            vec![Pattern {
                gpus: vec![0],
                net_in: None,
                net_out: None,
            }],
        );
    }
    let mut best: (f64, f64, Vec<Pattern>) = (0.0, 0.0, Vec::new());
    for &s in SPEEDS {
        if s * MAX_PATTERNS as f64 <= best.0 + 1e-9 {
            break;
        }
        let mut res = Residual::new(system);
        let mut pats: Vec<Pattern> = Vec::new();
        while pats.len() < MAX_PATTERNS {
            let found = if inter {
                find_inter(system, paths, &mut res, s, pats.len(), params)
            } else {
                find_ring(paths, &mut res, s, n, pats.len())
            };
            match found {
                Some(p) => pats.push(p),
                None => break,
            }
        }
        let total = s * pats.len() as f64;
        if total > best.0 + 1e-9 {
            best = (total, s, pats);
        }
    }
    if best.2.is_empty() {
        // Nothing fits even the slowest speed (a disconnected node): rank order at a token speed.
        let gpus: Vec<usize> = (0..n).collect();
        let (net_in, net_out) = if inter && !system.nets.is_empty() {
            (Some(0), Some(0))
        } else {
            (None, None)
        };
        return (
            SPEEDS[SPEEDS.len() - 1],
            vec![Pattern {
                gpus,
                net_in,
                net_out,
            }],
        );
    }
    (best.1, best.2)
}

/// Candidate next GPUs after `cur`, best first: better path type, then the next rank up
/// (keeps rank order where everything is equal), then the rest in rising distance.
fn candidates(paths: &Paths, cur: usize, used: &[bool], n: usize) -> Vec<usize> {
    let mut c: Vec<usize> = (0..n).filter(|&g| !used[g]).collect();
    c.sort_by_key(|&g| (paths.gpu_gpu[cur][g].ty, (g + n - cur) % n));
    c
}

fn find_ring(paths: &Paths, res: &mut Residual, s: f64, n: usize, k: usize) -> Option<Pattern> {
    // Rotate the start so channels spread the ring's closing edge.
    let start = k % n;
    let mut order = vec![start];
    let mut used = vec![false; n];
    used[start] = true;
    let mut budget = STEP_BUDGET;
    if dfs_ring(paths, res, s, n, &mut order, &mut used, &mut budget) {
        // Present rings starting from GPU 0 for readability.
        let z = order.iter().position(|&g| g == 0).unwrap_or(0);
        order.rotate_left(z);
        Some(Pattern {
            gpus: order,
            net_in: None,
            net_out: None,
        })
    } else {
        None
    }
}

fn dfs_ring(
    paths: &Paths,
    res: &mut Residual,
    s: f64,
    n: usize,
    order: &mut Vec<usize>,
    used: &mut [bool],
    budget: &mut usize,
) -> bool {
    if *budget == 0 {
        return false;
    }
    *budget -= 1;
    let cur = order[order.len() - 1];
    if order.len() == n {
        let close = &paths.gpu_gpu[cur][order[0]].links;
        if res.fits(close, s) {
            res.take(close, s);
            return true;
        }
        return false;
    }
    for g in candidates(paths, cur, used, n) {
        let p = &paths.gpu_gpu[cur][g];
        if p.ty == PathType::Dis || !res.fits(&p.links, s) {
            continue;
        }
        res.take(&p.links, s);
        used[g] = true;
        order.push(g);
        if dfs_ring(paths, res, s, n, order, used, budget) {
            return true;
        }
        order.pop();
        used[g] = false;
        res.give(&p.links, s);
    }
    false
}

/// Reverse of a GPU→NET path (the NET→GPU direction): the same links taken backwards.
fn reverse_links(system: &System, links: &[(usize, usize)]) -> Vec<(usize, usize)> {
    links
        .iter()
        .rev()
        .filter_map(|&(n, l)| {
            let to = system.nodes[n].links[l].to;
            let kind = system.nodes[n].links[l].kind;
            system.nodes[to]
                .links
                .iter()
                .position(|x| x.to == n && x.kind == kind)
                .map(|i| (to, i))
        })
        .collect()
}

fn find_inter(
    system: &System,
    paths: &Paths,
    res: &mut Residual,
    s: f64,
    k: usize,
    params: &Params,
) -> Option<Pattern> {
    let n = system.gpus.len();
    let nnets = system.nets.len();
    // Closest GPUs to a NET first; among equals, rotate with the channel.
    let closest = |net: usize| -> Vec<usize> {
        let mut v: Vec<usize> = (0..n).collect();
        v.sort_by(|&a, &b| {
            let (pa, pb) = (&paths.gpu_net[a][net], &paths.gpu_net[b][net]);
            pa.ty
                .cmp(&pb.ty)
                .then(pb.bw.total_cmp(&pa.bw))
                .then(((a + n - k % n) % n).cmp(&((b + n - k % n) % n)))
        });
        v
    };
    // Try NETs starting with this channel's turn, so channels spread over the NICs.
    for t in 0..nnets {
        let net_in = (k + t) % nnets;
        let others = (1..nnets).map(|d| (net_in + d) % nnets);
        let outs: Vec<usize> = match params.cross_nic {
            0 => vec![net_in],
            1 => others.chain([net_in]).collect(),
            _ => [net_in].into_iter().chain(others).collect(),
        };
        for &first in closest(net_in).iter().take(2) {
            let pin = &paths.gpu_net[first][net_in];
            let rin = reverse_links(system, &pin.links);
            if pin.ty == PathType::Dis || !res.fits(&rin, s) {
                continue;
            }
            res.take(&rin, s);
            for &net_out in &outs {
                let lasts: Vec<usize> = if n == 1 {
                    vec![first]
                } else {
                    closest(net_out)
                        .into_iter()
                        .filter(|&g| g != first)
                        .take(2)
                        .collect()
                };
                for last in lasts {
                    let pout = &paths.gpu_net[last][net_out];
                    if pout.ty == PathType::Dis || !res.fits(&pout.links, s) {
                        continue;
                    }
                    res.take(&pout.links, s);
                    let mut order = vec![first];
                    let mut used = vec![false; n];
                    used[first] = true;
                    used[last] = true;
                    let mut budget = STEP_BUDGET;
                    if n == 1 || dfs_path(paths, res, s, &mut order, &mut used, &mut budget, last) {
                        return Some(Pattern {
                            gpus: order,
                            net_in: Some(net_in),
                            net_out: Some(net_out),
                        });
                    }
                    res.give(&pout.links, s);
                }
            }
            res.give(&rin, s);
        }
    }
    None
}

/// Extends `order` through every unused GPU and ends at `last`.
fn dfs_path(
    paths: &Paths,
    res: &mut Residual,
    s: f64,
    order: &mut Vec<usize>,
    used: &mut [bool],
    budget: &mut usize,
    last: usize,
) -> bool {
    if *budget == 0 {
        return false;
    }
    *budget -= 1;
    let n = used.len();
    let cur = order[order.len() - 1];
    if order.len() == n - 1 {
        let p = &paths.gpu_gpu[cur][last];
        if p.ty != PathType::Dis && res.fits(&p.links, s) {
            res.take(&p.links, s);
            order.push(last);
            return true;
        }
        return false;
    }
    for g in candidates(paths, cur, used, n) {
        let p = &paths.gpu_gpu[cur][g];
        if p.ty == PathType::Dis || !res.fits(&p.links, s) {
            continue;
        }
        res.take(&p.links, s);
        used[g] = true;
        order.push(g);
        if dfs_path(paths, res, s, order, used, budget, last) {
            return true;
        }
        order.pop();
        used[g] = false;
        res.give(&p.links, s);
    }
    false
}

#[cfg(test)]
mod tests;
