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

/// The parent of label `i` (1..=n) in the binary tree over labels `1..=n` numbered in order
/// (NCCL's construction, without its extra root 0 on top): a label's lowest set bit gives its
/// height, so odd labels are leaves and every interior label is even; the root is the largest
/// power of two not above `n`. A label whose parent would lie past `n` hangs from the next
/// label above in its line (`i` less its lowest bit), which that missing label would have
/// hung from, so no label gets a third child.
pub fn btree_parent(n: usize, i: usize) -> Option<usize> {
    if i == 0 || i > n {
        return None;
    }
    let bit = i & i.wrapping_neg();
    let up = (i ^ bit) | (bit << 1);
    if up <= n {
        return Some(up);
    }
    let above = i ^ bit;
    (above != 0).then_some(above)
}

/// The two trees of the double binary tree over `n` nodes (NCCL's, as its paper and blog
/// describe it): the parent of every node `0..n` in tree 0 and in tree 1. Node `p` is label
/// `p + 1` of [`btree_parent`]'s tree in tree 0; tree 1 is tree 0 with its labels mirrored
/// (`n + 1 - l`, `n` even) or shifted by one (`l % n + 1`, `n` odd). Either way tree 0's
/// interior labels (even) become odd ones, the leaves of tree 0: every node is interior in at
/// most one of the two trees, so each node's links carry about the same load in both, and
/// each tree is about log2(n) deep.
pub fn double_btree(n: usize) -> [Vec<Option<usize>>; 2] {
    let t0: Vec<Option<usize>> = (1..=n).map(|l| btree_parent(n, l).map(|u| u - 1)).collect();
    // Position p of tree 0 holds node map(p) in tree 1.
    let map = |p: usize| {
        if n.is_multiple_of(2) {
            n - 1 - p
        } else {
            (p + 1) % n
        }
    };
    let mut t1 = vec![None; n];
    for p in 0..n {
        t1[map(p)] = t0[p].map(map);
    }
    [t0, t1]
}

/// Edges from the deepest node of either tree of [`double_btree`]`(n)` to its root: the
/// tree's hops across nodes, each way.
pub fn dbt_depth(n: usize) -> usize {
    double_btree(n)
        .iter()
        .map(|t| {
            (0..n)
                .map(|mut p| {
                    let mut d = 0;
                    while let Some(u) = t[p] {
                        p = u;
                        d += 1;
                        if d > n {
                            break; // not a tree: never (the unit tests check it)
                        }
                    }
                    d
                })
                .max()
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0)
}

/// A tree over ranks: each node's chain (`chains[node]`, its ranks head first; empty nodes
/// are skipped) hangs from its parent node's head in tree `which` of [`double_btree`] over
/// the nodes. A head's children are the next rank of its chain first, then the heads of its
/// child nodes. Every rank in `0..nranks` must be in exactly one chain.
pub fn tree_of_chains(chains: &[Vec<usize>], nranks: usize, which: u8) -> Tree {
    let chains: Vec<&Vec<usize>> = chains.iter().filter(|c| !c.is_empty()).collect();
    let parents = &double_btree(chains.len())[which as usize & 1];
    let mut nodes = vec![TreeNode::default(); nranks];
    let mut root = chains.first().map_or(0, |c| c[0]);
    for chain in &chains {
        for w in chain.windows(2) {
            nodes[w[1]].up = Some(w[0]);
            nodes[w[0]].down.push(w[1]);
        }
    }
    for (node, chain) in chains.iter().enumerate() {
        match parents[node] {
            Some(p) => {
                let (h, ph) = (chain[0], chains[p][0]);
                nodes[h].up = Some(ph);
                nodes[ph].down.push(h);
            }
            None => root = chain[0],
        }
    }
    Tree { root, nodes, which }
}

/// Per channel, the tree AllReduce runs on across nodes (`nodes[n]`: node n's ranks in their
/// order): channel `c` uses tree `c % 2` of the double binary tree over the nodes, so
/// successive channels split between the two trees, and each node's chain starts at its
/// `c`-th rank (as ring `c` enters the node there: `comm::rings::across_nodes`), so successive
/// channels cross the network from different GPUs.
pub fn dbt_channels(nodes: &[Vec<usize>], nchannels: usize) -> Vec<Tree> {
    let nranks = nodes.iter().map(Vec::len).sum();
    (0..nchannels)
        .map(|c| {
            let chains: Vec<Vec<usize>> = nodes
                .iter()
                .map(|node| {
                    let n = node.len().max(1);
                    (0..node.len()).map(|i| node[(i + c) % n]).collect()
                })
                .collect();
            tree_of_chains(&chains, nranks, (c % 2) as u8)
        })
        .collect()
}

/// Logs `rank`'s place in every channel's tree as NCCL does:
/// `Trees [0] 1/-1/-1->0->-1 [1] ...` (children, the rank, its parent; -1: none).
pub fn log_trees(rank: usize, trees: &[Tree]) {
    let mut line = String::new();
    for (c, t) in trees.iter().enumerate() {
        let node = &t.nodes[rank];
        let d = |i: usize| node.down.get(i).map_or(-1, |x| *x as i64);
        line.push_str(&format!(
            " [{c}] {}/{}/{}->{rank}->{}",
            d(0),
            d(1),
            d(2),
            node.up.map_or(-1, |x| x as i64)
        ));
    }
    log::info!(target: crate::debug::INIT, "Trees{line}");
}

fn build_tree(ranks: &[Vec<usize>], order: &[usize], which: u8) -> Tree {
    let nranks = ranks.len() * order.len();
    let chains: Vec<Vec<usize>> = ranks
        .iter()
        .map(|r| order.iter().map(|&g| r[g]).collect())
        .collect();
    tree_of_chains(&chains, nranks, which)
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
mod tests {
    use super::*;

    /// Parent links of one tree over `n` nodes: one root, at most two children each, and
    /// every node reaches the root (no cycle). Returns each node's child count.
    fn check_btree(t: &[Option<usize>], n: usize) -> Vec<usize> {
        assert_eq!(t.len(), n);
        let roots = t.iter().filter(|p| p.is_none()).count();
        assert_eq!(roots, usize::from(n > 0), "n={n}");
        let mut kids = vec![0; n];
        for (i, p) in t.iter().enumerate() {
            if let Some(p) = *p {
                assert!(p < n && p != i, "n={n}");
                kids[p] += 1;
            }
        }
        assert!(kids.iter().all(|&k| k <= 2), "n={n}: {kids:?}");
        for i in 0..n {
            let mut cur = i;
            let mut steps = 0;
            while let Some(p) = t[cur] {
                cur = p;
                steps += 1;
                assert!(steps <= n, "cycle at n={n}");
            }
        }
        kids
    }

    #[test]
    fn double_btree_is_two_complementary_trees() {
        for n in 1..300 {
            let [t0, t1] = double_btree(n);
            let (k0, k1) = (check_btree(&t0, n), check_btree(&t1, n));
            for p in 0..n {
                assert!(
                    k0[p] == 0 || k1[p] == 0,
                    "n={n}: node {p} is interior in both trees ({} and {} children)",
                    k0[p],
                    k1[p]
                );
            }
            // About log2(n) deep: never deeper than the chain of doublings.
            assert!(
                dbt_depth(n) <= n.ilog2() as usize,
                "n={n}: {}",
                dbt_depth(n)
            );
        }
        assert_eq!([1, 2, 3, 4, 5, 8, 9].map(dbt_depth), [0, 1, 1, 2, 2, 3, 3]);
        // Two nodes: each is the other's root.
        assert_eq!(double_btree(2), [vec![Some(1), None], vec![None, Some(0)]]);
    }

    #[test]
    fn dbt_channels_hang_chains_from_node_trees() {
        // Uneven nodes too: 3 + 1 + 2 ranks, not in rank order.
        for nodes in [
            vec![vec![0], vec![1], vec![2]],
            vec![vec![0, 1], vec![2, 3], vec![4, 5]],
            vec![vec![4, 0, 5], vec![2], vec![3, 1]],
            (0..5).map(|n| vec![n]).collect(),
        ] {
            let nranks: usize = nodes.iter().map(Vec::len).sum();
            let node_of = |r: usize| nodes.iter().position(|n| n.contains(&r)).unwrap();
            let trees = dbt_channels(&nodes, 4);
            for (c, t) in trees.iter().enumerate() {
                assert_eq!(t.which as usize, c % 2);
                assert_eq!(t.nodes.len(), nranks);
                let roots: Vec<usize> = (0..nranks).filter(|&r| t.nodes[r].up.is_none()).collect();
                assert_eq!(roots, vec![t.root], "{nodes:?} channel {c}");
                for (r, x) in t.nodes.iter().enumerate() {
                    assert!(x.down.len() <= 3, "rank {r}: {:?}", x.down);
                    for &d in &x.down {
                        assert_eq!(t.nodes[d].up, Some(r));
                    }
                    // Across nodes only between heads, and a node's head starts at its c-th rank.
                    if let Some(u) = x.up.filter(|&u| node_of(u) != node_of(r)) {
                        let (a, b) = (&nodes[node_of(r)], &nodes[node_of(u)]);
                        assert_eq!((r, u), (a[c % a.len()], b[c % b.len()]));
                    }
                    // Every rank reaches the root.
                    let (mut cur, mut steps) = (r, 0);
                    while let Some(u) = t.nodes[cur].up {
                        cur = u;
                        steps += 1;
                        assert!(steps <= nranks);
                    }
                    assert_eq!(cur, t.root);
                }
                // The node-level tree is `double_btree`'s tree `c % 2`.
                let heads: Vec<usize> = nodes.iter().map(|n| n[c % n.len()]).collect();
                let want = &double_btree(nodes.len())[c % 2];
                for (i, &h) in heads.iter().enumerate() {
                    assert_eq!(t.nodes[h].up.map(node_of), want[i], "{nodes:?} channel {c}");
                }
            }
        }
    }
}
