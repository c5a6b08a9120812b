//! A communicator across nodes: which ranks are on other nodes, and the network connections of
//! its rings (the send/recv connections are made on first use by `transport::links`).

use super::peer::PeerInfo;
use super::Shape;
use crate::bootstrap::{AbortFlag, Bootstrap};
use crate::cuda::{Device, HostFlag};
use crate::error::{Error, Result};
use crate::proxy::ProxyGroup;
use crate::transport::links::Dir;
pub(super) use crate::transport::net::plugin::{comm_id, Choice};
use crate::transport::net::setup::{self, Made, NetPath, Want};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Bootstrap tags of the ring's network handles: this base + the channel.
const TAG_NET_RING: u32 = 0x6e65_7200;

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

/// The protocols of a communicator across nodes on GPUs: Simple only. LL and LL128 steps over
/// the network pass on the simulator but hang on GPUs (one H200, 2 processes as 2 nodes, even
/// an 8-byte AllReduce: every step reached the peer's FIFO and its tail was published, yet the
/// kernels never ended; a system fence before the tail did not help), so until that is
/// understood they are not offered there. NCCL_PROTO naming only them gets Simple, with a
/// warning.
pub(super) fn simple_only(proto_mask: u64) -> u64 {
    use crate::tune::{Proto, ProtoFilter};
    let mut f = ProtoFilter::from_mask(proto_mask);
    let mut forced = false;
    for row in f.allowed.iter_mut() {
        for (i, ok) in row.iter_mut().enumerate() {
            *ok &= i == Proto::Simple as usize;
        }
        if !row[Proto::Simple as usize] {
            row[Proto::Simple as usize] = true;
            forced = true;
        }
    }
    if forced {
        log::warn!(
            "NCCL_PROTO: across nodes on GPUs only Simple runs today (LL and LL128 steps over the network hang there); using Simple"
        );
    }
    f.to_mask()
}

/// The network path of a communicator whose ranks span several nodes (None on one node), over
/// the network `choice` selects (a plugin or the socket network; NCCL_NET naming none that
/// loaded fails). Errors of its connections become the communicator's async error and raise the
/// kernels' abort flag, so collectives stuck on a dead peer end.
pub(super) fn net_path(
    rank: usize,
    peers: &[PeerInfo],
    me: &PeerInfo,
    device: &Device,
    choice: &Choice,
    async_error: &Arc<Mutex<Option<Error>>>,
    kernel_abort: &Arc<HostFlag>,
) -> Result<Option<Arc<NetPath>>> {
    let remote: Vec<bool> = peers.iter().map(|p| p.host_hash != me.host_hash).collect();
    if !remote.iter().any(|&r| r) {
        return Ok(None);
    }
    let net = crate::transport::net::plugin::select(choice).map_err(|e| e.context("network"))?;
    let (slot, flag) = (async_error.clone(), kernel_abort.clone());
    let on_error = Arc::new(move |e: Error| {
        log::warn!("rank {rank}: {e}");
        let mut s = slot.lock().unwrap_or_else(|p| p.into_inner());
        if s.is_none() {
            *s = Some(e);
        }
        flag.raise();
    });
    let timeout = Duration::from_millis(crate::env::int("NCCL_BOOTSTRAP_TIMEOUT_MS").max(1) as u64);
    Ok(Some(Arc::new(NetPath {
        remote,
        net,
        proxy: ProxyGroup::new(device.ordinal, on_error),
        timeout,
    })))
}

/// Connects every channel's ring neighbours that are on other nodes; logs each as NCCL does.
pub(super) fn ring_net(
    rank: usize,
    np: &NetPath,
    device: &Device,
    bootstrap: &Bootstrap,
    ring_peers: &[(usize, usize)],
    shape: &Shape,
    abort: &AbortFlag,
) -> Result<Vec<Made>> {
    let mut wants = Vec::new();
    for (c, &(prev, next)) in ring_peers.iter().enumerate() {
        if np.remote[next] {
            wants.push(Want {
                peer: next,
                dir: Dir::Send,
                key: c as u32,
            });
        }
        if np.remote[prev] {
            wants.push(Want {
                peer: prev,
                dir: Dir::Recv,
                key: c as u32,
            });
        }
    }
    if wants.is_empty() {
        return Ok(Vec::new());
    }
    let made = setup::connect(
        &*np.net,
        device,
        bootstrap,
        &wants,
        shape.slot_bytes as usize,
        TAG_NET_RING,
        np.timeout,
        Some(abort),
    )
    .map_err(|e| e.context("ring network connections"))?;
    let ndevs = np.net.ndevs().max(1);
    for w in &wants {
        let (from, to, what) = match w.dir {
            Dir::Send => (rank, w.peer, "send"),
            Dir::Recv => (w.peer, rank, "receive"),
        };
        log::info!(
            "Channel {:02}/0 : {from}[{}] -> {to}[{}] [{what}] via NET/{}/{}",
            w.key,
            device.ordinal,
            device.ordinal,
            np.net.name(),
            w.key as usize % ndevs
        );
    }
    Ok(made)
}

#[cfg(test)]
mod tests {
    use super::simple_only;
    use crate::tune::{Coll, Proto, ProtoFilter};

    #[test]
    fn gpus_across_nodes_run_simple_only() {
        let all = ProtoFilter::default().to_mask();
        let only_ll = ProtoFilter::parse("NCCL_PROTO", "LL")
            .expect("LL parses")
            .to_mask();
        for m in [all, only_ll] {
            let f = ProtoFilter::from_mask(simple_only(m));
            for c in Coll::ALL {
                assert!(f.allows(c, Proto::Simple as usize));
                assert!(!f.allows(c, Proto::Ll as usize));
                assert!(!f.allows(c, Proto::Ll128 as usize));
            }
        }
    }
}
