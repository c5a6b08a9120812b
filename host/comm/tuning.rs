//! A communicator's machine model: the topology of its node, the graph search over it, and the
//! tuner that picks protocol and channels for each call.
//!
//! Every rank builds the same tuner: the topology comes from facts every rank shares (the peer
//! records), and the NCCL_ALGO / NCCL_PROTO filters are rank 0's (carried in [`Shape`]), so all
//! ranks choose alike for the same call, which the kernels need: a rank on LL and its peer on
//! Simple would wait for each other forever.

use super::peer::PeerInfo;
use super::Shape;
use crate::cuda::Device;
use crate::error::Result;
use crate::graph::{self, Graphs};
use crate::net::Net;
use crate::topo::detect::{GpuInfo, StaticGpus};
use crate::topo::PathType;
use crate::topo::{synthetic, System};
use crate::tune::{Algo, AlgoFilter, Proto, ProtoFilter, TuneParams, Tuner, NUM_ALGOS, NUM_PROTOS};

/// (algorithm, protocol) pairs the device kernels implement.
pub const BUILT: &[(Algo, Proto)] = &[
    (Algo::Ring, Proto::Simple),
    (Algo::Ring, Proto::Ll),
    (Algo::Ring, Proto::Ll128),
    (Algo::Tree, Proto::Simple),
    // Only across nodes (the double binary tree; the chain inside one node steps Simple).
    (Algo::Tree, Proto::Ll),
    // Offered only where the communicator connected it (`Tuner::set_pat`).
    (Algo::Pat, Proto::Simple),
    // Offered only where the communicator set NVLS up (`Tuner::set_nvls`).
    (Algo::Nvls, Proto::Simple),
];

/// Largest automatic call per protocol (LL, LL128, Simple), from our kernels on 4×H200 beside
/// forced choices (`results/h200x4-allreduce-forced-{LL,Simple}.txt`, AllReduce): LL on 32
/// channels took 29.8 µs at 512 KiB against Simple's 36.7, and tied at 2 MiB (42.6 against
/// 42.0). Past 2 MiB LL has not been seen to win, whatever the model says.
/// LL128 is never chosen by itself (0): forced on 4×H200 it was within 2 µs of our LL up to
/// 8 KiB and slower than our LL or Simple from 32 KiB on (32 KiB: 25.7 µs against LL's 17.5;
/// 2 MiB: 33.5 against 29.5; 8 MiB: 83 against Simple's 68;
/// `results/h200x4-ll128-fixed-bench-allreduce-LL128.txt`). Only a filter that leaves it
/// (NCCL_PROTO=LL128) runs it.
const AUTO_MAX_BYTES: [usize; NUM_PROTOS] = [2 << 20, 0, usize::MAX];

fn built() -> [[bool; NUM_PROTOS]; NUM_ALGOS] {
    let mut b = [[false; NUM_PROTOS]; NUM_ALGOS];
    for &(a, p) in BUILT {
        b[a as usize][p as usize] = true;
    }
    b
}

/// This process's NCCL_ALGO and NCCL_PROTO as masks (errors for bad syntax).
pub fn filter_masks() -> Result<(u64, u64)> {
    let p = TuneParams::from_env()?;
    Ok((p.algo.to_mask(), p.proto.to_mask()))
}

/// An NVSwitch node of `n` GPUs like `device` (ranks 0..n: the communicator is one node).
fn nvswitch(n: usize, device: &Device) -> Result<System> {
    let (major, minor) = device.props()?.compute_capability;
    System::from_xml_node(synthetic::nvswitch_node(n.max(1), major * 10 + minor))
}

/// The node this rank is on, as a topology: the communicator's GPUs on this host.
fn local_system(rank: usize, device: &Device, peers: &[PeerInfo]) -> Result<System> {
    let me = &peers[rank];
    let local: Vec<&PeerInfo> = peers
        .iter()
        .filter(|p| p.host_hash == me.host_hash)
        .collect();
    let shared = local.iter().any(|p| {
        local
            .iter()
            .any(|q| q.rank != p.rank && q.bus_id == p.bus_id)
    });
    if device.is_sim() || shared {
        // The simulator presents an NVSwitch machine: every pair of GPUs equal. So does the
        // kernel lab (ranks sharing a GPU, NCCL_RS_SHARED_GPUS=1): a GPU reaches itself at
        // least as well as NVLink reaches another.
        return nvswitch(local.len(), device);
    }
    let (major, minor) = device.props()?.compute_capability;
    let sm = major * 10 + minor;
    // The node's own search numbers its GPUs by position among the node's ranks (the rings
    // across nodes map positions to ranks: `super::rings`).
    let gpus = local
        .iter()
        .enumerate()
        .map(|(i, p)| GpuInfo {
            dev: p.device,
            rank: i,
            busid: p.bus_id.clone(),
            sm,
        })
        .collect();
    match System::detect(&StaticGpus::new(gpus)) {
        Ok(s) if s.gpus.len() == local.len() => Ok(s),
        other => {
            let why = match other {
                Ok(s) => format!("{} of {} GPUs found", s.gpus.len(), local.len()),
                Err(e) => e.to_string(),
            };
            log::warn!(
                "topology detection failed ({why}); tuning for an NVSwitch node of {} GPUs",
                local.len()
            );
            nvswitch(local.len(), device)
        }
    }
}

/// A network device's bandwidth (GB/s) where it says none: 10 Gb/s.
const DEFAULT_NET_GBS: f64 = 1.25;
/// The loopback interface's (GB/s), for all the nodes it joins together: nodes that talk over
/// `lo` are rank processes of one machine, and their traffic shares its kernel's copies.
/// Between two rank processes on one H100 the socket network over `lo` carried 9.4-10.5 GB/s
/// busbw (AllReduce, AllGather, 64 MiB-1 GiB; results/h100-nodes2-final.txt), 8 times the
/// 10 Gb/s default sysfs leaves it; on 4 H200s as 4 nodes a ring AllReduce of 32 MiB reached
/// 4.7 GB/s busbw, the same 19 GB/s in all (results/h200x4-nodes-tuner-s17.txt).
const LOOPBACK_GBS: f64 = 20.0;

/// What the tuner knows of the network across nodes.
#[derive(Clone, Copy, Debug)]
pub struct NetModel {
    /// Nodes the communicator spans.
    pub nnodes: usize,
    /// Bandwidth (GB/s) a node's channels reach over the network: one NIC per channel, as
    /// the channels spread over the network's devices.
    pub bw_gbs: f64,
    /// The slowest device's `latency` property (µs): what a step pays on the wire, beyond
    /// the proxies' own cost.
    pub lat_us: f64,
    /// Messages at least this long cost a hand-off to the backend's threads
    /// ([`Net::handoff_from`]).
    pub handoff_from: Option<usize>,
}

impl NetModel {
    /// The model of `net` for `nnodes` nodes and `nchannels` channels.
    pub(super) fn of(net: &dyn Net, nnodes: usize, nchannels: usize) -> NetModel {
        let nics = net.ndevs().clamp(1, nchannels.max(1));
        let props: Vec<_> = (0..nics).filter_map(|d| net.properties(d).ok()).collect();
        // A device that gives no speed (0: aws-ofi-nccl's "default values for NIC properties")
        // counts as 10 Gb/s, the socket network's default: a speed of 0 would leave the tuner
        // no algorithm at all.
        let gbs = |name: &str, mbps: u32| match mbps {
            0 => DEFAULT_NET_GBS,
            // Loopback has no wire and sysfs gives it no speed: count what the socket network
            // moved there, not a NIC's default.
            crate::net::socket::DEFAULT_SPEED_MBPS if name == "lo" => {
                LOOPBACK_GBS / nnodes.max(1) as f64
            }
            m => f64::from(m) / 8000.0,
        };
        let bw_gbs = match props.is_empty() {
            true => DEFAULT_NET_GBS,
            false => props.iter().map(|p| gbs(&p.name, p.speed_mbps)).sum(),
        };
        let lat_us = props
            .iter()
            .map(|p| f64::from(p.latency_us))
            .filter(|l| l.is_finite() && *l > 0.0)
            .fold(0.0, f64::max);
        NetModel {
            nnodes,
            bw_gbs,
            lat_us,
            handoff_from: net.handoff_from(),
        }
    }
}

/// Graphs and tuner for rank `rank` on `system` (its node, from `node_system`); `shape`
/// is the agreed (rank 0's) one. The graphs come back too: their rings order the channels
/// (see `super::rings`).
pub fn build(
    rank: usize,
    device: &Device,
    system: System,
    peers: &[PeerInfo],
    shape: &Shape,
    net: Option<NetModel>,
) -> Result<(Tuner, Graphs)> {
    let local = system.gpus.len().max(1);
    let (system, graphs) = match search_in(system, shape) {
        Ok(found) => found,
        Err(e) if !device.is_sim() => {
            // Detection reads sysfs and NVML of machines we may never have seen: a failure
            // there costs tuning accuracy, not the communicator.
            log::warn!("topology search failed ({e}); tuning for an NVSwitch node");
            search_in(nvswitch(local, device)?, shape)?
        }
        Err(e) => return Err(e),
    };
    // Across nodes the communicator logs the trees it runs on (`super::tree`).
    graphs.log(rank, net.is_none());
    let params = TuneParams {
        algo: AlgoFilter::from_mask(shape.algo_mask),
        proto: ProtoFilter::from_mask(shape.proto_mask),
        nthreads: Some(shape.nthreads),
        max_threads: shape.nthreads,
        plugin: crate::env::TUNER_PLUGIN.raw(),
        built: built(),
        auto_max_bytes: AUTO_MAX_BYTES,
    };
    // The search saw this node; the tuner sees the whole communicator.
    let mut whole = graphs.clone();
    let handoff_from = net.as_ref().and_then(|n| n.handoff_from);
    if let Some(net) = net {
        whole.nnodes = net.nnodes;
        whole.nranks = peers.len();
        whole.bw_inter = net.bw_gbs;
        whole.lat_inter = net.lat_us;
        whole.net_type = PathType::Net;
        // Every ring the communicator connected crosses the network: the channels to use are
        // those, whatever the search found inside this node (one GPU: one channel, which kept
        // every collective on one socket connection).
        whole.nchannels = shape.nchannels as usize;
    }
    let mut tuner = Tuner::new(&system, &whole, &params);
    tuner.set_net_handoff_from(handoff_from);
    Ok((tuner, graphs))
}

/// [`local_system`], or on GPUs where that fails an NVSwitch node of the communicator's size
/// (detection reads sysfs and NVML of machines we may never have seen: a failure there costs
/// tuning accuracy, not the communicator).
pub(super) fn node_system(rank: usize, device: &Device, peers: &[PeerInfo]) -> Result<System> {
    match local_system(rank, device, peers) {
        Ok(s) => Ok(s),
        Err(e) if !device.is_sim() => {
            log::warn!("topology detection failed ({e}); tuning for an NVSwitch node");
            nvswitch(peers.len(), device)
        }
        Err(e) => Err(e),
    }
}

/// The graph search over `system`, one node, channels bounded by the shape.
fn search_in(system: System, shape: &Shape) -> Result<(System, Graphs)> {
    // Transports reach peers on this host only, so the communicator is one node.
    let ranks: Vec<Vec<usize>> = vec![system.gpus.iter().map(|g| g.rank).collect()];
    let mut gparams = graph::Params::from_env()?;
    // The channel bounds are rank 0's (already in the shape), never this process's own
    // NCCL_MIN/MAX_NCHANNELS: ranks that slice a buffer differently never meet.
    gparams.max_channels = shape.nchannels as usize;
    gparams.min_channels = 0;
    let graphs = graph::search_ranks(&system, &ranks, &gparams)?;
    Ok((system, graphs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::{Connecting, Handle, Listener, Properties};

    /// A network that only describes its devices.
    struct Described(Vec<Properties>);

    impl Net for Described {
        fn name(&self) -> &str {
            "Described"
        }
        fn ndevs(&self) -> usize {
            self.0.len()
        }
        fn properties(&self, dev: usize) -> Result<Properties> {
            Ok(self.0[dev].clone())
        }
        fn listen(&self, _dev: usize) -> Result<(Handle, Box<dyn Listener>)> {
            Err(crate::error::Error::internal("not a real network"))
        }
        fn connect(&self, _dev: usize, _handle: &Handle) -> Result<Box<dyn Connecting>> {
            Err(crate::error::Error::internal("not a real network"))
        }
    }

    #[test]
    fn a_device_without_a_speed_counts_as_ten_gigabits() {
        // aws-ofi-nccl over libfabric's net provider gives speed 0 ("default values for NIC
        // properties"): a zero bandwidth left AllReduce no algorithm (one H100, 2 nodes).
        let dev = |speed_mbps, latency_us| Properties {
            speed_mbps,
            latency_us,
            ..Properties::default()
        };
        let m = NetModel::of(&Described(vec![dev(0, 0.0)]), 2, 8);
        assert_eq!(m.bw_gbs, DEFAULT_NET_GBS);
        let m = NetModel::of(&Described(vec![dev(100_000, 2.5), dev(0, f32::NAN)]), 2, 8);
        assert_eq!(m.bw_gbs, 12.5 + DEFAULT_NET_GBS);
        assert_eq!(m.lat_us, 2.5);
    }
}
