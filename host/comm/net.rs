//! A communicator across nodes: which ranks are on other nodes, its network path (the network,
//! where FIFOs live, its NICs, its hold on the proxy) and where the faults of its connections
//! go. The connections themselves are the net transport's (`transport::net`).

use super::peer::PeerInfo;
use crate::bootstrap::Bootstrap;
use crate::cuda::{Device, HostFlag};
use crate::error::{Error, Result};
use crate::net::gdr::Policy;
pub(super) use crate::net::plugin::{comm_id, Choice};
use crate::proxy::{OnError, ProxyGroup};
use crate::transport::net::NetPath;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The ranks of each node, nodes in the order of their first rank, ranks in rank order.
pub(super) fn nodes(peers: &[PeerInfo]) -> Vec<Vec<usize>> {
    let mut nodes: Vec<(u64, Vec<usize>)> = Vec::new();
    for p in peers {
        match nodes.iter_mut().find(|(h, _)| *h == p.host_hash) {
            Some((_, ranks)) => ranks.push(p.rank as usize),
            None => nodes.push((p.host_hash, vec![p.rank as usize])),
        }
    }
    nodes.into_iter().map(|(_, r)| r).collect()
}

/// The network path of a rank that reaches some ranks through the network (`remote`: those on
/// other nodes, and on its own with p2p and SHM both off; None when there are none), over
/// the network `choice` selects (a plugin or the socket network; NCCL_NET naming none that
/// loaded fails). Errors of its connections go to `on_error` ([`net_fault_sink`]).
///
/// `system` is this rank's node and `local` its GPU's position there: with the network's
/// pointer support, NCCL_NET_GDR_LEVEL and the GPU-NIC path they decide where its connections'
/// FIFOs live (`net::gdr`).
pub(super) fn net_path(
    remote: Vec<bool>,
    device: &Device,
    choice: &Choice,
    on_error: OnError,
    system: &crate::topo::System,
    local: usize,
) -> Result<Option<Arc<NetPath>>> {
    // `remote[r]`: rank r is on another node, or on ours with p2p and SHM both off.
    if !remote.iter().any(|&r| r) {
        return Ok(None);
    }
    let net = crate::net::plugin::select(choice).map_err(|e| e.context("network"))?;
    let timeout = Duration::from_millis(crate::env::BOOTSTRAP_TIMEOUT_MS.int().max(1) as u64);
    let gdr = Policy::new(&*net, system, local, device)?;
    let nics = crate::net::nics::channel_nics(&*net, system, local)?;
    Ok(Some(Arc::new(NetPath {
        remote,
        gdr,
        nics,
        net,
        proxy: ProxyGroup::new(device.ordinal, on_error),
        timeout,
    })))
}

/// Where a communicator's faults go (a peer gone, a network connection failed): the first
/// becomes its async error, and each raises the kernels' abort flag, so collectives stuck on a
/// dead peer end.
pub(super) fn fault_sink(
    rank: usize,
    async_error: &Arc<Mutex<Option<Error>>>,
    kernel_abort: &Arc<HostFlag>,
) -> FaultSink {
    let (slot, flag) = (async_error.clone(), kernel_abort.clone());
    Arc::new(move |e: Error| {
        log::warn!("rank {rank}: {e}");
        let mut s = slot.lock().unwrap_or_else(|p| p.into_inner());
        if s.is_none() {
            *s = Some(e);
        }
        flag.raise();
    })
}

/// A communicator's fault sink (see [`fault_sink`]).
pub(super) type FaultSink = Arc<dyn Fn(Error) + Send + Sync>;

/// Where the proxy's connection errors go: the fault sink, and the bootstrap, which tells every
/// other rank that the peer failed — ranks that reach it only through p2p or SHM learn of it
/// too, whatever this rank does next (an application aborts at once on an async error).
pub(super) fn net_fault_sink(sink: FaultSink, bootstrap: &Arc<Bootstrap>) -> OnError {
    let bs = Arc::downgrade(bootstrap);
    Arc::new(move |peer: usize, e: Error| {
        if let Some(b) = bs.upgrade() {
            b.peer_failed(peer, &e.message);
        }
        sink(e)
    })
}
