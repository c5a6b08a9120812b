//! The model's fitted constants: protocol efficiencies, base and per-hop latencies, and what
//! the network adds, each with the measurement it comes from.

use super::*;

/// Protocol efficiency: the share of the link bandwidth each protocol's kernels reach.
pub(super) fn proto_eff(p: Proto) -> f64 {
    match p {
        Proto::Ll => 0.42,
        Proto::Ll128 => 0.925,
        Proto::Simple => 0.99,
    }
}

/// Base latency µs per (algorithm, protocol).
pub(super) fn base_lat(a: Algo, p: Proto) -> f64 {
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
pub(super) fn hop_lat(kind: PathType, p: Proto) -> f64 {
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
pub(super) fn min_bytes_per_channel(p: Proto) -> usize {
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
pub(super) const NET_MID_CHANNELS: usize = 4;

/// Bytes of a call each channel past [`NET_MID_CHANNELS`] needs across nodes.
pub(super) const NET_BYTES_PER_CHANNEL: usize = 256 << 10;

/// LL busbw (GB/s) a call reaches across nodes, whatever its channels: on one H100 as 2 nodes
/// over the socket network a two-rank AllReduce on LL moved 16 KiB in 12.8 us beyond its
/// latency on one channel, and 64-256 KiB at 0.7-0.9 GB/s on 2 to 8 (each LL step waits for
/// the proxies before its slot turns); results/h100-nodes2-tuner-exchange.txt.
pub(super) const LL_NET_BW: f64 = 1.25;

/// A step across the network (µs) by protocol (LL, LL128, Simple), beyond the network's own
/// `latency` property: the sending kernel's publish, both proxies' passes and system calls,
/// the receiving kernel's look. LL's receiver polls its lines; the others wait for the
/// proxy's tail, one more round trip. Fitted to one H100 as 2 nodes over sockets, mean times
/// of forced choices at 16 B-1 KiB (results/h100-nodes2-tuner-exchange.txt): Ring/LL with the
/// exchange (one network step) 19.7 us, Tree/Simple with the exchange (one) 27.9, Ring/Simple
/// (two in a row) 41.5.
pub(super) const NET_HOP_US: [f64; NUM_PROTOS] = [5.5, 13.6, 13.6];
/// What a call across nodes pays besides its steps, whatever the algorithm and protocol (the
/// launch, the proxies' first passes), in the same fit. It replaces the protocol bases.
pub(super) const NET_BASE_US: f64 = 14.0;
/// What an LL tree across nodes pays beyond the ring's calls of as many network steps: the
/// same runs measured the two-node tree's exchange on LL at 24.7 us against the ring's 19.7.
pub(super) const TREE_NET_LL_EXTRA_US: f64 = 5.0;

/// Simple (and LL128) busbw (GB/s) one channel reaches across nodes: the same lab moved a
/// 32 KiB AllReduce on one channel in about 16 us beyond its latency (Ring/Simple 61-64 us
/// against 42-46 at 8 bytes).
pub(super) const NET_CHANNEL_BW: f64 = 2.0;

/// Tree throughput as a share of the ring's (one node's chain; measured 0.47 on 4×H200).
pub(super) const TREE_INTRA_EFF: f64 = 0.47;
/// Tree throughput over the network as a share of the NICs' (up and down overlap).
pub(super) const TREE_INTER_EFF: f64 = 0.9;
/// The same with one rank per node (2 x 1: the two ranks trade whole buffers at the top): on
/// one H200 as 2 nodes over sockets a forced Tree/Simple took 55-60 us more per MiB than
/// Ring/Simple from 1 to 4 MiB (sessions 13 and 15), about 0.66 of the ring's rate. Measured
/// on two nodes only, so used only where the tree trades at the top.
pub(super) const TREE_ONE_RANK_NET_EFF: f64 = 0.66;

/// What a ring across nodes pays (µs) for each network step of each channel past the first:
/// one proxy thread per process moves every channel's steps, so they queue behind each other
/// (a tree that trades at the top has one step per channel and showed no such cost). Fitted
/// to the same runs: a forced Ring/Simple on 2 x 1 paid about 0, 45 and 120 us over the
/// model on 2, 4 and 8 channels (128 KiB-1 MiB; 2 steps per channel), which put the measured
/// tree-to-ring crossover between 2 and 4 MiB (results/h200-nodes2-latency-tuner-idle-s15.txt,
/// h200-nodes2-tuner-refit.txt); on 2 x 2 the ring's 8-channel calls were as far behind.
pub(super) const RING_NET_STEP_US: f64 = 8.0;

/// What a network step pays (µs) when its message is long enough for the network's own threads
/// to move it (the socket network hands messages of `NCCL_RS_SOCKET_INLINE_BYTES` and more to
/// its helper threads: two thread wake-ups a side). Fitted to one H200 as 2 nodes over sockets
/// (sessions 15 and 16): one channel's Tree/Simple took 26 us more from 32 to 64 KiB, where its
/// one message crosses the limit, against 5 from 16 to 32 KiB; Ring/Simple at 1 MiB (64 KiB
/// steps) ran 30 us behind the model without it.
pub(super) const NET_HANDOFF_US: f64 = 20.0;

/// What each network step of a call past its first pays (µs) for the GPU's turn between
/// steps in sequence: the kernel sees the step land, adds, writes its lines and publishes them,
/// and the proxy sees that and sends. On 4 H200s as 4 nodes x 1 over sockets (session 17,
/// results/h200x4-nodes-tuner-s17.txt), an 8-byte AllReduce took 91.5 us on Ring/LL (six
/// network steps in a row), 69.5 on Tree/LL and 101 on Tree/Simple (four: up two levels, down
/// two), 44, 28 and 33 us more than the model without it: 9-11 us a step, as the proxy
/// timeline's turn at each level of the tree (8-10 us, docs/lab-notes.md). The Simple ring's
/// step cost ([`NET_HOP_US`]) was fitted on two steps in a row and holds its turn already.
pub(super) const NET_TURN_US: f64 = 9.5;

/// What each level of a tree across nodes that does not exchange at the top (more than two
/// nodes, or two with NCCL_RS_TREE_EXCHANGE=0) pays (µs), up and down, when its messages reach
/// the network's hand-off length: on 4 H200s as 4 nodes x 1 one channel's
/// Tree/Simple went from 149 to 408 us between 32 and 64 KiB (results/h200x4-nodes-tuner-s17.txt,
/// call 3), about 25 of it the bytes, the rest over its four levels; from there to 2 MiB it grew
/// at the tree's rate alone (873 us at 2 MiB on 8 channels). Each level waits for whole
/// messages from its children, so their hand-offs add up instead of overlapping.
pub(super) const TREE_LEVEL_HANDOFF_US: f64 = 60.0;

/// PAT's share of the ring's bandwidth: NCCL's model (0.75): its dimensions run one after
/// another on each piece, without the ring's pipeline. Not fitted on ours.
pub(super) const PAT_BW_EFF: f64 = 0.75;
