//! The tree AllReduce across nodes: NCCL's double binary tree over the nodes, a chain of the
//! local ranks inside each node (`graph::dbt_channels` gives the shapes), and its connections.
//!
//! Channel `c` runs on tree `c % 2`. Its CTA talks to its parent and to up to
//! [`TREE_MAX_CHILDREN`] children (the next rank of its node's chain, and two child nodes at
//! a node's head), each way, on links of its own: one set of [`Links`] per channel with one
//! connection per (peer, direction), so a channel connects only the peers it uses, through the
//! same setup as every other connection (p2p or SHM inside a node, the network and its proxy
//! across nodes). Every rank connects the channels in the same order at init, so no
//! collective waits on a handshake and the bootstrap's records pair up channel by channel.

use crate::cuda::{DevBuffer, Device};
use crate::error::{Error, Result};
use crate::graph::{Place, Transport, Tree};
use crate::transport::links::Links;
use crate::transport::net::NetPath;
use crate::transport::p2p::PeerAddr;
use crate::transport::Dir;
use nccl_device::abi::{TreeDev, FLAG_TREE_EXCHANGE, TREE_MAX_CHILDREN, TREE_REMOTE_PARENT};

/// The trees across nodes, as this rank's CTAs run them.
pub(crate) struct Dbt {
    /// A [`TreeDev`] per CTA, in device memory (`CollArgs::tree`).
    pub array: DevBuffer,
    /// CTAs (channels) the trees serve.
    pub ctas: usize,
    /// Bytes of one FIFO slot of every tree connection.
    pub slot_bytes: usize,
    /// Per channel, this rank's parent and children.
    pub places: Vec<Place>,
    /// The trees span exactly two nodes: their heads can exchange ([`TreeDev::remote`]).
    pub two_nodes: bool,
    /// Per channel, the connections.
    links: Vec<Links>,
}

impl Dbt {
    /// Channel `c`'s network connections that have op queues (the profiler's proxy events,
    /// `proxy/ops.rs`): (peer, direction, queue), to the parent and each child both ways.
    pub(crate) fn op_queues(
        &self,
        c: usize,
    ) -> Vec<(usize, Dir, std::sync::Arc<crate::proxy::ops::OpQueue>)> {
        let (Some((parent, children)), Some(links)) = (self.places.get(c), self.links.get(c))
        else {
            return Vec::new();
        };
        parent
            .iter()
            .chain(children)
            .flat_map(|&p| [(p, Dir::Send), (p, Dir::Recv)])
            .filter_map(|(p, d)| links.op_queue(p, d, 0).map(|q| (p, d, q)))
            .collect()
    }

    /// The step counter of channel `c`'s connection with `peer` in direction `dir`, as the
    /// kernels left it (0 where there is none).
    pub(crate) fn link_steps(&self, c: usize, peer: usize, dir: Dir) -> crate::error::Result<u64> {
        let Some(l) = self.links.get(c) else {
            return Ok(0);
        };
        Ok(l.steps(peer, dir)?
            .and_then(|v| v.first().copied())
            .unwrap_or(0))
    }
}

/// What a connection log line says of the path to `peer` in direction `dir` (as NCCL prints
/// it; a network connection whose FIFO the GPU Direct RDMA policy puts in GPU memory ends in
/// `/GDRDMA`, as the rings' lines do).
fn path_name(
    peer: usize,
    dir: Dir,
    addrs: &[PeerAddr],
    net: Option<&NetPath>,
    key: usize,
) -> String {
    match net {
        Some(np) if np.remote[peer] => {
            let dev = key % np.net.ndevs().max(1);
            let g = np.gdr.dev(dev);
            let on_gpu = match dir {
                Dir::Send => g.send,
                Dir::Recv => g.recv,
            };
            let gdr = if on_gpu { "/GDRDMA" } else { "" };
            format!("NET/{}/{dev}{gdr}", np.net.name())
        }
        _ => match addrs[peer].transport {
            Transport::Shm => "SHM/direct/direct".into(),
            _ if addrs[peer].same_process => "P2P/direct pointer".into(),
            _ => "P2P/IPC".into(),
        },
    }
}

/// Connects this rank's place in every channel's tree (`trees[c]` for channel `c`), each
/// channel on links from `make_links(c)`, and writes the CTAs' [`TreeDev`] array, with how
/// each parent and child is reached for zero-copy (`reach(peer)`: `DIRECT_OFF` for a peer
/// outside the node or not through p2p). Logs the trees and every connection at
/// NCCL_DEBUG=INFO.
#[allow(clippy::too_many_arguments)]
pub(crate) fn connect_dbt(
    rank: usize,
    device: &Device,
    trees: &[Tree],
    nodes: &[Vec<usize>],
    addrs: &[PeerAddr],
    net: Option<&NetPath>,
    reach: &mut dyn FnMut(usize) -> u64,
    make_links: impl Fn(usize) -> Links,
) -> Result<Dbt> {
    crate::graph::log_trees(rank, trees);
    let two_nodes = nodes.len() == 2;
    let node_of = |r: usize| nodes.iter().position(|n| n.contains(&r));
    let mut links = Vec::with_capacity(trees.len());
    let mut devs = Vec::with_capacity(trees.len());
    let mut places = Vec::with_capacity(trees.len());
    let mut slot_bytes = 0;
    for (c, t) in trees.iter().enumerate() {
        let me = t
            .nodes
            .get(rank)
            .ok_or_else(|| Error::internal(format!("tree {c} has no place for rank {rank}")))?;
        if me.down.len() > TREE_MAX_CHILDREN {
            return Err(Error::internal(format!(
                "tree {c}: rank {rank} has {} children (at most {TREE_MAX_CHILDREN})",
                me.down.len()
            )));
        }
        let l = make_links(c);
        slot_bytes = l.slot_bytes;
        let mut needs = Vec::new();
        if let Some(p) = me.up {
            needs.extend([(p, Dir::Send), (p, Dir::Recv)]);
        }
        for &d in &me.down {
            needs.extend([(d, Dir::Recv), (d, Dir::Send)]);
        }
        let started = l.start(&needs)?;
        l.finish(started)
            .map_err(|e| e.context(format!("tree connections of channel {c}")))?;
        let mut td = TreeDev {
            nchildren: me.down.len() as u32,
            ..TreeDev::default()
        };
        if let Some(p) = me.up {
            td.up_send = l.conn(p, Dir::Send, 0)?;
            td.down_recv = l.conn(p, Dir::Recv, 0)?;
            td.parent_reach = reach(p);
        }
        for (i, &d) in me.down.iter().enumerate() {
            td.up_recv[i] = l.conn(d, Dir::Recv, 0)?;
            td.down_send[i] = l.conn(d, Dir::Send, 0)?;
            td.child_reach[i] = reach(d);
        }
        if two_nodes {
            // A node's head: the peer on the other node (a chain inside each node, so at most
            // one such peer).
            let away = |r: usize| node_of(r) != node_of(rank);
            td.remote = match me.up {
                Some(p) if away(p) => TREE_REMOTE_PARENT,
                _ => me
                    .down
                    .iter()
                    .position(|&d| away(d))
                    .map_or(0, |i| i as u32 + 1),
            };
        }
        if log::log_enabled!(log::Level::Info) {
            let dev = |r: usize| match r == rank {
                true => device.ordinal,
                false => addrs[r].device,
            };
            for &(peer, dir) in &needs {
                let path = path_name(peer, dir, addrs, net, c);
                let remote = net.is_some_and(|np| np.remote[peer]);
                let (from, to, what) = match dir {
                    Dir::Send => (rank, peer, " [send]"),
                    Dir::Recv => (peer, rank, " [receive]"),
                };
                // As for the rings: both ends of a network connection, the sender of others.
                if remote || dir == Dir::Send {
                    let what = if remote { what } else { "" };
                    log::info!(
                        "Channel {c:02}/0 : {from}[{}] -> {to}[{}]{what} via {path}",
                        dev(from),
                        dev(to)
                    );
                }
            }
        }
        links.push(l);
        devs.push(td);
        places.push((me.up, me.down.clone()));
    }
    let array = device.alloc(std::mem::size_of_val(devs.as_slice()).max(1))?;
    array.write(0, super::as_bytes(&devs))?;
    log::info!("Connected all trees");
    Ok(Dbt {
        array,
        ctas: trees.len(),
        slot_bytes,
        places,
        two_nodes,
        links,
    })
}

impl Dbt {
    /// Whether AllReduces on these trees exchange at the top ([`FLAG_TREE_EXCHANGE`]): two
    /// nodes, and rank 0's shape asks for it (NCCL_RS_TREE_EXCHANGE).
    pub(crate) fn exchanges(&self, shape: &super::Shape) -> bool {
        self.two_nodes && shape.kernel_flags & FLAG_TREE_EXCHANGE != 0
    }
}
